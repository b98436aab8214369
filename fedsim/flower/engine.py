"""fedsim's clients on a Flower Grid: ``FlowerEngine``, an engine.Engine below the runner.

``runner.run`` is the one run of both engines (loop.run_rounds: client sampling from (seed,
round), aggregation through the algorithm's server hook, evaluation, checkpoints and metrics).
Handed ``FlowerEngine(grid)``, its client-side steps go through Flower messages instead of
function calls: the augmenter's exchange (``FlowerEngine.exchange``, i.e.
exchange.serve_exchange: for each of the augmenter's steps, ``query.upload`` to the clients
taking part, the augmenter's ``accept`` and ``aggregate`` here, ``query.download`` with what goes
back) and the selected clients' local rounds (``FlowerEngine.train``), answered by
``client_app.app``. Nothing here knows an augmenter by name: the exchange is the augmenter's hooks
(fedsim/augmenters/). Server state (SCAFFOLD's c, FedDyn's h, FedOpt's moments, FedProto's
prototypes) stays in the server's algorithm object, i.e. in the ServerApp; what a client reads of
it (``Algorithm.download_state``) goes down with the weights.

Failures are Flower's: a client that does not answer within ``round_timeout`` seconds, answers
with an error, or uploads something that fails its checks is left out of that step with a logged
reason (a round needs at least one client); a client whose training diverges stops the run with
the local engine's message.

This module imports nothing of the runner: the runner is handed the engine. The apps that hand it
over (``run_simulation``, the deployed ServerApp) are fedsim/flower/apps.py, above the runner.
"""

from __future__ import annotations

import logging
import time

import torch
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from ..algorithms import ALGORITHMS
from ..algorithms.base import ClientUpdate
from ..client import DivergedError
from ..engine import Engine
from . import codec
from .exchange import serve_exchange

log = logging.getLogger("fedsim.flower")
ROUND_TIMEOUT = 600.0  # seconds a step waits for its replies


def check_supported(cfg) -> None:
    """The configurations the Flower engine runs (everything else is refused by name)."""
    for m in cfg.methods:
        algo = ALGORITHMS[m.algorithm.lower()]
        if getattr(algo, "personal", False) or getattr(algo, "needs_trunk", False):
            raise ValueError(f"--engine flower: methods[{m.name}] uses algorithm {m.algorithm!r}; the Flower engine "
                             "runs the global-model algorithms (fedavg, fedprox, scaffold, moon, feddyn, fedopt/"
                             "fedadam/fedyogi/fedavgm, fedntd, fedproto)")


