"""Summarise runs of the test suite (make test's command, serial or over pytest-xdist) from their
logs into one JSON: each run's result line, its wall time and CPU (from `time` or
`/usr/bin/time -f "NAME wall %e user %U sys %S"`), and its slowest tests (--durations); and, from
the JSONL files of a per-test CPU probe (a pytest plugin writing, per test, the seconds of CPU used
by the process itself and by the children it waited for), each test's CPU cost.

    python studies/test-time/summarise.py --out results/test-time/FILE.json \
        --run NAME=LOG[@COMMIT[:NOTE]] ... [--cpu-probe 'DIR/cpu-*.jsonl'@COMMIT]
"""
from __future__ import annotations

import argparse
import glob
import json
import re
from pathlib import Path

RESULT = re.compile(r"(\d+) passed(?:, (\d+) skipped)?(?:, (\d+) deselected)?.* in ([\d.]+)s")
BASH_TIME = re.compile(r"^(real|user|sys)\s+(\d+)m([\d.]+)s$", re.M)
GNU_TIME = re.compile(r"^(\S+) wall ([\d.]+) user ([\d.]+) sys ([\d.]+)$", re.M)
DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$", re.M)


def mmss(seconds: float) -> str:
    seconds = int(seconds)  # as pytest prints it: whole seconds, truncated
    return f"{seconds // 60}:{seconds % 60:02d}"


def run_summary(text: str, name: str) -> dict:
    """One run's figures, from the part of ``text`` that belongs to ``name`` (a log may hold two
    runs, each ending in a /usr/bin/time line named after it)."""
    gnu = {m.group(1): m for m in GNU_TIME.finditer(text)}
    if name in gnu:  # the run's own part: from the end of the previous run to its time line
        end = gnu[name].end()
        start = max((m.end() for m in gnu.values() if m.end() < end), default=0)
        text = text[start:end]
    results = RESULT.findall(text)
    if not results:
        raise SystemExit(f"{name}: no pytest result line")
    passed, skipped, deselected, seconds = results[-1]
    out = {"passed": int(passed), "skipped": int(skipped or 0), "deselected": int(deselected or 0),
           "pytest_seconds": float(seconds)}
    if name in gnu:
        m = gnu[name]
        out.update(wall_s=float(m.group(2)), user_s=float(m.group(3)), sys_s=float(m.group(4)))
    else:
        t = {k: 60 * int(mi) + float(s) for k, mi, s in BASH_TIME.findall(text)}
        if t:
            out.update(wall_s=t["real"], user_s=t["user"], sys_s=t["sys"])
    out["pytest_mmss"] = mmss(out["pytest_seconds"])
    if "wall_s" in out:
        out["wall_mmss"] = mmss(out["wall_s"])
    if "user_s" in out:
        out["cpu_s"] = round(out["user_s"] + out["sys_s"], 1)
        # the least wall time this much CPU can take on 2 cores: perfect packing, nothing else
        out["two_core_floor_mmss"] = mmss(out["cpu_s"] / 2)
    out["slowest"] = [{"seconds": float(s), "phase": ph, "test": t} for s, ph, t in DURATION.findall(text)][:10]
    return out


def cpu_probe(pattern: str) -> dict:
    recs = [json.loads(line) for f in sorted(glob.glob(pattern)) for line in open(f)]
    per_file: dict[str, float] = {}
    for r in recs:
        f = r["id"].split("::")[0]
        per_file[f] = per_file.get(f, 0.0) + r["self"] + r["children"]
    top = sorted(recs, key=lambda r: -(r["self"] + r["children"]))[:15]
    return {"tests": len(recs), "cpu_s": round(sum(r["self"] + r["children"] for r in recs), 1),
            "per_file_top": {f: round(c, 1) for f, c in sorted(per_file.items(), key=lambda kv: -kv[1])[:15]},
            "per_test_top": [{"test": r["id"], "cpu_s": round(r["self"] + r["children"], 1),
                              "wall_s": round(r["wall"], 1)} for r in top]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--run", action="append", default=[], help="NAME=LOG[@COMMIT[:NOTE]]")
    ap.add_argument("--cpu-probe", help="'GLOB'@COMMIT")
    ap.add_argument("--machine", default="AMD EPYC, 2 cores (the shared VM), torch 2.14.1+cu130, Python 3.11.7")
    args = ap.parse_args()
    runs = {}
    for spec in args.run:
        name, rest = spec.split("=", 1)
        log, _, tail = rest.partition("@")
        commit, _, note = tail.partition(":")
        runs[name] = {"log": Path(log).name, "commit": commit, "note": note,
                      **run_summary(Path(log).read_text(errors="replace"), name)}
    out = {"machine": args.machine, "runs": runs}
    if args.cpu_probe:
        pattern, _, commit = args.cpu_probe.partition("@")
        out["cpu_probe"] = {"commit": commit, **cpu_probe(pattern)}
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
