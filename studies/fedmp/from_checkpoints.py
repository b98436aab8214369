#!/usr/bin/env python3
"""Summarise a fedsim run folder from its per-(method, seed) checkpoints, for a run that was
stopped before it wrote results.json (docs/fedmp.md: the FedMP + augmenter rows). Only runs whose
checkpoint reached the configured number of rounds are used; the rest are listed as unfinished.

    python studies/fedmp/from_checkpoints.py RUN_DIR --out results.json

Writes {"config", "source", "methods": {name: {"seeds": {seed: per-seed metrics}, "summary"}}}
with the per-seed fields of results.json (final_accuracy, last5_mean, accuracy, bytes_up,
bytes_down) and mean / std (population, as fedsim's own table) over the finished seeds.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedsim.runner import slug  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    cfg = json.loads((args.run_dir / "config.json").read_text())
    seeds = [cfg["seed"] + i for i in range(cfg["seeds"])]
    out = {"config": cfg, "source": f"checkpoints of {args.run_dir} (the run was stopped before results.json)",
           "methods": {}, "unfinished": []}
    for m in cfg["methods"]:
        per = {}
        for s in seeds:
            ck = args.run_dir / "runs" / f"{slug(m['name'])}-seed{s}" / "checkpoint.pt"
            if not ck.is_file():
                out["unfinished"].append(f"{m['name']} seed {s}: not started")
                continue
            state = torch.load(ck, weights_only=True)
            if state["round"] != cfg["rounds"]:
                out["unfinished"].append(f"{m['name']} seed {s}: stopped after round {state['round']}")
                continue
            acc = [h["accuracy"] for h in state["history"]]
            per[str(s)] = {"final_accuracy": acc[-1], "last5_mean": float(np.mean(acc[-5:])), "accuracy": acc,
                           "bytes_up": int(sum(h["bytes_up"] for h in state["history"])),
                           "bytes_down": int(sum(h["bytes_down"] for h in state["history"]))}
        if per:
            summary = {k: {"mean": float(np.mean([v[k] for v in per.values()])),
                           "std": float(np.std([v[k] for v in per.values()]))}
                       for k in ("final_accuracy", "last5_mean", "bytes_up", "bytes_down")}
            out["methods"][m["name"]] = {"algorithm": m["algorithm"], "augmenter": m["augmenter"], "seeds": per,
                                         "summary": summary}
    args.out.write_text(json.dumps(out, indent=1))
    for name, m in out["methods"].items():
        s = m["summary"]
        print(f"{name:20s} seeds {len(m['seeds'])}  final {100 * s['final_accuracy']['mean']:.2f} ± "
              f"{100 * s['final_accuracy']['std']:.2f}  last-5 {100 * s['last5_mean']['mean']:.2f} ± "
              f"{100 * s['last5_mean']['std']:.2f}  per seed last-5 "
              + " / ".join(f"{100 * v['last5_mean']:.1f}" for v in m["seeds"].values())
              + f"  MB up {s['bytes_up']['mean'] / 1e6:.1f} down {s['bytes_down']['mean'] / 1e6:.1f}")
    for u in out["unfinished"]:
        print("unfinished:", u)


if __name__ == "__main__":
    main()
