"""Draw the Fig. 4-style curve (docs/flic.md) from the stored runs of fig4.sh and official.sh.

Final accuracy (mean over clients) against the number of clients, one column per toy. Top: this
project's Local, FLIC and HetFedRep (the files of one fig4.sh run, ``--run``: "preset", the
flic-paper preset since issue 43; "official-schedule", the earlier preset with the official
schedule set by flags, docs/history.md §26) as mean ± sd over their seeds, the official
code's Local and FLIC as its seeds' mean (final round, every client trained) with each seed as a
dot. Bottom: each method minus Local on the same seed (same data), mean with the range over seeds,
since the seed-to-seed spread of the levels hides the paired differences.

usage: python studies/flic-schedule/fig4_plot.py [--results DIR] [--png FILE] [--run preset|official-schedule]
"""
import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOYS = ("linear-mapping", "noisy-features")
HETFEDREP = {"preset": "preset-hetfedrep", "official-schedule": "hetfedrep"}  # each run's HetFedRep files
# the official runs stored beside each: per client count the first suffix with a file (-s14: seeds 3-4 added
# at 100 clients; -s13: the 20-client seeds and the first three at 100)
OFFICIAL = {"preset": ("-s14", "-s13"), "official-schedule": ("",)}


def _counts(results: Path, pattern: str) -> dict[int, Path]:
    found = {}
    for p in results.glob("*.json"):
        m = re.fullmatch(pattern, p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def _fedsim_acc(path: Path, method: str) -> list[float]:
    seeds = json.loads(path.read_text())["methods"][method]["seeds"]
    return [100 * s["final_accuracy"] for s in seeds.values()]


def plot(results: Path, png: Path, run: str = "preset") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(2, 2, figsize=(10.5, 7.5), squeeze=False, sharex=True)

    def paired(ax, x, diffs, **style):
        diffs = [np.asarray(d) for d in diffs]
        mid = [d.mean() for d in diffs]
        ax.errorbar(x, mid, yerr=[[m - d.min() for m, d in zip(mid, diffs)], [d.max() - m for m, d in zip(mid, diffs)]],
                    capsize=3, **style)

    for col, toy in enumerate(TOYS):
        top, bottom = axes[0][col], axes[1][col]
        runs = _counts(results, rf"{toy}-(\d+)clients-5seeds-{run}\.json")
        het = _counts(results, rf"{toy}-(\d+)clients-5seeds-{HETFEDREP[run]}\.json")
        local = {n: np.array(_fedsim_acc(p, "Local")) for n, p in runs.items()}
        for label, cells, method, color in (("Local", runs, "Local", "tab:gray"),
                                            (f"FLIC ({run})", runs, "FLIC", "tab:blue"),
                                            ("HetFedRep", het, "FLIC", "tab:green")):
            accs = {n: np.array(_fedsim_acc(p, method)) for n, p in cells.items()}
            if not accs:
                continue
            top.errorbar(list(accs), [a.mean() for a in accs.values()], yerr=[a.std(ddof=1) for a in accs.values()],
                         label=f"{label}, here", color=color, marker="o", capsize=3)
            if method != "Local" or cells is not runs:
                both = [n for n in accs if n in local]
                paired(bottom, both, [accs[n] - local[n] for n in both], label=f"{label} - Local, here",
                       color=color, marker="o")
        files = {}
        for suffix in reversed(OFFICIAL[run]):  # the earlier suffix first, so the later one wins
            files.update(_counts(results, rf"official-{toy}-(\d+)clients{suffix}\.json"))
        official = {n: json.loads(p.read_text())["runs"] for n, p in sorted(files.items())}
        for method, color in (("Local", "tab:gray"), ("FLIC", "tab:blue")):
            pts = {n: [r["final_round_all_clients"] for r in runs_.get(method, {}).values()]
                   for n, runs_ in official.items()}
            pts = {n: v for n, v in pts.items() if v}
            if not pts:
                continue
            top.plot(list(pts), [np.mean(v) for v in pts.values()], ls="--", marker="s", color=color, mfc="white",
                     label=f"{method}, official code")
            for n, v in pts.items():
                top.scatter([n] * len(v), v, s=10, color=color, alpha=0.5)
        both = [n for n, r in official.items() if r.get("FLIC") and r.get("Local")]
        if both:
            diffs = [[official[n]["FLIC"][s]["final_round_all_clients"] - official[n]["Local"][s]["final_round_all_clients"]
                      for s in official[n]["FLIC"] if s in official[n]["Local"]] for n in both]
            paired(bottom, both, diffs, label="FLIC - Local, official code", color="tab:blue", marker="s",
                   mfc="white", ls="--")
        top.set_title(toy)
        top.set_ylabel("final test accuracy %, mean over clients")
        bottom.axhline(0, color="k", lw=0.8)
        bottom.set_ylabel("minus Local, same seed (points)")
        bottom.set_xlabel("number of clients")
        bottom.set_xscale("log")
        bottom.minorticks_off()
        bottom.set_xticks([20, 50, 100, 200], labels=["20", "50", "100", "200"])
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"flic-paper preset ({run}: T 50, r 0.1, M 10, Adam 1e-3); here 5 seeds, mean ± sd; "
                 "official code: its own toy data, reduced alignment", fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "results/flic-paper/fig4")
    ap.add_argument("--png", type=Path, default=ROOT / "docs/flic-fig4.png")
    ap.add_argument("--run", choices=sorted(HETFEDREP), default="preset")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        ap.error(f"--results {args.results}: not a folder; run studies/flic-schedule/fig4.sh first")
    plot(args.results, args.png, args.run)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
