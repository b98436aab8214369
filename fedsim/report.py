"""Results table, JSON/CSV and PNG plots of a run."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from ._io import atomic_write
from .data.partition import class_matrix


def summarise(per_seed: dict) -> dict:
    """Mean and std over seeds of the scalar metrics."""
    keys = ["final_accuracy", "last5_mean", "bytes_up", "bytes_down"]
    if any("per_domain_std" in v for v in per_seed.values()):
        keys.append("per_domain_std")
    if any("client_accuracy_std" in v for v in per_seed.values()):  # personalised: std across clients
        keys.append("client_accuracy_std")
    out = {}
    for k in keys:
        vals = np.array([v[k] for v in per_seed.values()], dtype=np.float64)
        out[k] = {"mean": float(vals.mean()), "std": float(vals.std())}
    return out


def _timing_summary(tim: dict) -> tuple[float, float]:
    """Mean seconds per round (training, geometry), the one-time setup spread over the rounds."""
    train, geom = [], []
    for t in tim.values():
        n = max(len(t["rounds"]), 1)
        train.append(sum(r["train_s"] for r in t["rounds"]) / n)
        geom.append((sum(r["geometry_s"] for r in t["rounds"]) + t.get("geometry_setup_s", 0.0)) / n)
    return float(np.mean(train)), float(np.mean(geom))


def max_epsilon(m: dict) -> str:
    """The largest epsilon a method's DP releases spent on any client and seed: "-" for a method that
    releases nothing, "inf" where something was sent without noise."""
    privs = [v["privacy"] for v in m["seeds"].values() if "privacy" in v]
    spent = [e for p in privs for e in p["epsilon_spent"]]
    if not spent or (all(e == 0 for e in spent) and not any(p["releases"] for p in privs)):
        return "-"
    return "inf" if any(e is None for e in spent) else f"{max(spent):.3g}"


def format_table(results: dict, timings: dict) -> str:
    multi = len(next(iter(results["methods"].values()))["seeds"]) > 1
    has_dom = any("per_domain_std" in m["summary"] for m in results["methods"].values())
    # personalised runs: "final acc" is the mean over clients of each client's accuracy on its own test split
    has_cli = any("client_accuracy_std" in m["summary"] for m in results["methods"].values())

    def cell(s, scale=100.0, fmt="{:.2f}"):
        return (fmt.format(s["mean"] * scale) + (f" ± {fmt.format(s['std'] * scale)}" if multi else ""))

    head = ["method", "final acc %", "last-5 acc %"] + (["domain acc std %"] if has_dom else []) + \
        (["client acc std %"] if has_cli else []) + \
        ["train s/rnd", "geom s/rnd", "MB up", "MB down", "max eps"]
    rows = []
    for name, m in results["methods"].items():
        s = m["summary"]
        tr, ge = _timing_summary(timings[name])
        row = [name, cell(s["final_accuracy"]), cell(s["last5_mean"])]
        if has_dom:
            row.append(cell(s["per_domain_std"]) if "per_domain_std" in s else "-")
        if has_cli:
            row.append(cell(s["client_accuracy_std"]) if "client_accuracy_std" in s else "-")
        row += [f"{tr:.3f}", f"{ge:.3f}", f"{s['bytes_up']['mean'] / 1e6:.1f}", f"{s['bytes_down']['mean'] / 1e6:.1f}",
                max_epsilon(m)]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def plot_accuracy(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, m in results["methods"].items():
        A = np.array([v["accuracy"] for v in m["seeds"].values()]) * 100
        x = np.arange(1, A.shape[1] + 1)
        ax.plot(x, A.mean(0), label=name)
        if A.shape[0] > 1:
            ax.fill_between(x, A.mean(0) - A.std(0), A.mean(0) + A.std(0), alpha=0.2)
    cfg = results["config"]
    ax.set(xlabel="round", ylabel="test accuracy (%)",
           title=f"{results['dataset'].split(':')[0]}: {cfg['partition']} beta={cfg['beta']}, {cfg['n_clients']} clients")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_partition(parts, labels, n_classes: int, class_names, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    M = class_matrix(parts, labels, n_classes)
    fig, ax = plt.subplots(figsize=(max(6, n_classes * 0.3), max(3, len(parts) * 0.35)))
    im = ax.imshow(M, aspect="auto", cmap="viridis")
    ax.set(xlabel="class", ylabel="client", title="samples per client and class")
    ax.set_yticks(range(len(parts)))
    if len(class_names) <= 40:
        ax.set_xticks(range(n_classes), [c.replace("noun.", "") for c in class_names], rotation=90, fontsize=7)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(results: dict, timings: dict, ds, parts, out: Path) -> None:
    plot_partition(parts, ds.y_train, ds.n_classes, ds.class_names, out / "partition.png")
    plot_accuracy(results, out / "accuracy.png")
    with atomic_write(out / "results.csv") as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "seed", "round", "accuracy", "train_loss"])
        for name, m in results["methods"].items():
            for seed, v in m["seeds"].items():
                for r, (a, l) in enumerate(zip(v["accuracy"], v["train_loss"]), 1):
                    w.writerow([name, seed, r, f"{a:.6f}", f"{l:.6f}"])
    for name, text in (("timings.json", json.dumps(timings, indent=2)),
                       ("table.txt", format_table(results, timings) + "\n"),
                       # results.json last: its presence marks a finished run; never NaN/Infinity in it
                       ("results.json", json.dumps(results, indent=2, allow_nan=False))):
        with atomic_write(out / name) as tmp:
            tmp.write_text(text)
