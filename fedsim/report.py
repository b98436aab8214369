"""Results table, JSON/CSV and PNG plots of a run."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ._io import atomic_write, json_text
from .algorithms import ALGORITHMS
from .augmenters import AUGMENTERS, resolve
from .data.partition import class_matrix
from .metrics import CONVERGENCE_SLOPE, CONVERGENCE_WINDOW


# scalar metrics summarised over seeds, where every seed of a method has them
SCALARS = ("final_accuracy", "last5_mean", "bytes_up", "bytes_down", "per_domain_std", "client_accuracy_std",
           "zero_shot_accuracy", "worst_class_accuracy", "own_class_accuracy", "missing_class_accuracy")


def mean_std(values) -> dict:
    """Mean and the sample standard deviation (ddof = 1, the estimate of a new seed's spread) over
    seeds; std is None with one seed."""
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else None}


def summarise(per_seed: dict) -> dict:
    """Mean and sample std (ddof = 1) over seeds of the scalar metrics; the per-class accuracy's
    mean and std per class (a class without test rows: None); the convergence check over seeds
    (``convergence``: the mean of the seeds' validation slopes, the slope of their mean curve,
    against metrics.CONVERGENCE_SLOPE; absent where a seed was not checked)."""
    out = {k: mean_std([v[k] for v in per_seed.values()]) for k in SCALARS
           if all(v.get(k) is not None for v in per_seed.values())}
    slopes = [v.get("val_slope") for v in per_seed.values()]
    if all(x is not None for x in slopes):
        slope = float(np.mean(slopes))
        out["convergence"] = {"val_slope": slope, "converged": slope <= CONVERGENCE_SLOPE,
                              "limit": CONVERGENCE_SLOPE, "window": CONVERGENCE_WINDOW}
    if all("per_class" in v for v in per_seed.values()):
        cols = list(zip(*(v["per_class"] for v in per_seed.values())))
        stats = [mean_std(c) if all(a is not None for a in c) else {"mean": None, "std": None} for c in cols]
        out["per_class"] = {"mean": [s["mean"] for s in stats], "std": [s["std"] for s in stats]}
    return out


def _paired(m: dict, ref: dict, ref_name: str, key: str) -> dict | None:
    """Method ``m``'s ``key`` minus method ``ref``'s, seed by seed (the same seed means the same
    partition, initial model and client sampling, so the pair shares its noise): the per-seed
    differences, their mean and their min and max; None without a common seed."""
    seeds = [s for s in m["seeds"] if s in ref["seeds"] and key in m["seeds"][s] and key in ref["seeds"][s]]
    if not seeds:
        return None
    d = {s: m["seeds"][s][key] - ref["seeds"][s][key] for s in seeds}
    return {"vs": ref_name, "metric": key, "per_seed": d, "mean": float(np.mean(list(d.values()))),
            "min": float(min(d.values())), "max": float(max(d.values()))}


def paired_differences(results: dict, key: str = "final_accuracy") -> None:
    """Each method's paired difference (``_paired``) to the first method, into its summary as
    ``paired_diff``. The first method gets none; a method without a seed of the first gets none."""
    names = list(results["methods"])
    for name in names[1:]:
        d = _paired(results["methods"][name], results["methods"][names[0]], names[0], key)
        if d is not None:
            results["methods"][name]["summary"]["paired_diff"] = d


def control_of(method: dict, methods: list[dict]) -> str | None:
    """The name of ``method``'s control among ``methods`` (results.json's config methods: name,
    algorithm, augmenter and their params), None if it has none there. The control differs from
    the method only in what is under test: an augmenter's matched-compute control (its ``controls``:
    GGEUR -> oversample at the same target_per_class, fedmc (Algorithm 1) -> no augmenter,
    fedmc-fixed (also spelled fedmc with protocol "fixed") -> oversample) under the same algorithm
    and algorithm parameters; failing that, the algorithm's (FedMP -> FedAvg under the same
    schedule) under the same augmenter and augmenter parameters. The first of a plug-in's
    preferences found in the run is taken."""
    def alg(m):
        return m["algorithm"].lower(), {**ALGORITHMS[m["algorithm"].lower()].defaults, **m["algorithm_params"]}

    def aug(m):  # the augmenter a method runs (augmenters.resolve), with its defaults merged in
        name, params = resolve(m["augmenter"], m["augmenter_params"])
        return name, {**AUGMENTERS[name].defaults, **params}

    wanted = [("augmenter", w) for w in AUGMENTERS[aug(method)[0]].controls(aug(method)[1])] + \
             [("algorithm", w) for w in ALGORITHMS[method["algorithm"].lower()].controls(alg(method)[1])]
    for kind, w in wanted:
        same, varied = (alg, aug) if kind == "augmenter" else (aug, alg)
        for c in methods:
            name, params = varied(c)
            if c is not method and same(c) == same(method) and name == w[kind] and \
                    all(params.get(k) == v for k, v in w[f"{kind}_params"].items()):
                return c["name"]
    return None


def control_differences(results: dict, key: str = "final_accuracy") -> None:
    """Each method's paired difference (``_paired``) to its control (``control_of``), into its
    summary as ``control_diff``; none for a method without a control in the run (or the centralised
    row)."""
    specs = results["config"]["methods"]
    for spec in specs:
        ref = control_of(spec, specs)
        if ref is not None and spec["name"] in results["methods"]:
            d = _paired(results["methods"][spec["name"]], results["methods"][ref], ref, key)
            if d is not None:
                results["methods"][spec["name"]]["summary"]["control_diff"] = d


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


def aligned(head: list, rows: list[list]) -> list[str]:
    """A text table's lines: the header, a rule, the rows; the first column left-aligned, the
    others right-aligned."""
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]

    def line(r):
        return "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in enumerate(zip(r, widths)))

    return [line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


def format_table(results: dict, timings: dict) -> str:
    multi = len(next(iter(results["methods"].values()))["seeds"]) > 1
    has_dom = any("per_domain_std" in m["summary"] for m in results["methods"].values())
    # personalised runs: "final acc" is the mean over clients of each client's accuracy on its own test split
    has_cli = any("client_accuracy_std" in m["summary"] for m in results["methods"].values())

    def cell(s, scale=100.0, fmt="{:.2f}"):
        return (fmt.format(s["mean"] * scale) + (f" ± {fmt.format(s['std'] * scale)}" if multi else ""))

    def diff(s, key="paired_diff"):  # paired difference: mean [min, max] over seeds, percentage points
        d = s.get(key)
        if d is None:
            return "-"
        return f"{100 * d['mean']:+.2f}" + (f" [{100 * d['min']:+.2f}, {100 * d['max']:+.2f}]" if multi else "")

    def chosen(m, key):  # a tuned value; "0.0125 (min)": chosen at an end of its grid
        t = m.get("tuning")
        return "-" if t is None else f"{t[key]:g}" + (f" ({t['at_edge'][key]})" if key in t.get("at_edge", {}) else "")

    first = next(iter(results["methods"]))
    has_diff = any("paired_diff" in m["summary"] for m in results["methods"].values())
    has_ctl = any("control_diff" in m["summary"] for m in results["methods"].values())
    has_cls = any("worst_class_accuracy" in m["summary"] for m in results["methods"].values())
    tuned = any("tuning" in m for m in results["methods"].values())
    tuned_epochs = tuned and bool(results["config"].get("tune_epochs"))
    rising = [n for n, m in results["methods"].items()
              if not m["summary"].get("convergence", {}).get("converged", True)]

    has_zs = any("zero_shot_accuracy" in m["summary"] for m in results["methods"].values())
    head = ["method"] + (["zero-shot %"] if has_zs else []) + ["final acc %", "last-5 acc %"] + \
        (["domain acc std %"] if has_dom else []) + \
        (["client acc std %"] if has_cli else []) + \
        ([f"vs {first} pp"] if has_diff else []) + \
        (["control", "vs control pp"] if has_ctl else []) + \
        (["lr"] if tuned else []) + (["epochs"] if tuned_epochs else []) + \
        (["worst class %", "own classes %", "missing classes %"] if has_cls else []) + \
        ["train s/rnd", "geom s/rnd", "MB up", "MB down", "max eps"]
    rows = []
    for name, m in results["methods"].items():
        s = m["summary"]
        tr, ge = _timing_summary(timings[name])
        row = [name + (" *" if name in rising else "")] + \
            ([cell(s["zero_shot_accuracy"]) if "zero_shot_accuracy" in s else "-"] if has_zs else []) + \
            [cell(s["final_accuracy"]), cell(s["last5_mean"])]
        if has_dom:
            row.append(cell(s["per_domain_std"]) if "per_domain_std" in s else "-")
        if has_cli:
            row.append(cell(s["client_accuracy_std"]) if "client_accuracy_std" in s else "-")
        if has_diff:
            row.append(diff(s))
        if has_ctl:
            row += [s["control_diff"]["vs"] if "control_diff" in s else "-", diff(s, "control_diff")]
        if tuned:
            row.append(chosen(m, "lr"))
        if tuned_epochs:
            row.append(chosen(m, "local_epochs"))
        if has_cls:
            row += [cell(s[k]) if k in s else "-" for k in ("worst_class_accuracy", "own_class_accuracy",
                                                            "missing_class_accuracy")]
        row += [f"{tr:.3f}", f"{ge:.3f}", f"{s['bytes_up']['mean'] / 1e6:.1f}", f"{s['bytes_down']['mean'] / 1e6:.1f}",
                max_epsilon(m)]
        rows.append(row)
    notes = []
    if multi:
        notes.append("a ± b: mean ± sample std (ddof = 1) over seeds")
    if has_diff:
        notes.append(f"vs {first}: final acc minus {first}'s, same seed and partition, in percentage points: "
                     "mean" + (" [min, max] over seeds" if multi else ""))
    if has_ctl:
        notes.append("vs control: final acc minus its control's (the method that differs only in what is under "
                     "test: GGEUR's matched-compute control is oversample, FedMC's under Algorithm 1 plain FedAvg, "
                     "FedMP's FedAvg under the same schedule), same seed, in percentage points: mean"
                     + (" [min, max] over seeds" if multi else ""))
    if tuned:
        score = next(m["tuning"]["score"] for m in results["methods"].values() if "tuning" in m)
        notes.append(f"lr{', epochs' if tuned_epochs else ''}: chosen per method from the grid of --tune by its "
                     f"{score}; the grid and its scores are in results.json; (min)/(max): the grid's end, the best "
                     "may lie beyond it (--tune-lr, --tune-epochs)")
    if rising:
        notes.append(f"* not converged: validation accuracy still rising over the last {CONVERGENCE_WINDOW} rounds "
                     f"(least-squares slope above {100 * CONVERGENCE_SLOPE:g} points per round, mean over seeds): more "
                     "rounds would change this row (fedsim run --resume DIR --rounds N)")
    elif not any("convergence" in m["summary"] for m in results["methods"].values()):
        notes.append("convergence not checked: " + _unchecked_why(results["config"]))
    if has_cls:
        notes.append("own/missing classes: test accuracy on the classes a client holds (>= 1 training row) / "
                     "lacks, mean over clients; worst class: the lowest per-class test accuracy")
    return "\n".join(aligned(head, rows) + notes)


def _unchecked_why(cfg: dict) -> str:
    """Why a run's table carries no convergence check."""
    if "val_fraction" not in cfg:
        return "the personalised path has no validation rows"
    if cfg["val_fraction"] == 0:
        return "no validation rows (--val-fraction 0)"
    if cfg["rounds"] < CONVERGENCE_WINDOW:
        return f"fewer than {CONVERGENCE_WINDOW} rounds"
    return "too few rows to hold validation rows out (clients of 1-4 rows per class)"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def partition_text(cfg: dict) -> str:
    """A run's partition for titles and headers, e.g. "partition dirichlet beta=0.1, "; "partition
    iid, " alone; "" for a toy dataset's personalised run, which generates its own clients
    (results.json records only what played a part: runner.results_config)."""
    if "partition" not in cfg:
        return ""
    return "partition " + cfg["partition"] + (f" beta={cfg['beta']}" if "beta" in cfg else "") + ", "


