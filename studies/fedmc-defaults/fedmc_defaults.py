"""How FedMC's defaults were chosen: one-at-a-time sweeps of gamma, d, m, L, N_base (and scale).

Two measurements, each against its baseline in the same run:

* ``fidelity``: the manifold-fidelity benchmark (scripts/fidelity.py, full size, D = 64):
  the off-manifold ratio of FedMC samples at matched displacement, relative to GGEUR's
  (lower is better), for each setting.
* ``embedded``: federated accuracy of FedAvg+FedMC on the embedded WordNet/MiniLM data
  (Dirichlet beta, 10 clients, 30 rounds), next to FedAvg and FedAvg+GGEUR on the same partitions.

Each setting changes one parameter of the base configuration. Rows are appended to the JSON
lines file given by --out as they finish, so an interrupted sweep keeps what it measured.

Run (what produced results/fedmc-defaults/fedmc_defaults_*-cpu.jsonl; docs/history.md §7):
  python studies/fedmc-defaults/fedmc_defaults.py fidelity --out F.jsonl
  python studies/fedmc-defaults/fedmc_defaults.py embedded --stage calibration --seeds 0 1 --out E.jsonl
  python studies/fedmc-defaults/fedmc_defaults.py embedded --stage parameters --base '{"anchored": true}' --seeds 0 1 --out E.jsonl
  python studies/fedmc-defaults/fedmc_defaults.py embedded --base '{"anchored": true}' --seeds 0 1 2 \
      --settings '[{"n_base": 256, "n_prototypes": 32}, {"scale": 0.0}]' --out E.jsonl
The "base" rows use the augmenter's defaults at the time of the run (recorded with each row's
params); the sweeps above ran before N_base 256 / 32 prototypes / anchored became the defaults.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # fidelity.py
import fidelity  # noqa: E402

FIDELITY_BASE = dict(gamma="median", d=2, n_clusters=6, n_base=128, n_entries=20)
# each entry overrides the base: setup parameters, or "method" / "anchored" of the calibration
FIDELITY_SWEEP = [{"gamma": "1/D"}, {"d": 1}, {"d": 3}, {"d": 4}, {"n_clusters": 3}, {"n_clusters": 12},
                  {"n_base": 64}, {"n_base": 256}, {"n_entries": 10}, {"n_entries": 40},
                  {"anchored": True}, {"method": "gd"}, {"method": "gd", "anchored": True}]

EMBEDDED_CALIBRATION = [{"anchored": True}, {"anchored": True, "scale": 4.0}, {"anchored": True, "scale": 8.0},
                        {"anchored": True, "scale": 16.0}, {"anchored": True, "scale": 32.0},
                        {"method": "coordinates", "scale": 0.25}, {"method": "coordinates", "scale": 0.5}]
EMBEDDED_SWEEP = [{"gamma": "1/D"}, {"n_components": 2}, {"n_components": 8}, {"n_components": "auto"},
                  {"n_clusters": 4}, {"n_clusters": 16}, {"n_entries": 16}, {"n_entries": 64},
                  {"n_base": 64}, {"n_base": 256}, {"scale": 0.0}, {"scale": 0.5}, {"scale": 2.0},
                  {"anchored": True}, {"anchored": True, "scale": 4.0}, {"anchored": True, "scale": 8.0},
                  {"anchored": True, "scale": 12.0}]


def _label(over: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in over.items()) or "base"


def _append(path: str, row: dict) -> None:
    print(json.dumps(row), flush=True)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def sweep_fidelity(out: str, *, seed: int = 0, dim: int = 64, manifolds=("s_curve", "swiss_roll")) -> None:
    cfg = fidelity.SIZES["full"]
    for name in manifolds:
        M, clients, X, target = fidelity.split_problem(name, dim, cfg, seed, noise=0.01, displacement=0.1)

        def ratio(Z):
            return float(M.distance(Z).mean() / np.linalg.norm(Z - X, axis=1).mean())

        g_ratio = ratio(fidelity.ggeur_samples(clients, target, seed))
        for over in [{}] + FIDELITY_SWEEP:
            kw = {**FIDELITY_BASE, "method": "fixed_point", "anchored": False, **over}
            solve = {k: kw.pop(k) for k in ("method", "anchored")}
            t0 = time.perf_counter()
            B, dictionary = fidelity.fedmc_setup(clients, seed=seed, **kw)
            Z, scale = fidelity.fedmc_samples(clients, target, seed, B, dictionary, formulation="consistent",
                                              **solve)
            r = ratio(Z)
            _append(out, dict(kind="fidelity", manifold=name, D=dim, setting=_label(over), config=kw, **solve,
                              ratio=r, ggeur_ratio=g_ratio, vs_ggeur=r / g_ratio, scale=scale,
                              seconds=time.perf_counter() - t0))


def sweep_embedded(out: str, *, seeds=(0,), beta: float = 0.1, rounds: int = 30, sweep=None,
                   base: dict | None = None) -> None:
    from fedsim.data import load_dataset
    from fedsim.data.partition import partition
    from fedsim.runner import MethodSpec, RunConfig, run_method, validate

    cfg = validate(RunConfig(beta=beta, rounds=rounds))  # the model's lr / batch size where None
    ds = load_dataset(cfg.dataset)
    specs = [("FedAvg", MethodSpec("FedAvg")), ("FedAvg+GGEUR", MethodSpec("FedAvg+GGEUR", augmenter="ggeur"))]
    # the recorded sweeps ran under protocol="fixed" (the default then; n_per_sample and
    # target_per_class exist only there): that stays their base unless --base names another
    base = {"protocol": "fixed", **(base or {})}
    for over in [{}] + (EMBEDDED_SWEEP if sweep is None else sweep):
        specs.append((f"FedMC {_label(over)}",
                      MethodSpec("FedAvg+FedMC", augmenter="fedmc", augmenter_params={**base, **over})))
    for seed in seeds:
        parts = partition(cfg.partition, labels=ds.y_train, domains=ds.d_train, n_clients=cfg.n_clients,
                          beta=beta, seed=seed, min_size=cfg.min_size)
        for label, spec in specs:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                metrics, timings = run_method(cfg, spec, seed, ds, parts, Path(tmp), progress=False)
            _append(out, dict(kind="embedded", beta=beta, seed=seed, method=label, params=spec.augmenter_params,
                              final=metrics["final_accuracy"], last5=metrics["last5_mean"],
                              setup_s=timings.get("geometry_setup_s", 0.0),
                              geometry_s=sum(t["geometry_s"] for t in timings["rounds"]),
                              seconds=time.perf_counter() - t0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("fidelity", "embedded"))
    p.add_argument("--out", default="")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--stage", choices=("calibration", "parameters"), default="parameters",
                   help="embedded: the pre-image/anchoring/scale choices, or the setup parameters")
    p.add_argument("--base", default="{}", help="embedded: JSON of FedMC parameters every setting starts from")
    p.add_argument("--settings", default="", help="embedded: a JSON list of settings instead of --stage's")
    a = p.parse_args(argv)
    if a.what == "fidelity":
        for s in a.seeds:
            sweep_fidelity(a.out, seed=s)
    else:
        sweep_embedded(a.out, seeds=a.seeds, beta=a.beta, base=json.loads(a.base),
                       sweep=json.loads(a.settings) if a.settings else
                       EMBEDDED_CALIBRATION if a.stage == "calibration" else EMBEDDED_SWEEP)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
