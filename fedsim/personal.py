"""The personalised run path: every client keeps its own model and is evaluated on its own test
split. Used when a run's methods are personalised algorithms (``local``, ``fedrep``, ``flic``) or
its dataset is a ``PersonalDataset`` (clients in their own feature spaces, ``toy:NAME``).

Why a second path beside runner.run_method rather than a flag inside it: that loop trains and
evaluates *one* global model on one feature space, which a client of dimension D_i cannot even
run; here each client owns a ``PersonalNet`` (its own input dimension) and the algorithm decides
which parameters are averaged and within which group. The local update is the same
``client.local_train`` with the same hooks and the same (seed, round, client) streams, run once
per phase of FedRep's schedule; client sampling is runner's formula. Resume: a checkpoint per
(method, seed) after every round holds every client's personal weights, the groups' shared
weights and the algorithm's state, so a resumed run equals an uninterrupted one.

A homogeneous dataset (one file, one test set) becomes a PersonalDataset by the run's partition
of all its rows (train and test pooled), each client's rows then split 80/20 (seeded) into its
train and test split, as personalised FL benchmarks do (PFLlib).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from . import _checkpoint
from ._progress import progress_bar
from ._seeds import TRAIN, generator
from .algorithms import build_algorithm
from .algorithms.base import ClientContext, ClientUpdate
from .client import local_train
from .data import load_dataset
from .data.dataset import ClientSplit, PersonalDataset
from .data.partition import partition
from .data import mixed
from .data.toy import is_toy, load_toy
from .models import PersonalNet
from .runner import results_config, slug, write_config_json

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
                         "use the personalised algorithms local, fedrep, flic")
    bad = [m.name for m in cfg.methods if m.augmenter != "none"]
    if bad:
        raise ValueError(f"config: methods {bad} use an augmenter; augmenters work in one shared feature "
                         "space and are not available on the personalised path (augmenter='none')")
    if cfg.model != "personal" and (cfg.model != "linear" or cfg.model_params):
        raise ValueError(f"config: the personalised path trains model='personal' (PersonalNet: phi_i, "
                         f"representation, head), got model={cfg.model!r}; set model='personal' (--model personal) "
                         "to pass its model_params embed_dim, embed_hidden, hidden")
    return True


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
    """FedRep's schedule: the head alone, then everything else with the head frozen."""
    model = ctx.model
    head = {id(p) for p in model.head.parameters()}
    for train_head, epochs in ((True, algo.hp["head_epochs"]), (False, cfg.local_epochs)):
        if epochs <= 0:
            continue
        for p in model.parameters():
            p.requires_grad_((id(p) in head) == train_head)
        # the last phase's update (its weights hold both phases' steps) is what the client reports
        upd = local_train(algo, ctx, epochs=epochs, batch_size=cfg.batch_size, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay, generator=gen, optimizer=algo.hp["optimizer"])
    for p in model.parameters():
        p.requires_grad_(True)
    return upd


@torch.no_grad()
def _accuracy(model, x, y) -> float:
    model.eval()
    acc = float((model(x)[0].argmax(1) == y).to(torch.float64).mean())
    model.train()
    return acc


