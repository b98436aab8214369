"""fedsim's Flower ClientApp: one SuperNode = one fedsim client (its ``partition-id``).

Every message carries the run (``codec.job``); the node loads the dataset the run names and keeps
its own partition (the same ``partition`` call with the same seed as the local engine). The round
itself is ``client.client_round``, the function the local engine calls, with the algorithm's
client hooks and the augmenter's ``augment``; the exchange is the augmenter's client hooks
(``upload``, ``download``), whatever the augmenter. What the client keeps between messages lives in
``context.state`` (Flower's per-node state), keyed by method and seed:

  ``<key>.algo``  this client's own algorithm state (SCAFFOLD's c_i, FedDyn's grad_i, MOON's
                  previous model): the ``<slot>/<cid>/<param>`` entries of ``state_dict``
  ``<key>.aug``   its augmenter's ``client_state`` (codec.put: containers checked again when read;
                  GGEUR keeps the eigenvectors of the classes it samples only, FedMC its GAB and
                  dictionary, and its set-up generator between its two releases)

Message types: ``query.hello`` (partition id), ``query.upload`` (one exchange step's upload),
``query.download`` (that step's result for this client), ``train`` (one round) and ``evaluate``
(the global model on the client's own rows).
"""
from __future__ import annotations

import functools
import json

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ..algorithms import build_algorithm
from ..augmenters import build_augmenter
from ..client import DivergedError, client_round
from ..config import RunConfig
from ..data import load_dataset
from ..data.clients import client_data, make_partition
from ..metrics import evaluate as evaluate_model
from ..models import build_model
from ..plugins import validate
from . import codec
from .exchange import answer, client_augmenter


@functools.lru_cache(maxsize=4)
def _config(cfg_json: str) -> RunConfig:
    return validate(RunConfig.from_dict(json.loads(cfg_json)))


@functools.lru_cache(maxsize=2)
def _dataset(name: str):
    return load_dataset(name)


@functools.lru_cache(maxsize=8)
def _my_data(cfg_json: str, seed: int, cid: int):
    """This node's ClientData for (run, seed): what the local engine gives client ``cid``."""
    cfg = _config(cfg_json)
    ds = _dataset(cfg.dataset)
    clients, _ = client_data(cfg, ds, make_partition(cfg, ds, seed), seed)
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


def _augmenter(cfg, spec, seed: int, data, ds):
    aug = build_augmenter(spec.augmenter, **spec.augmenter_params)
    aug.rounds = cfg.rounds  # as the round loop sets it (FedMC algorithm1 budgets over the rounds)
    aug.bind(n_classes=ds.n_classes, seed=seed, dim=ds.dim, dtype=data.x.dtype)
    return aug


@app.query("upload")
@app.query("download")
def exchange(msg: Message, context: Context) -> Message:
    """One exchange step: the augmenter's upload (nothing from a client that sends none), or its
    download (checked by codec.take: each container's from_bytes), kept in context.state."""
    cfg, spec, seed, _, cid, data, ds, key = _unpack(msg, context)
    return answer(msg, context, _augmenter(cfg, spec, seed, data, ds), cid, data, f"{key}.aug")


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
    aug = client_augmenter(_augmenter(cfg, spec, seed, data, ds), cid, data, context, f"{key}.aug")
    global_params = codec.tensors(msg.content.array_records["global"], device=dev)
    try:
        upd, t_geom, t_train = client_round(cfg, algo, aug, _model(cfg, ds), global_params, data,
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
    acc = evaluate_model(model, data.x, data.y)[0] if n else 0.0
    return _reply(msg, metrics=MetricRecord({"accuracy": acc, "n": n}))
