"""fedsim's Flower ClientApp: one SuperNode = one fedsim client (its ``partition-id``).

Every message carries the run (``codec.job``); the node loads the dataset the run names and keeps
its own partition (the same ``partition`` call with the same seed as the local engine). The round
itself is ``runner.client_round``, the function the local engine calls, with the algorithm's
client hooks and the augmenter's ``augment``. What the client keeps between messages lives in
``context.state`` (Flower's per-node state), keyed by method and seed:

  ``<key>.algo``      this client's own algorithm state (SCAFFOLD's c_i, FedDyn's grad_i, MOON's
                      previous model): the ``<slot>/<cid>/<param>`` entries of ``state_dict``
  ``<key>.geometry``  the geometry the server sent (safetensors bytes, checked again when read)
  ``<key>.ggeur``     GGEUR: what the client keeps of the global geometry (``_kept_geometry``: the
                      eigenvectors of the classes it samples only; checked again when read)
  ``<key>.setup``     FedMC: the state of the client's set-up generator between its two releases

Message types: ``query.hello`` (partition id), ``query.upload`` (the augmenter's upload: GGEUR
statistics or FedMC prototypes), ``query.lgd`` (FedMC: the GAB down, the client's LGD up; under
``protocol="algorithm1"`` once per round, the round's LGD on the GAB the client kept),
``query.geometry`` (the result down; algorithm1: the GAB), ``train`` (one round; algorithm1: with
the dictionary D_{r-1} from round 2 on) and ``evaluate`` (the global model on the client's own rows).
"""
from __future__ import annotations

import functools
import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from geomkern import fedmc, ggeur

from .. import runner
from .._seeds import SETUP, generator
from ..algorithms import build_algorithm
from ..augmenters import _DP_ITERS, build_augmenter
from ..client import DivergedError
from ..data import load_dataset
from ..models import build_model
from . import codec


@functools.lru_cache(maxsize=4)
def _config(cfg_json: str) -> runner.RunConfig:
    return runner.RunConfig.from_dict(json.loads(cfg_json)).validate()


@functools.lru_cache(maxsize=2)
def _dataset(name: str):
    return load_dataset(name)


@functools.lru_cache(maxsize=8)
def _my_data(cfg_json: str, seed: int, cid: int):
    """This node's ClientData for (run, seed): what the local engine gives client ``cid``."""
    cfg = _config(cfg_json)
    ds = _dataset(cfg.dataset)
    clients, _ = runner.client_data(cfg, ds, runner.make_partition(cfg, ds, seed), seed)
    return clients[cid], ds


def _cid(context: Context, cfg) -> int:
    pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    if n != cfg.n_clients or not 0 <= pid < n:
        raise ValueError(f"this SuperNode is partition-id={pid} of num-partitions={n}, but the run has "
                         f"n_clients={cfg.n_clients}: start one SuperNode per client with "
                         f"--node-config 'partition-id=<0..{cfg.n_clients - 1}> num-partitions={cfg.n_clients}'")
    return pid


def _unpack(msg: Message, context: Context):
    cfg_json, m, seed, r = codec.read_job(msg.content)
    cfg = _config(cfg_json)
    spec = cfg.methods[m]
    cid = _cid(context, cfg)
    data, ds = _my_data(cfg_json, seed, cid)
    return cfg, spec, seed, r, cid, data, ds, f"{m}.{seed}"


def _reply(msg: Message, **records) -> Message:
    return Message(RecordDict(records), reply_to=msg)


app = ClientApp()


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    cfg = _config(codec.read_job(msg.content)[0])
    return _reply(msg, hello=ConfigRecord({"cid": _cid(context, cfg)}))


@app.query("upload")
def upload(msg: Message, context: Context) -> Message:
    """The augmenter's upload: GGEUR class statistics (+ domains), FedMC's released prototypes."""
    cfg, spec, seed, _, cid, data, ds, key = _unpack(msg, context)
    aug = _augmenter(cfg, spec)
    out = {}
    if spec.augmenter == "ggeur":
        u = aug.upload(data, ds.n_classes)
        out["stats"] = u["stats"].to_bytes()
        if u["domains"] is not None:
            out["domains"] = [int(d) for d in u["domains"]]
        for i, s in enumerate(u["per_domain"] or []):
            out[f"domain{i}"] = s.to_bytes()
    elif spec.augmenter == "fedmc" and data.x.shape[0]:  # a client without rows releases nothing
        p = aug.p
        gen = generator(seed, 0, cid, SETUP)  # the run's one derivation (as FedMCAugmenter.setup)
        pr = fedmc.setup_client_prototypes(data.x, gen, n_prototypes=p["n_prototypes"], epsilon=aug.release_epsilon(),
                                           delta=p["delta"], clip_norm=p["clip_norm"], iters=_DP_ITERS)
        context.state[f"{key}.setup"] = ArrayRecord({"generator": gen.get_state()})
        out["prototypes"] = fedmc.PrototypeRelease(*pr).to_bytes()
    return _reply(msg, upload=ConfigRecord(out))


