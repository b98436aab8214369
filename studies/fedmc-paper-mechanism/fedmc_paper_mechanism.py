"""Why the fedmc-paper preset beats FedAvg on the embedded data: where its samples go, and a
control that reproduces that without FedMC's geometry (issue 14; docs/history.md §17).

Two measurements:

* ``geometry``: one round's calibrated samples of every client (embedded WordNet/MiniLM data,
  Dirichlet beta 0.1, 10 clients, seed 0, round 3 of Algorithm 1) for the preset and for the preset
  with one setting changed. fedsim's linear head is a cosine head, so only a sample's direction
  matters. Each sample's direction is fitted per row as a * x_hat + b * g_hat (x its source row,
  g the training data's mean; least squares, residual reported) and counted as a *copy* (a > 0.5),
  *common point* (|a| <= 0.5: the direction of g, whatever the row was) or *flip* (a < -0.5);
  also its cosine to its source and the nearest-class-mean accuracy of the samples.
* ``controls``: federated accuracy, seeds 0-2 (30 rounds, lr 0.05, one run): FedAvg, the preset,
  and ``mimic``, an augmenter with no geometry at all: each round it keeps a row with probability
  ``keep``, replaces it (label kept) by the mean direction of every client's data with
  probability ``common``, and by its negation otherwise. Its fractions are the ones ``geometry``
  measured for the preset (pass them with --keep/--common). If mimic matches the preset, the
  preset's gain comes from that mixture, not from on-manifold calibration.

Run (what produced results/fedmc-paper/fedmc-paper-mechanism-*.json):
  python studies/fedmc-paper-mechanism/fedmc_paper_mechanism.py geometry --out G.json
  python studies/fedmc-paper-mechanism/fedmc_paper_mechanism.py controls --keep K --common C --out DIR
  python studies/fedmc-paper-mechanism/fedmc_paper_mechanism.py controls --keep K --common C --mimic-only --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fedsim import augmenters
from fedsim._seeds import AUGMENT, generator
from fedsim.augmenters import Augmenter, ClientData, build_augmenter
from fedsim.data import load_dataset
from fedsim.runner import MethodSpec, RunConfig, client_data, make_partition, run, validate

PRESET = dict(n_base=512, n_clusters=3, gamma="1/D", formulation="paper", method="gd", anchored=False,
              protocol="algorithm1")  # fedsim/presets/fedmc-paper.toml's [params.fedmc]
VARIANTS = {"preset": {}, "scale 0": {"scale": 0.0}, "formulation consistent": {"formulation": "consistent"},
            "gamma median": {"gamma": "median"}, "anchored": {"anchored": True}, "n_base 256": {"n_base": 256},
            "m 8": {"n_clusters": 8}, "method fixed_point": {"method": "fixed_point"},
            "fedsim default (algorithm1)": None}


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=1, keepdim=True)


def decompose(xa: torch.Tensor, x: torch.Tensor, g_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row, the least-squares (a, b) of unit(xa) ~ a unit(x) + b g_hat, and the residual norm."""
    A = torch.stack([_unit(x), g_hat.expand_as(x)], -1).double()
    t = _unit(xa).double().unsqueeze(-1)
    sol = torch.linalg.lstsq(A, t).solution
    res = (t - A @ sol).squeeze(-1).norm(dim=1)
    return sol[:, 0, 0], sol[:, 1, 0], res


