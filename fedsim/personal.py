"""The personalised run path: every client keeps its own model and is evaluated on its own test
split. Used when a run's methods are personalised algorithms (``local``, ``fedrep``, ``flic``) or
its dataset is a ``PersonalDataset`` (clients in their own feature spaces, ``toy:NAME``).

The rounds run in the one round loop (loop.run_rounds: client sampling, resume, checkpoints),
as runner's global-model methods do; what differs is the ``PersonalFederation`` here: the global
path trains *one* model on one feature space, which a client of dimension D_i cannot even run,
while here each client owns a ``PersonalNet`` (its own input dimension) and the algorithm decides
which parameters are averaged and within which group. The local update is the same
``client.local_train`` with the same hooks and the same (seed, round, client) streams, run once
per phase of FedRep's schedule. A checkpoint after every round holds every client's personal
weights, the groups' shared weights and the algorithm's state, so a resumed run equals an
uninterrupted one.

A homogeneous dataset (one file, one test set) becomes a PersonalDataset by the run's partition
of all its rows (train and test pooled), each client's rows then split 80/20 (seeded) into its
train and test split, as personalised FL benchmarks do (PFLlib).
"""
from __future__ import annotations

import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from . import _checkpoint
from ._seeds import TRAIN, generator
from .config import ConfigError
from .algorithms import build_algorithm, personal_algorithms
from .algorithms.base import ClientContext, ClientUpdate, make_optimizer
from .client import local_train
from .data import load_dataset
from .data.dataset import ClientSplit, PersonalDataset
from .data.partition import partition
from .data import mixed
from .data.toy import is_toy, load_toy
from .loop import Federation, run_rounds
from .models import PersonalNet


def is_personal_run(cfg) -> bool:
    """Whether ``cfg`` runs on this path; a mix it cannot run is an error naming the fix."""
    algos = {m.name: build_algorithm(m.algorithm, **m.algorithm_params) for m in cfg.methods}
    personal = {n for n, a in algos.items() if getattr(a, "personal", False)}
    spaces = is_toy(cfg.dataset) or mixed.is_mixed(cfg.dataset)  # clients in their own feature spaces
    if not personal and not spaces:
        return False
    if personal != set(algos):
        if spaces:
            why = f"dataset {cfg.dataset!r} puts clients in different feature spaces"
        else:
            why = f"methods {sorted(personal)} are personalised and cannot share a run with global-model methods"
        raise ValueError(f"config: {why}; methods {sorted(set(algos) - personal)} train one global model: "
                         f"use the personalised algorithms {personal_algorithms()}")
    bad = [m.name for m in cfg.methods if m.augmenter != "none"]
    if bad:
        raise ValueError(f"config: methods {bad} use an augmenter; augmenters work in one shared feature "
                         "space and are not available on the personalised path (augmenter='none')")
    if cfg.model != "personal" and (cfg.model != "linear" or cfg.model_params):
        raise ValueError(f"config: the personalised path trains model='personal' (PersonalNet: phi_i, "
                         f"representation, head), got model={cfg.model!r}; set model='personal' (--model personal) "
                         "to pass its model_params embed_dim, embed_hidden, hidden")
    return True


# fields the personalised path never reads (its clients keep their own rows and view; the
# partition fields only where the dataset is a toy, which generates its own clients): a value other
# than the default is refused (PersonalFederation.check), and results.json does not record them
_PERSONAL_UNUSED = {"feature_shift": "--feature-shift", "feature_noise": "--feature-noise",
                    "zero_shot": "--zero-shot"}
_TOY_UNUSED = {"partition": "--partition", "beta": "--beta", "min_size": "--min-size"}
# what a refused tuning request says first, on either path (runner.plan, PersonalFederation.check)
TUNING_NEEDS = ("config: tuning (--tune, --tune-lr, --tune-epochs) runs on the local engine and on global-model "
                "methods, which have validation rows;")


def personal_unused(cfg) -> dict:
    """RunConfig field -> flag, of the fields a personalised run of ``cfg`` never reads."""
    return {**_PERSONAL_UNUSED, **(_TOY_UNUSED if is_toy(cfg.dataset) else {})}


