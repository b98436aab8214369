"""The ``fedsim`` command."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _demo(args) -> int:
    import torch

    import geomkern as gk

    from .demo import format_table, run_demo

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"geomkern {gk.__version__}, torch {torch.__version__}, backends {gk.available_backends()}, "
          f"{torch.get_num_threads()} threads")
    print(f"S-curve in D={args.dim}: {args.n} points, {args.clusters} patches, d={args.components}, "
          f"S={args.basis}, {args.dtype}")
    rows = run_demo(n=args.n, dim=args.dim, clusters=args.clusters, components=args.components,
                    basis=args.basis, holdout=args.holdout, steps=args.steps, dtype=args.dtype,
                    seed=args.seed)
    print(format_table(rows))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=2))
        print(f"wrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedsim", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="geometry demo: the FedMC client pipeline on an S-curve, per backend")
    d.add_argument("--n", type=int, default=6000, help="training points (default 6000)")
    d.add_argument("--dim", type=int, default=64, help="ambient dimension D (default 64)")
    d.add_argument("--clusters", type=int, default=8, help="K-Means patches (default 8)")
    d.add_argument("--components", type=int, default=4, help="kernel PCs per patch (default 4)")
    d.add_argument("--basis", type=int, default=128, help="basis points S (default 128)")
    d.add_argument("--holdout", type=int, default=500, help="points recovered by pre-image (default 500)")
    d.add_argument("--steps", type=int, default=100, help="pre-image iterations (default 100)")
    d.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    d.add_argument("--out", default="", help="also write the rows as JSON to this file")
    d.set_defaults(func=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("n", "dim", "clusters", "components", "basis", "holdout"):
        if getattr(args, name, 1) < 1:
            print(f"fedsim: --{name} must be >= 1", file=sys.stderr)
            return 2
    try:
        return args.func(args)
    except (ValueError, TypeError, RuntimeError) as exc:
        print(f"fedsim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