def run_personal_method(cfg, spec, seed: int, ds: PersonalDataset, run_dir: Path, *,
                        progress: bool = True) -> tuple[dict, dict]:
    t_start = time.perf_counter()
    dev = torch.device(cfg.device)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / "checkpoint.pt"
    mp = cfg.model_params if cfg.model == "personal" else {}  # "linear": the default, PersonalNet's defaults
    algo = build_algorithm(spec.algorithm, **spec.algorithm_params)
    algo.seed = seed
    K = len(ds.clients)
    data = [ClientSplit(*(t.to(dev) for t in (c.x_train, c.y_train, c.x_test, c.y_test)), c.n_classes, c.space)
            for c in ds.clients]
    models = []
    for cid, c in enumerate(data):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_init_seed(seed, cid))
            models.append(PersonalNet(c.dim, ds.n_classes, **mp).to(dev))
    embed_dim = models[0].embed[-1].out_features
    group = [algo.group(cid, c.space) for cid, c in enumerate(data)]
    # a client alone in its group (FedRep: the only client of its feature space) has nobody to
    # average with: its shared part never leaves it, so nothing is counted (the server-side
    # "average" of its one update is the update itself, computed as for any group)
    alone = {g for g in group if group.count(g) == 1}
    personal = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
    shared: dict[str, dict] = {}
    for cid, g in enumerate(group):  # a group's shared weights start as its first member's
        shared.setdefault(g, {k: v for k, v in personal[cid].items() if algo.shares(k)})
    algo.setup(n_classes=ds.n_classes, embed_dim=embed_dim, seed=seed, device=dev)
    history, timings, start = [], {"rounds": []}, 0
    # verified like the global path's checkpoints: format, configuration, and the dataset's checksum
    # (a toy problem or wordnet:mixed regenerated differently, or another dataset file, is refused)
    fingerprint = _checkpoint.fingerprint(cfg, spec.name, seed)
    dataset_sum = _checkpoint.dataset_checksum(ds)
    if ckpt.is_file():
        state = _checkpoint.load(ckpt, fingerprint=fingerprint, dataset=dataset_sum, template=None,
                                 rounds=cfg.rounds, device=dev, weights=("personal", "shared"),
                                 redo=f"delete the folder {run_dir} to redo {spec.name} seed {seed} from round 1, "
                                      "or start the whole run again with another --out")
        start, personal, shared = state["round"], state["personal"], state["shared"]
        if len(personal) != K or any(
                set(personal[cid]) | set(shared.get(group[cid], {})) != set(models[cid].state_dict())
                for cid in range(K)):
            raise _checkpoint.CheckpointError(
                f"cannot resume from {ckpt}: its per-client weights do not fit this run's {K} client models; "
                f"delete the folder {run_dir} to redo {spec.name} seed {seed} from round 1")
        history, timings = state["history"], state["timings"]
        algo.load_state_dict(state["algorithm"])
    # wall_s as in runner.run_method: summed over the sessions that ran this (method, seed), each up to
    # its last checkpoint; a resume that finds it finished runs no round and leaves it as recorded
    wall_before = timings.get("wall_s", 0.0)

    def load(cid):
        models[cid].load_state_dict({**personal[cid], **shared[group[cid]]})
        return models[cid]

    n_sel = max(1, int(round(cfg.client_fraction * K)))
    rounds = progress_bar(range(start, cfg.rounds), desc=f"{spec.name} seed {seed}", unit="round",
                          initial=start, total=cfg.rounds, enabled=progress)
    for r in rounds:
        rng = np.random.default_rng([seed, r, 17])  # runner's client sampling
        selected = sorted(rng.choice(K, n_sel, replace=False).tolist())
        by_group: dict[str, list] = {}
        up, down, losses, t0 = 0, 0, [], time.perf_counter()
        for cid in selected:
            c, model = data[cid], load(cid)
            g = shared[group[cid]]
            ctx = ClientContext(cid=cid, round=r, model=model, global_params={k: v.clone() for k, v in g.items()},
                                x=c.x_train, y=c.y_train, n_real=c.x_train.shape[0], n_classes=ds.n_classes,
                                lr=cfg.lr)
            upd = _train(algo, ctx, cfg, generator(seed, r, cid, TRAIN))
            personal[cid] = {k: v for k, v in upd.params.items() if not algo.shares(k)}
            sent = ClientUpdate(cid, {k: v for k, v in upd.params.items() if algo.shares(k)}, upd.n_samples,
                                upd.loss, upd.extras)
            by_group.setdefault(group[cid], []).append(sent)
            losses.append(upd.loss)
            if (sent.params or sent.extras) and group[cid] not in alone:
                up += sent.upload_bytes()
                down += algo.download_bytes(g)
        for gname, ups in by_group.items():
            if ups[0].params or ups[0].extras:
                shared[gname] = algo.aggregate(shared[gname], ups, n_clients=group.count(gname))
        client_acc = [_accuracy(load(cid), c.x_test, c.y_test) for cid, c in enumerate(data)]
        history.append({"round": r + 1, "accuracy": float(np.mean(client_acc)), "client_accuracy": client_acc,
                        "train_loss": float(np.mean(losses)), "bytes_up": up, "bytes_down": down})
        timings["rounds"].append({"round": r + 1, "train_s": time.perf_counter() - t0, "geometry_s": 0.0})
        timings["wall_s"] = wall_before + (time.perf_counter() - t_start)
        _checkpoint.save(ckpt, {"round": r + 1, "personal": personal, "shared": shared,
                                "algorithm": algo.state_dict(), "history": history, "timings": timings},
                         fingerprint=fingerprint, dataset=dataset_sum)
        rounds.set_postfix(acc=f"{history[-1]['accuracy']:.3f}")
    rounds.close()
    return {**_metrics(history), **algo.run_report()}, timings


def _metrics(history: list[dict]) -> dict:
    accs = [h["accuracy"] for h in history]
    last = history[-1]["client_accuracy"]
    return {"final_accuracy": accs[-1], "last5_mean": float(np.mean(accs[-5:])), "accuracy": accs,
            "client_accuracy": last, "client_accuracy_std": float(np.std(last)),
            "train_loss": [h["train_loss"] for h in history],
            "bytes_up": int(sum(h["bytes_up"] for h in history)),
            "bytes_down": int(sum(h["bytes_down"] for h in history))}


def run_personal(cfg, out: Path, *, resume: bool = False, progress: bool = True) -> dict:
    """runner.run for personalised methods (called by it after the config checks)."""
    from . import report

    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    datasets = {s: personal_dataset(cfg, s) for s in seeds}  # before writing anything
    out.mkdir(parents=True, exist_ok=True)
    # again on resume: it may have raised rounds; personalised runs run on the local engine only
    # (flower.server_app.check_supported refuses them)
    write_config_json(cfg, out, "local")
    first = datasets[seeds[0]]
    results = {"config": results_config(cfg), "dataset": first.summary(), "personalised": True, "methods": {}}
    timings = {}
    for spec in cfg.methods:
        per_seed, tim = {}, {}
        for s in seeds:
            per_seed[str(s)], tim[str(s)] = run_personal_method(
                cfg, spec, s, datasets[s], out / "runs" / f"{slug(spec.name)}-seed{s}", progress=progress)
        results["methods"][spec.name] = {"algorithm": spec.algorithm, "augmenter": spec.augmenter,
                                         "seeds": per_seed, "summary": report.summarise(per_seed)}
        timings[spec.name] = tim
    report.write_outputs(results, timings, first, first.parts, out)
    return results