def personal_ignores(cfg) -> list[str]:
    """The flags of a personalised run set away from their defaults that it would ignore
    (val_fraction is not among them: its default, 0.1, is the global path's, and the report says
    the personalised path has no validation rows)."""
    default = {f.name: f.default for f in fields(cfg)}
    return [flag for f, flag in personal_unused(cfg).items() if getattr(cfg, f) != default[f]]


def personal_dataset(cfg, seed: int) -> PersonalDataset:
    """The run's clients for ``seed``: a toy problem generated from the seed, or a dataset file
    (train and test rows pooled) partitioned by the run's scheme, 80/20 per client."""
    if is_toy(cfg.dataset):
        return load_toy(cfg.dataset, n_clients=cfg.n_clients, seed=seed)
    if mixed.is_mixed(cfg.dataset):
        return _mixed_dataset(cfg, seed)
    ds = load_dataset(cfg.dataset)  # domain ids play no part: a client is evaluated on its own rows
    x = torch.cat([ds.x_train, ds.x_test])
    y = torch.cat([ds.y_train, ds.y_test])
    clients = [ClientSplit(x[tr], y[tr], x[te], y[te], n_classes=ds.n_classes)
               for tr, te in _client_rows(cfg, y, seed)]
    return PersonalDataset(name=ds.name, clients=clients, class_names=list(ds.class_names), meta=dict(ds.meta))