@app.query("lgd")
def lgd(msg: Message, context: Context) -> Message:
    """FedMC step 3: the GAB and gamma down, this client's LGD up (its set-up generator goes on
    from where its prototype release left it, as in fedmc.setup)."""
    cfg, spec, seed, r, cid, data, ds, key = _unpack(msg, context)
    aug = _augmenter(cfg, spec)
    p = aug.p
    if p["protocol"] == "algorithm1":  # round r's LGD on the GAB kept from query.geometry (none without rows)
        kept = context.state.config_records[f"{key}.geometry"]
        B = fedmc.GAB.from_bytes(kept["gab"], source="the server's GAB").basis.to(data.x.device)
        aug.receive_round(B, float(kept["gamma"]), None, n_classes=ds.n_classes, seed=seed)
        g = aug.round_lgd(cid, data.x, r)
        return _reply(msg, upload=ConfigRecord({} if g is None else {"lgd": g.to_bytes()}))
    down = msg.content.config_records["gab"]
    B = fedmc.GAB.from_bytes(down["gab"], source="the server's GAB").basis.to(data.x.device)
    gen = torch.Generator()
    gen.set_state(codec.tensors(context.state.array_records[f"{key}.setup"])["generator"])
    g = fedmc.setup_client_geometry(data.x, B, float(down["gamma"]), gen, n_clusters=p["n_clusters"],
                                    n_components=p["n_components"], epsilon=aug.release_epsilon(), delta=p["delta"],
                                    clip_norm=p["clip_norm"], iters=_DP_ITERS)
    del context.state[f"{key}.setup"]
    return _reply(msg, upload=ConfigRecord({"lgd": g.to_bytes()}))


@app.query("geometry")
def geometry(msg: Message, context: Context) -> Message:
    """The exchange's result down: checked here (from_bytes), kept in context.state."""
    cfg, spec, seed, _, cid, data, ds, key = _unpack(msg, context)
    down = msg.content.config_records["geometry"]
    aug = _client_augmenter(cfg, spec, down, seed, cid, ds.n_classes, msg.content.array_records.get("others"))
    if spec.augmenter == "ggeur":  # the eigenbases of the classes this client samples, not all C of them
        context.state[f"{key}.ggeur"] = _kept_geometry(aug, cid, data)
    else:
        context.state[f"{key}.geometry"] = down
    if "others" in msg.content.array_records:
        context.state[f"{key}.others"] = msg.content.array_records["others"]
    return _reply(msg, ack=ConfigRecord({"ok": True}))


def _kept_geometry(aug, cid: int, data) -> ArrayRecord:
    """What a GGEUR client keeps of the global geometry between rounds: every class's count, mean
    and eigenvalues, and the eigenvectors of the classes it samples only (its rows' classes and, in
    the multi-domain step, its prototypes' labels). ggeur.augment reads no other class, so the
    draws are the same bit for bit, and a node keeps held/C of the C x D x D eigenbasis."""
    g = aug.geometry
    labels = [data.y] + ([aug.others[cid][1]] if aug.use_protos else [])
    classes = torch.unique(torch.cat([y.to(g.counts.device, torch.int64) for y in labels]))
    return codec.arrays({"counts": g.counts, "means": g.means, "eigenvalues": g.eigenvalues, "classes": classes,
                         "eigenvectors": g.eigenvectors[classes]})


def _geometry_from(kept: ArrayRecord) -> ggeur.GlobalGeometry:
    """The GlobalGeometry ``_kept_geometry`` kept, with the other classes' counts and eigenvectors
    zero (checked again on construction, as from_bytes checks the geometry on receipt)."""
    t = codec.tensors(kept)
    classes, means, ev = t["classes"], t["means"], t["eigenvalues"]
    counts = torch.zeros_like(t["counts"])
    counts[classes] = t["counts"][classes]
    V = means.new_zeros(means.shape[0], means.shape[1], ev.shape[1])
    V[classes] = t["eigenvectors"]
    return ggeur.GlobalGeometry(counts, means, ev, V)