def _seeds_text(cfg: dict) -> str:
    n = cfg["seeds"]
    return f"seed {cfg['seed']}" if n == 1 else f"{n} seeds ({cfg['seed']}-{cfg['seed'] + n - 1})"


def _short(name: str) -> str:
    return name.replace("noun.", "")


def plot_accuracy(results: dict, path: Path) -> None:
    """Test accuracy per round, the mean over seeds with a band of ± one sample std (ddof = 1);
    with more than four methods the legend goes outside the axes, right of the plot."""
    plt = _pyplot()
    cfg = results["config"]
    methods = results["methods"]
    many = len(methods) > 4
    fig, ax = plt.subplots(figsize=(9.5 if many else 6.5, 4.2))
    cmap = plt.get_cmap("tab20" if len(methods) > 10 else "tab10")
    multi = False
    for i, (name, m) in enumerate(methods.items()):
        A = np.array([v["accuracy"] for v in m["seeds"].values()]) * 100
        x = np.arange(1, A.shape[1] + 1)
        color = cmap(i % cmap.N)
        ax.plot(x, A.mean(0), label=name, color=color, lw=1.6, ls="--" if name == "Centralised" else "-")
        if A.shape[0] > 1:
            multi = True
            sd = A.std(0, ddof=1)
            ax.fill_between(x, A.mean(0) - sd, A.mean(0) + sd, alpha=0.15, color=color, lw=0)
    band = "; band: ± sample std over seeds" if multi else ""
    ax.set(xlabel="round", ylabel="test accuracy (%)",
           title=f"{results['dataset'].split(':')[0]}: {partition_text(cfg)}{cfg['n_clients']} clients"
                 f"\nhead {cfg['model']}, lr {cfg['lr']:g}, {_seeds_text(cfg)}" + ("; mean over seeds" if multi else "")
                 + band)
    ax.title.set_fontsize(10)
    ax.grid(alpha=0.3)
    if many:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_partition(parts, labels, n_classes: int, class_names, path: Path, *, seed: int | None = None) -> None:
    """Training rows per client and class on a log colour scale (so a client's 1-5 rows of a class
    show), the count written in every non-empty cell when the cells are large enough."""
    from matplotlib.colors import LogNorm

    plt = _pyplot()
    M = np.asarray(class_matrix(parts, labels, n_classes))
    fig, ax = plt.subplots(figsize=(max(6, n_classes * 0.38 + 2), max(3, len(parts) * 0.35 + 1.6)))
    masked = np.ma.masked_equal(M, 0)
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    im = ax.imshow(masked, aspect="auto", cmap=cmap, norm=LogNorm(vmin=1, vmax=max(int(M.max()), 2)))
    ax.set(xlabel="class", ylabel="client",
           title=f"training rows per client and class (partition of seed {seed}; white = none)"
           if seed is not None else "training rows per client and class (white = none)")
    ax.title.set_fontsize(10)
    ax.set_yticks(range(len(parts)))
    if len(class_names) <= 40:
        ax.set_xticks(range(n_classes), [_short(c) for c in class_names], rotation=90, fontsize=7)
    if n_classes <= 40 and len(parts) <= 40:  # counts in the cells while they fit
        big = M.max() ** 0.5
        for (i, j), v in np.ndenumerate(M):
            if v:
                ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6,
                        color="black" if v > big else "white")
    fig.colorbar(im, ax=ax, label="rows (log scale)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_per_class(results: dict, class_names, path: Path) -> None:
    """The final model's test accuracy per class (rows: methods, columns: classes; mean over
    seeds), written in the cells while they fit."""
    methods = {n: m["summary"]["per_class"]["mean"] for n, m in results["methods"].items()
               if "per_class" in m["summary"]}
    if not methods:
        return
    plt = _pyplot()
    A = np.array([[np.nan if a is None else 100 * a for a in v] for v in methods.values()])
    C = A.shape[1]
    fig, ax = plt.subplots(figsize=(max(6, C * 0.38 + 3), max(2.5, len(methods) * 0.4 + 1.8)))
    im = ax.imshow(A, aspect="auto", cmap="RdYlGn", vmin=0, vmax=100)
    cfg = results["config"]
    ax.set(xlabel="class", title=f"final test accuracy per class (%), head {cfg['model']}, {_seeds_text(cfg)}"
                                 + (" (mean)" if cfg["seeds"] > 1 else ""))
    ax.title.set_fontsize(10)
    ax.set_yticks(range(len(methods)), list(methods), fontsize=8)
    if C <= 60:
        ax.set_xticks(range(C), [_short(c) for c in class_names], rotation=90, fontsize=7)
    if C <= 40:
        for (i, j), v in np.ndenumerate(A):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=ax, label="accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_per_class(results: dict, class_names) -> str:
    """Per-class final accuracy (%), one row per class, one column per method (mean over seeds)."""
    methods = {n: m["summary"]["per_class"]["mean"] for n, m in results["methods"].items()
               if "per_class" in m["summary"]}
    if not methods:
        return ""
    head = ["class"] + list(methods)
    rows = [[_short(c)] + ["-" if v[j] is None else f"{100 * v[j]:.1f}" for v in methods.values()]
            for j, c in enumerate(class_names)]
    return "\n".join(["final test accuracy per class (%)"] + aligned(head, rows))


def write_outputs(results: dict, timings: dict, ds, parts, out: Path) -> None:
    """The run's files; first completes the summaries with the paired differences to the first
    method and to each method's control (so the returned ``results`` and results.json agree).
    ``parts``: the first seed's partition (partition.png)."""
    paired_differences(results)
    control_differences(results)
    plot_partition(parts, ds.y_train, ds.n_classes, ds.class_names, out / "partition.png",
                   seed=results["config"]["seed"])
    plot_accuracy(results, out / "accuracy.png")
    plot_per_class(results, ds.class_names, out / "per_class.png")
    with atomic_write(out / "results.csv") as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "seed", "round", "accuracy", "train_loss"])
        for name, m in results["methods"].items():
            for seed, v in m["seeds"].items():
                for r, (a, l) in enumerate(zip(v["accuracy"], v["train_loss"]), 1):
                    w.writerow([name, seed, r, f"{a:.6f}", f"{l:.6f}"])
    for name, text in (("timings.json", json_text(timings)),
                       ("table.txt", format_table(results, timings) + "\n\n" + format_per_class(results, ds.class_names)
                        + "\n"),
                       # results.json last: its presence marks a finished run; never NaN/Infinity in it
                       # (an infinite epsilon of the configuration is the string "inf": json_text)
                       ("results.json", json_text(results))):
        with atomic_write(out / name) as tmp:
            tmp.write_text(text)