def geometry(args) -> dict:
    torch.set_num_threads(1)
    cfg = validate(RunConfig(beta=args.beta))
    ds = load_dataset(cfg.dataset)
    seed, r = 0, args.round
    clients, _ = client_data(cfg, ds, make_partition(cfg, ds, seed), seed)
    X, Y = ds.x_train.float(), ds.y_train
    g_hat = _unit(X.mean(0, keepdim=True))[0]
    mu_hat = _unit(torch.stack([X[Y == c].mean(0) for c in range(ds.n_classes)]))
    out = {"beta": args.beta, "seed": seed, "round": r, "rows": {}}
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants: {unknown} unknown; choose from {list(VARIANTS)}")
    for name in names:
        change = VARIANTS[name]
        params = {"protocol": "algorithm1"} if change is None else {**PRESET, **change}
        aug = build_augmenter("fedmc", **params)
        aug.rounds = cfg.rounds
        aug.setup(clients, n_classes=ds.n_classes, seed=seed)
        for rr in range(r + 1):  # as the round loop: 0-based; round r trains with D_{r-1}
            aug.begin_round(rr, list(range(len(clients))), clients, n_classes=ds.n_classes, seed=seed)
        xa, xs, ys = [], [], []
        for cid, c in enumerate(clients):
            s, yy = aug.augment(cid, c, generator=generator(seed, r, cid, AUGMENT))
            if not torch.equal(yy, c.y):
                raise AssertionError(f"{name}: algorithm1 must give one x' per x, labelled like its source")
            xa.append(s.float()), xs.append(c.x.float()), ys.append(c.y)
        xa, xs, ys = torch.cat(xa), torch.cat(xs), torch.cat(ys)
        a, b, res = decompose(xa, xs, g_hat)
        copy, flip = a > 0.5, a < -0.5
        row = {"params": params, "norm": xa.norm(dim=1).mean().item(),
               "cos_to_source": (_unit(xa) * _unit(xs)).sum(1).mean().item(),
               "class_mean_accuracy": ((_unit(xa) @ mu_hat.T).argmax(1) == ys).float().mean().item(),
               "copy": copy.double().mean().item(), "common": (~copy & ~flip).double().mean().item(),
               "flip": flip.double().mean().item(), "residual_median": res.median().item(),
               "residual_p90": torch.quantile(res, 0.9).item(), "b_of_common_median": b[~copy & ~flip].median().item()
               if (~copy & ~flip).any() else None,
               "per_class_common": {ds.class_names[c]: (~copy & ~flip)[ys == c].double().mean().item()
                                    for c in range(ds.n_classes) if (ys == c).any()}}
        out["rows"][name] = row
        print(f"{name:28s} |x'| {row['norm']:6.2f}  cos(x',x) {row['cos_to_source']:+.3f}  class-mean acc "
              f"{row['class_mean_accuracy']:.3f}  copy {row['copy']:.3f} common {row['common']:.3f} flip "
              f"{row['flip']:.3f}  residual median {row['residual_median']:.3f}", flush=True)
    real = {"cos_to_source": 1.0, "class_mean_accuracy": ((_unit(X) @ mu_hat.T).argmax(1) == Y).float().mean().item()}
    out["rows"]["real rows"] = real
    print(f"{'real rows':28s} class-mean acc {real['class_mean_accuracy']:.3f}")
    return out


class MimicAugmenter(Augmenter):
    """No geometry: each round a row is kept (probability ``keep``), replaced by the mean direction
    of every client's data (``common``; one D-vector per client up, one down) or by its negation
    (the rest); labels are kept. A client trains on these rows alone, one per real row, as under
    FedMC's Algorithm 1, so FedAvg stays the matched-compute control."""

    name = "mimic"
    defaults = {"keep": 1.0, "common": 0.0}

    def setup(self, clients, *, n_classes, seed):
        total = sum(c.x.sum(0) for c in clients)
        self.g_hat = total / total.norm()
        dim = clients[0].x.shape[1]
        self.setup_bytes = (4 * dim * len(clients), 4 * dim * len(clients))
        self.replaces_data = True

    def augment(self, cid, data: ClientData, *, generator):
        u = torch.rand(len(data.y), generator=generator, device=data.x.device)
        keep, common = self.p["keep"], self.p["common"]
        x = data.x.clone()
        x[(u >= keep) & (u < keep + common)] = self.g_hat.to(x.dtype)
        x[u >= keep + common] *= -1
        return x, data.y


def controls(args) -> None:
    if not (0 <= args.keep and 0 <= args.common and args.keep + args.common <= 1):
        raise SystemExit("--keep and --common must be >= 0 and sum to at most 1")
    augmenters.AUGMENTERS["mimic"] = MimicAugmenter
    methods = [MethodSpec("FedAvg"), MethodSpec("FedAvg+FedMC (fedmc-paper)", augmenter="fedmc", augmenter_params=PRESET)]
    if args.mimic_only:  # FedAvg stays: it is every row's paired baseline
        methods = methods[:1]
    methods.append(MethodSpec("FedAvg+mimic", augmenter="mimic", augmenter_params={"keep": args.keep, "common": args.common}))
    cfg = RunConfig(beta=args.beta, seeds=args.seeds, methods=methods)
    torch.set_num_threads(1)
    run(cfg, args.out, progress=False)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["geometry", "controls"])
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--round", type=int, default=3, help="geometry: the Algorithm-1 round whose samples are measured")
    ap.add_argument("--variants", help="geometry: comma-separated names of VARIANTS (default: all)")
    ap.add_argument("--keep", type=float, help="controls: mimic's probability of keeping a row")
    ap.add_argument("--common", type=float, help="controls: mimic's probability of the common point")
    ap.add_argument("--mimic-only", action="store_true", help="controls: FedAvg and mimic only (not the preset)")
    ap.add_argument("--seeds", type=int, default=3, help="controls: seeds 0 .. N-1")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.what == "geometry":
        Path(args.out).write_text(json.dumps(geometry(args), indent=1))
    else:
        if args.keep is None or args.common is None:
            sys.exit("controls needs --keep and --common (the fractions `geometry` measured for the preset)")
        controls(args)


if __name__ == "__main__":
    main()