def _client_rows(cfg, y: torch.Tensor, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The run's partition of pooled rows with labels ``y``; each client's rows split 80/20
    (seeded) into (train, test) indices, both non-empty."""
    parts = partition(cfg.partition, labels=y, domains=None, n_clients=cfg.n_clients, beta=cfg.beta,
                      seed=seed, min_size=max(cfg.min_size, 2))
    out = []
    for cid, p in enumerate(parts):
        rng = np.random.default_rng([seed, cid, 0x5E1])
        p = torch.as_tensor(np.asarray(p))[torch.from_numpy(rng.permutation(len(p)))]
        k = min(len(p) - 1, max(1, int(round(0.8 * len(p)))))  # both splits non-empty
        out.append((p[:k], p[k:]))
    return out


def _mixed_dataset(cfg, seed: int) -> PersonalDataset:
    """``wordnet:mixed``: the rows split as for a homogeneous dataset; each client sees them in its
    representation (MiniLM or TF-IDF), through its own kept coordinates (fedsim/data/mixed.py)."""
    opts = mixed.options(cfg.dataset)
    minilm, tfidf = mixed.load_views()
    views = {name: torch.cat([v.x_train, v.x_test]).to(torch.float32) for name, v in
             (("minilm", minilm), ("tfidf", tfidf))}
    y = torch.cat([minilm.y_train, minilm.y_test])
    plan = mixed.client_views(cfg.n_clients, seed, dims={k: v.shape[1] for k, v in views.items()}, **opts)
    clients = []
    for (tr, te), (rep, cols, space) in zip(_client_rows(cfg, y, seed), plan):
        x = views[rep] if cols is None else views[rep][:, cols]
        clients.append(ClientSplit(x[tr], y[tr], x[te], y[te], n_classes=minilm.n_classes, space=space))
    meta = {"generator": "fedsim.data.mixed", "seed": seed, **opts,
            "clients": [{"representation": rep, "dim": c.dim, "space": space}
                        for (rep, _, space), c in zip(plan, clients)]}
    return PersonalDataset(name=cfg.dataset, clients=clients, class_names=list(minilm.class_names), meta=meta)


def _init_seed(seed: int, cid: int) -> int:
    return int(np.random.SeedSequence([seed, cid, 0x1417]).generate_state(1)[0])


def _train(algo, ctx: ClientContext, cfg, gen) -> ClientUpdate:
    """The algorithm's phases for this round (PersonalAlgorithm.phases; by default FedRep's
    schedule: the head alone, then everything else with the head frozen; in the final round its
    final_phases), each phase training its modules with the others frozen. One optimizer serves
    the round's phases, as the FLIC authors' client has one Adam per round (Het_Update.py). The
    phases train disjoint modules, and Adam and SGD (momentum, weight decay) leave a parameter
    without a gradient untouched, so this equals a fresh optimizer per phase bit for bit
    (tests/fedsim/test_personal.py)."""
    model = ctx.model
    phases = algo.final_phases(model) if ctx.round == cfg.rounds else algo.phases(ctx.round, cfg.local_epochs, model)
    opt = make_optimizer(model, algo.hp["optimizer"], lr=ctx.lr, momentum=cfg.momentum,
                         weight_decay=cfg.weight_decay)
    for phase in phases:
        if phase.epochs <= 0:
            continue
        train = {id(p) for m in phase.train for p in getattr(model, m).parameters()}
        for p in model.parameters():
            p.requires_grad_(id(p) in train)
        # the last phase's update (its weights hold every phase's steps) is what the client reports
        upd = local_train(algo, ctx, epochs=phase.epochs, batch_size=cfg.batch_size, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay, generator=gen, optimizer=opt)
    for p in model.parameters():
        p.requires_grad_(True)
    return upd


@torch.no_grad()
def _accuracy(model, x, y) -> float:
    model.eval()
    acc = float((model(x)[0].argmax(1) == y).to(torch.float64).mean())
    model.train()
    return acc


class PersonalFederation(Federation):
    """A model per client (PersonalNet: its own input dimension), the algorithm deciding which
    parameters are averaged and within which group; every client evaluated on its own test split
    after each round (loop.py runs the rounds)."""

    template = None  # per-client models differ in shape: restore checks them
    weights = ("personal", "shared")

    @staticmethod
    def check(cfg) -> None:
        """What a personalised run (``is_personal_run``) refuses, before anything is written
        (runner.plan calls it): tuning, the centralised row, and flags it would ignore."""
        if cfg.tune_lr or cfg.tune_epochs:
            raise ConfigError(f"{TUNING_NEEDS} the personalised path ({personal_algorithms()}, toy:NAME) has none: "
                              "drop the tuning flags")
        if cfg.centralised:
            raise ConfigError("config: centralised (--centralised) is the one-client ceiling of a global model; "
                              f"personalised runs ({personal_algorithms()}, toy:NAME datasets) have no such row")
        if ignored := personal_ignores(cfg):
            raise ConfigError(f"config: {', '.join(ignored)} play(s) no part on the personalised path "
                              f"({personal_algorithms()}, toy:NAME datasets: each client keeps its own rows and view"
                              + ("; a toy dataset generates its own clients" if is_toy(cfg.dataset) else "")
                              + "): drop them")

    def __init__(self, cfg, spec, seed: int, ds: PersonalDataset, run_dir: Path):
        dev = torch.device(cfg.device)
        self.cfg, self.spec, self.seed, self.ds = cfg, spec, seed, ds
        mp = cfg.model_params if cfg.model == "personal" else {}  # "linear": the default, PersonalNet's defaults
        self.algo = algo = build_algorithm(spec.algorithm, **spec.algorithm_params)
        algo.seed = seed
        self.n_clients = len(ds.clients)
        self.data = [ClientSplit(*(t.to(dev) for t in (c.x_train, c.y_train, c.x_test, c.y_test)), c.n_classes,
                                 c.space) for c in ds.clients]
        self.models = []
        for cid, c in enumerate(self.data):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(_init_seed(seed, cid))
                self.models.append(PersonalNet(c.dim, ds.n_classes, **mp).to(dev))
        embed_dim = self.models[0].embed[-1].out_features
        self.group = [algo.group(cid, c.space) for cid, c in enumerate(self.data)]
        # a client alone in its group (FedRep: the only client of its feature space) has nobody to
        # average with: its shared part never leaves it, so nothing is counted (the server-side
        # "average" of its one update is the update itself, computed as for any group)
        self.alone = {g for g in self.group if self.group.count(g) == 1}
        self.personal = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in self.models]
        self.shared: dict[str, dict] = {}
        for cid, g in enumerate(self.group):  # a group's shared weights start as its first member's
            self.shared.setdefault(g, {k: v for k, v in self.personal[cid].items() if algo.shares(k)})
        algo.setup(n_classes=ds.n_classes, embed_dim=embed_dim, seed=seed, device=dev)
        self.run_dir = run_dir
        self.final_round = algo.hp["final_epochs"] > 0

    def restore(self, state):
        personal, shared = state["personal"], state["shared"]
        if len(personal) != self.n_clients or any(
                set(personal[cid]) | set(shared.get(self.group[cid], {})) != set(self.models[cid].state_dict())
                for cid in range(self.n_clients)):
            raise _checkpoint.CheckpointError(
                f"cannot resume from {self.run_dir / 'checkpoint.pt'}: its per-client weights do not fit this run's "
                f"{self.n_clients} client models; delete the folder {self.run_dir} to redo {self.spec.name} seed "
                f"{self.seed} from round 1")
        self.personal, self.shared = personal, shared
        self.algo.load_state_dict(state["algorithm"])

    def _load(self, cid):
        self.models[cid].load_state_dict({**self.personal[cid], **self.shared[self.group[cid]]})
        return self.models[cid]

    def round(self, r, selected):
        cfg, algo, group = self.cfg, self.algo, self.group
        regular = r < cfg.rounds  # the final round (r == cfg.rounds) trains no shared part: nothing sent or averaged
        by_group: dict[str, list] = {}
        up, down, losses, t0 = 0, 0, [], time.perf_counter()
        for cid in selected:
            c, model = self.data[cid], self._load(cid)
            g = self.shared[group[cid]]
            ctx = ClientContext(cid=cid, round=r, model=model, global_params={k: v.clone() for k, v in g.items()},
                                x=c.x_train, y=c.y_train, n_real=c.x_train.shape[0], n_classes=self.ds.n_classes,
                                lr=cfg.lr)
            upd = _train(algo, ctx, cfg, generator(self.seed, r, cid, TRAIN))
            self.personal[cid] = {k: v for k, v in upd.params.items() if not algo.shares(k)}
            sent = ClientUpdate(cid, {k: v for k, v in upd.params.items() if algo.shares(k)}, upd.n_samples,
                                upd.loss, upd.extras)
            by_group.setdefault(group[cid], []).append(sent)
            losses.append(upd.loss)
            if (sent.params or sent.extras) and group[cid] not in self.alone and regular:
                up += sent.upload_bytes()
                down += algo.download_bytes(g)
        for gname, ups in by_group.items():
            if (ups[0].params or ups[0].extras) and regular:
                self.shared[gname] = algo.aggregate(self.shared[gname], ups, n_clients=group.count(gname))
        client_acc = [_accuracy(self._load(cid), c.x_test, c.y_test) for cid, c in enumerate(self.data)]
        entry = {"accuracy": float(np.mean(client_acc)), "client_accuracy": client_acc,
                 "train_loss": float(np.mean(losses)), "bytes_up": up, "bytes_down": down}
        return entry, {"train_s": time.perf_counter() - t0, "geometry_s": 0.0}

    def state(self):
        return {"personal": self.personal, "shared": self.shared, "algorithm": self.algo.state_dict()}


def run_personal_method(cfg, spec, seed: int, ds: PersonalDataset, run_dir: Path, *,
                        progress: bool = True) -> tuple[dict, dict]:
    """``spec`` for cfg.rounds rounds through loop.run_rounds; checkpoints verified like the global
    path's (format, configuration, and the dataset's checksum: a toy problem or wordnet:mixed
    regenerated differently, or another dataset file, is refused). Returns (metrics, timings)."""
    fed = PersonalFederation(cfg, spec, seed, ds, run_dir)
    history, timings = run_rounds(fed, cfg, spec, seed, run_dir,
                                  fingerprint=_checkpoint.fingerprint(cfg, spec.name, seed),
                                  dataset_sum=_checkpoint.dataset_checksum(ds), device=torch.device(cfg.device),
                                  progress=progress)
    return {**_metrics(history), **fed.algo.run_report()}, timings


def _metrics(history: list[dict]) -> dict:
    """final_accuracy: after the last entry (the final round where there is one); last5_mean: over
    the last 5 regular rounds."""
    accs = [h["accuracy"] for h in history]
    regular = [h["accuracy"] for h in history if not h.get("final")]
    last = history[-1]["client_accuracy"]
    return {"final_accuracy": accs[-1], "last5_mean": float(np.mean(regular[-5:])), "accuracy": accs,
            "client_accuracy": last, "client_accuracy_std": float(np.std(last)),
            "train_loss": [h["train_loss"] for h in history],
            "bytes_up": int(sum(h["bytes_up"] for h in history)),
            "bytes_down": int(sum(h["bytes_down"] for h in history))}
