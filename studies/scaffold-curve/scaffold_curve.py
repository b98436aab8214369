"""SCAFFOLD before/after correction="step": test accuracy per round on the embedded data.

"before" is SCAFFOLD as it was until session 5 (correction="momentum": c - c_i added to the
gradient, so torch's SGD puts it through the momentum); "after" is correction="step", the default
now (the paper's plain step lr (c - c_i) beside the optimiser; fedsim/algorithms/scaffold.py). Both are
``fedsim run --set scaffold.correction=...`` choices; this script runs them on one partition and
seed and plots them side by side.

    OMP_NUM_THREADS=1 .venv/bin/python studies/scaffold-curve/scaffold_curve.py --model mlp --lr 1.0 \\
        --augmenters none,ggeur --rounds 30

writes results/scaffold/scaffold-before-after.json (per-round accuracy and training loss of
both, the settings and the command) and docs/scaffold-before-after.png; ``--replot`` redraws the
PNG from an existing JSON without running anything.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fedsim._io import atomic_write  # noqa: E402
from fedsim.algorithms.scaffold import Scaffold  # noqa: E402
from fedsim.client import DivergedError  # noqa: E402
from fedsim.runner import MethodSpec, RunConfig, run, validate  # noqa: E402


VARIANTS = {"before": "momentum", "after": "step"}  # SCAFFOLD's correction hyper-parameter


def one_run(args, augmenter: str, variant: str, work: Path) -> dict:
    spec = MethodSpec(f"{variant}-{augmenter}", algorithm="scaffold", augmenter=augmenter,
                      algorithm_params={"correction": VARIANTS[variant]})
    cfg = validate(RunConfig(rounds=args.rounds, lr=args.lr, model=args.model, seed=args.seed, methods=[spec],
                             momentum=args.momentum))
    t0 = time.perf_counter()
    try:
        res = run(cfg, work / spec.name, progress=False)
    except DivergedError as exc:  # a non-finite loss or weights: record it, keep the other runs
        return {"diverged": str(exc), "accuracy": [], "train_loss": [], "seconds": time.perf_counter() - t0}
    s = res["methods"][spec.name]["seeds"][str(args.seed)]
    return {"accuracy": s["accuracy"], "train_loss": s["train_loss"], "final_accuracy": s["final_accuracy"],
            "last5_mean": s["last5_mean"], "seconds": time.perf_counter() - t0}


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    augs = list(out["runs"])
    fig, axes = plt.subplots(1, len(augs), figsize=(5.2 * len(augs), 3.8), squeeze=False)
    for ax, aug in zip(axes[0], augs):
        for variant, style in (("before", dict(color="tab:red", ls="--")), ("after", dict(color="tab:blue"))):
            r = out["runs"][aug][variant]
            acc = [100 * a for a in r["accuracy"]]
            label = {"before": 'before: correction="momentum"', "after": 'after: correction="step" (default)'}
            tag = f" (diverged, round {len(acc) + 1})" if r.get("diverged") else ""
            ax.plot(range(1, len(acc) + 1), acc, label=label[variant] + tag, **style)
        ax.set_title(f"SCAFFOLD{'' if aug == 'none' else '+' + aug.upper()}")
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    s = out["settings"]
    fig.suptitle(f"embedded data, head {s['model']}, lr {s['lr']}, momentum {s['momentum']}, "
                 f"global_lr {s['global_lr']}, seed {s['seed']} (one run each)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--augmenters", default="none,ggeur")
    ap.add_argument("--json", type=Path, default=ROOT / "results/scaffold/scaffold-before-after.json")
    ap.add_argument("--png", type=Path, default=ROOT / "docs/scaffold-before-after.png")
    ap.add_argument("--replot", action="store_true", help="redraw --png from the --json of an earlier run")
    args = ap.parse_args(argv)
    if args.replot:
        with atomic_write(args.png) as tmp:
            plot(json.loads(args.json.read_text()), tmp)
        print(f"wrote {args.png} from {args.json}")
        return
    torch.set_num_threads(1)
    augs = [a.strip() for a in args.augmenters.split(",") if a.strip()]
    if not augs:
        ap.error("--augmenters: give at least one augmenter, e.g. none,ggeur")
    out = {"command": "studies/scaffold-curve/scaffold_curve.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "settings": {"model": args.model, "lr": args.lr, "momentum": args.momentum, "rounds": args.rounds,
                        "seed": args.seed, "global_lr": Scaffold.defaults["global_lr"]},
           "runs": {}}
    with tempfile.TemporaryDirectory(prefix="scaffold-curve-") as tmp:
        for aug in augs:
            out["runs"][aug] = {v: one_run(args, aug, v, Path(tmp)) for v in ("before", "after")}
            for v, r in out["runs"][aug].items():
                end = f"final {100 * r['final_accuracy']:.2f} %" if not r.get("diverged") else r["diverged"][:80]
                acc = r["accuracy"]
                peak = f", peak {100 * max(acc):.2f} % at round {acc.index(max(acc)) + 1}" if acc else ""
                print(f"{aug:6s} {v:6s} {end}{peak} ({r['seconds']:.0f} s)", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(args.json) as tmp:
        tmp.write_text(json.dumps(out, indent=1) + "\n")
    with atomic_write(args.png) as tmp:
        plot(out, tmp)
    print(f"wrote {args.json} and {args.png}")


if __name__ == "__main__":
    main()
