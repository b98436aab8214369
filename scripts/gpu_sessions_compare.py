"""Two GPU sessions' kernel device times side by side: is a measurement reproducible, and did a
change between the sessions move a kernel? Rows match on (kernel, case, dtype, precision, tf32x3
scheme); within each session's files a later file wins, as in sm90_report.py --compare.

    python scripts/gpu_sessions_compare.py --a results/gpu/session-h100-2026-11-26-run1.jsonl \\
        results/gpu/session-h100-2026-11-26-run2.jsonl --b results/gpu/session-h100-2026-11-27-call1.jsonl \\
        results/gpu/session-h100-2026-11-27-call2.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics


def measured(files: list[str]) -> dict:
    out = {}
    for f in files:
        for line in open(f):
            r = json.loads(line)
            if r.get("measured_us") and r.get("kernel"):
                scheme = r.get("tf32x3_scheme", "") if r.get("precision") == "tf32x3" else ""
                out[(r["kernel"], r["case"], r["dtype"], r["precision"], scheme)] = r["measured_us"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", nargs="+", required=True, help="the first session's JSONL files")
    ap.add_argument("--b", nargs="+", required=True, help="the second session's JSONL files")
    args = ap.parse_args(argv)
    a, b = measured(args.a), measured(args.b)
    print("| kernel | case | dtype | precision | A µs | B µs | B / A |\n|---|---|---|---|---|---|---|")
    ratios = []
    for key in [k for k in a if k in b]:
        kernel, case, dtype, prec, scheme = key
        ratios.append(b[key] / a[key])
        print(f"| `{kernel}` | {case} | {dtype} | {prec}{f' ({scheme})' if scheme else ''} | "
              f"{a[key]:,.1f} | {b[key]:,.1f} | {b[key] / a[key]:.3f} |")
    if ratios:
        print(f"\n{len(ratios)} rows in both; B / A median {statistics.median(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f}; only in A: {len(set(a) - set(b))}, "
              f"only in B: {len(set(b) - set(a))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