class FlowerEngine(Engine):
    """The clients of ``runner.run`` on a Flower Grid (one SuperNode per client)."""

    name = "flower"
    resumable = False  # the clients' state lives in the SuperNodes of one run
    tunes = False

    def __init__(self, grid: Grid, *, round_timeout: float = ROUND_TIMEOUT, connect_timeout: float = 120.0):
        self.grid, self.round_timeout, self.connect_timeout = grid, round_timeout, connect_timeout
        self.wire = {"up": 0, "down": 0}  # payload bytes of the messages (codec.payload_bytes)

    def check(self, cfg) -> None:
        check_supported(cfg)

    def open(self, cfg, ds) -> None:
        self.cfg, self.ds = cfg, ds
        self.cfg_json = codec.config_json(cfg)
        self.nodes = self._connect(self.connect_timeout)

    # ------------------------------------------------------------------ messaging
    def _connect(self, timeout: float) -> dict[int, int]:
        """cid -> node id: every SuperNode says which partition it holds (query.hello)."""
        K, t0 = self.cfg.n_clients, time.monotonic()
        while len(ids := list(self.grid.get_node_ids())) < K:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"only {len(ids)} of {K} SuperNodes connected within {timeout:.0f} s; the run "
                                   f"needs one per client (n_clients={K})")
            time.sleep(0.5)
        msgs = [Message(RecordDict({codec.JOB: codec.job(self.cfg_json, 0, self.cfg.seed)}), dst_node_id=n,
                        message_type="query.hello") for n in ids]
        nodes: dict[int, int] = {}
        for rep in self.grid.send_and_receive(msgs, timeout=self.round_timeout):
            if rep.has_error():
                raise RuntimeError(f"SuperNode {rep.metadata.src_node_id} refused the run: {rep.error.reason}")
            cid = int(rep.content.config_records["hello"]["cid"])
            if cid in nodes:
                raise RuntimeError(f"two SuperNodes ({nodes[cid]} and {rep.metadata.src_node_id}) hold partition {cid}")
            nodes[cid] = rep.metadata.src_node_id
        missing = sorted(set(range(K)) - set(nodes))
        if missing:
            raise RuntimeError(f"no SuperNode answered for partition(s) {missing[:10]} of the run's {K} clients")
        return nodes

    def _send(self, kind: str, contents: dict[int, dict], spec, seed: int, r: int) -> dict[int, RecordDict]:
        """Send ``kind`` to each cid with its records; the replies' contents by cid. A client
        without a reply (timeout) or with an error reply is logged and left out."""
        m = [x.name for x in self.cfg.methods].index(spec.name)
        msgs = []
        for cid, records in contents.items():
            content = RecordDict({**records, codec.JOB: codec.job(self.cfg_json, m, seed, r)})
            self.wire["down"] += codec.payload_bytes(content)
            msgs.append(Message(content, dst_node_id=self.nodes[cid], message_type=kind,
                                group_id=f"{spec.name}/{seed}/{r}"))
        by_node = {n: c for c, n in self.nodes.items()}
        out: dict[int, RecordDict] = {}
        errors = set()
        for rep in self.grid.send_and_receive(msgs, timeout=self.round_timeout):
            cid = by_node.get(rep.metadata.src_node_id)
            if cid is None:
                continue
            if rep.has_error():
                errors.add(cid)
                log.warning("%s seed %d round %d: client %d failed in %s and is left out: %s", spec.name, seed,
                            r + 1, cid, kind, rep.error.reason)
                continue
            self.wire["up"] += codec.payload_bytes(rep.content)
            out[cid] = rep.content
        late = sorted(set(contents) - set(out) - errors)
        if late:
            log.warning("%s seed %d round %d: no usable reply to %s from client(s) %s within %.0f s; they are left "
                        "out", spec.name, seed, r + 1, kind, late[:10], self.round_timeout)
        return out

    def _reject(self, spec, seed: int, cid: int, what: str, exc: Exception) -> None:
        log.warning("%s seed %d: rejected client %d's %s: %s", spec.name, seed, cid, what, exc)

    # ------------------------------------------------------------------ the augmenter's exchange
    def start(self, cfg, spec, seed, clients, augmenter, model, n_classes):
        self.spec, self.seed, self.before = spec, seed, dict(self.wire)

    def exchange(self, augmenter, round, clients):
        """The augmenter's steps of ``round`` through messages (exchange.serve_exchange); an upload
        that fails its checks is logged and left out."""
        spec, seed, r = self.spec, self.seed, 0 if round is None else round
        serve_exchange(augmenter, round, clients, lambda kind, contents: self._send(kind, contents, spec, seed, r),
                       device=torch.device(self.cfg.device),
                       reject=lambda cid, what, exc: self._reject(spec, seed, cid, what, exc))

    # ------------------------------------------------------------------ one round
    def train(self, spec, seed: int, r: int, selected: list[int], global_params: dict, algo) -> list:
        algo.download_bytes(global_params)  # SCAFFOLD makes its c at first use, as begin_client does locally
        state = algo.state_dict()
        down_state = codec.arrays({k: v for k, v in state.items() if k.split("/")[0] in algo.download_state})
        weights = codec.arrays(global_params)
        records = {"global": weights, "algo": down_state}
        replies = self._send("train", {c: records for c in selected}, spec, seed, r)
        dev = torch.device(self.cfg.device)
        done = []
        for cid in selected:
            if cid not in replies:
                continue
            rep = replies[cid]
            if "diverged" in rep.config_records:
                raise DivergedError(str(rep.config_records["diverged"]["what"]), cid)
            try:
                params = codec.tensors(rep.array_records["params"], device=dev)
                codec.check_params(f"client {cid}'s weights", params, global_params)
                extras = codec.tensors(rep.array_records["extras"], device=dev)
                m = rep.metric_records["metrics"]
                upd = ClientUpdate(cid=cid, params=params, n_samples=int(m["n_samples"]), loss=float(m["loss"]),
                                   extras=extras)
            except (ValueError, TypeError, KeyError) as exc:
                self._reject(spec, seed, cid, f"round {r + 1} update", exc)
                continue
            done.append((upd, float(m["t_geom"]), float(m["t_train"])))
        if not done:
            raise RuntimeError(f"{spec.name} seed {seed} round {r + 1}: none of the {len(selected)} selected clients "
                               "returned a usable update (see the warnings above)")
        return done

    def evaluate(self, spec, seed: int, global_params: dict) -> float | None:
        """Federated evaluation: the global model on every client's own rows, sample-weighted."""
        weights = codec.arrays(global_params)
        replies = self._send("evaluate", {c: {"global": weights} for c in range(self.cfg.n_clients)}, spec, seed,
                             self.cfg.rounds)
        ms = [r.metric_records["metrics"] for r in replies.values()]
        n = sum(int(m["n"]) for m in ms)
        return sum(float(m["accuracy"]) * int(m["n"]) for m in ms) / n if n else None

    def finish(self, spec, seed, global_params, timings):
        """The engine's own record: its name, the final model's accuracy on every client's own rows
        (federated evaluation) and the payload bytes of its messages."""
        timings["engine"] = self.name
        timings["federated_accuracy"] = self.evaluate(spec, seed, global_params)
        timings["wire_bytes_up"] = self.wire["up"] - self.before["up"]
        timings["wire_bytes_down"] = self.wire["down"] - self.before["down"]
