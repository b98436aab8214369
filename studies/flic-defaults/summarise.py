"""Summarise grid.py's JSON lines: per (step, value) the mean and range of FLIC - Local on the
validation rows (points), and the matched-compute control. Writes one JSON file.

usage: python studies/flic-defaults/summarise.py GRID.jsonl OUT.json
"""
import json
import sys

import numpy as np


def main(argv):
    src, out = argv
    rows, seen = {}, set()
    control = []
    for line in open(src):
        r = json.loads(line)
        cell = (r["toy"], r["clients"], r["seed"])
        if r["step"] == "control":
            control.append(100 * (r["flic_val"] - r["local_more_val"]))
            epochs, chosen = r["local_epochs"], r["params"]
            continue
        value = r["params"][r["step"]]
        key = (r["step"], json.dumps(value), json.dumps(r["params"], sort_keys=True), cell)
        if key in seen:
            continue
        seen.add(key)
        rows.setdefault((r["step"], json.dumps(value), json.dumps(r["params"], sort_keys=True)), []).append(
            100 * (r["flic_val"] - r["local_val"]))
    steps = [{"setting": s, "value": json.loads(v), "with": json.loads(p), "cells": len(g),
              "gain_mean": round(float(np.mean(g)), 2), "gain_min": round(float(np.min(g)), 2),
              "gain_max": round(float(np.max(g)), 2)} for (s, v, p), g in rows.items()]
    summary = {"steps": steps, "chosen": chosen,
               "control": {"local_epochs": epochs, "cells": len(control), "gain_mean": round(float(np.mean(control)), 2),
                           "gain_min": round(float(np.min(control)), 2), "gain_max": round(float(np.max(control)), 2)}}
    json.dump(summary, open(out, "w"), indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