def _augmenter(cfg, spec):
    aug = build_augmenter(spec.augmenter, **spec.augmenter_params)
    aug.rounds = cfg.rounds  # as the round loop sets it (FedMC algorithm1 budgets over the rounds)
    return aug


def _client_augmenter(cfg, spec, down: ConfigRecord | None, seed: int, cid: int, n_classes: int,
                      others: ArrayRecord | None = None, round_dictionary: ConfigRecord | None = None):
    """This client's augmenter after the exchange: the same ``augment`` as in the local engine.
    ``round_dictionary``: FedMC algorithm1's D_{r-1}, sent with the train message (None in round 1)."""
    aug = _augmenter(cfg, spec)
    if spec.augmenter == "ggeur":
        geo = (_geometry_from(down) if isinstance(down, ArrayRecord)
               else ggeur.GlobalGeometry.from_bytes(down["geometry"], source="the server's GGEUR geometry"))
        o = codec.tensors(others)
        aug.receive(cid, geo, (o["prototypes"], o["labels"]) if o else None, seed=seed)
    elif spec.augmenter == "fedmc":
        B = fedmc.GAB.from_bytes(down["gab"], source="the server's GAB").basis
        if aug.p["protocol"] == "algorithm1":
            d = None if round_dictionary is None else fedmc.GeometryDictionary.from_bytes(
                round_dictionary["dictionary"], source="the server's FedMC dictionary of the previous round")
            aug.receive_round(B, float(down["gamma"]), d, n_classes=n_classes, seed=seed)
            return aug
        dictionary = fedmc.GeometryDictionary.from_bytes(down["dictionary"], source="the server's FedMC dictionary")
        aug.receive(B, float(down["gamma"]), dictionary, n_classes=n_classes)
    else:  # nothing exchanged (none, oversample): set up on this client's rows alone
        aug.setup([], n_classes=n_classes, seed=seed)
    return aug


def _model(cfg, ds):
    with torch.random.fork_rng(devices=[]):  # the architecture only: the weights come in the message
        return build_model(cfg.model, ds.dim, ds.n_classes, class_names=ds.class_names,
                           **cfg.model_params).to(cfg.device)


def _own_state(state: dict, cid: int) -> dict:
    """The entries of an algorithm's state_dict that are client ``cid``'s own (``<slot>/<cid>/<param>``)."""
    return {k: v for k, v in state.items() if k.count("/") == 2 and k.split("/")[1] == str(cid)}


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg, spec, seed, r, cid, data, ds, key = _unpack(msg, context)
    dev = torch.device(cfg.device)
    algo = build_algorithm(spec.algorithm, **spec.algorithm_params)
    algo.seed = seed
    state = codec.tensors(msg.content.array_records.get("algo"), device=dev)
    if f"{key}.algo" in context.state.array_records:
        state.update(codec.tensors(context.state.array_records[f"{key}.algo"], device=dev))
    algo.load_state_dict(state)
    kept = context.state.array_records.get(f"{key}.ggeur")  # GGEUR: _kept_geometry; else the exchange's records
    down = kept if kept is not None else context.state.config_records.get(f"{key}.geometry")
    aug = _client_augmenter(cfg, spec, down, seed, cid, ds.n_classes,
                            context.state.array_records.get(f"{key}.others"),
                            msg.content.config_records.get("dictionary"))
    global_params = codec.tensors(msg.content.array_records["global"], device=dev)
    try:
        upd, t_geom, t_train = runner.client_round(cfg, algo, aug, _model(cfg, ds), global_params, data,
                                                   seed=seed, round=r, cid=cid, n_classes=ds.n_classes)
    except DivergedError as exc:  # the server names the client and the likely cause
        return _reply(msg, diverged=ConfigRecord({"what": str(exc)}))
    context.state[f"{key}.algo"] = codec.arrays(_own_state(algo.state_dict(), cid))
    return _reply(msg, params=codec.arrays(upd.params), extras=codec.arrays(upd.extras),
                  metrics=MetricRecord({"n_samples": upd.n_samples, "loss": upd.loss, "t_geom": t_geom,
                                        "t_train": t_train}))


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The global model's accuracy on this client's own training rows (federated evaluation)."""
    cfg, spec, seed, r, cid, data, ds, key = _unpack(msg, context)
    model = _model(cfg, ds)
    model.load_state_dict(codec.tensors(msg.content.array_records["global"], device=torch.device(cfg.device)))
    n = int(data.x.shape[0])
    acc = runner.evaluate(model, data.x, data.y)[0] if n else 0.0
    return _reply(msg, metrics=MetricRecord({"accuracy": acc, "n": n}))
