"""fedsim's Flower ServerApp: the local engine's round loop (``runner.run_method``) with its clients
on Flower SuperNodes.

``runner.run_method`` is the one round loop of both engines: client sampling from (seed, round),
aggregation through the algorithm's server hook, evaluation, checkpoints and metrics. With
``engine=FlowerEngine(grid, ...)`` its two client-side steps go through Flower messages instead of
function calls: the augmenter's exchange (``FlowerEngine.setup``) and the selected clients' local
rounds (``FlowerEngine.train``), answered by ``client_app.app``. Server state (SCAFFOLD's c, FedDyn's
h, FedOpt's moments, FedProto's prototypes) stays in the server's algorithm object, i.e. in this
ServerApp; what a client reads of it (``Algorithm.download_state``) goes down with the weights.

Failures are Flower's: a client that does not answer within ``round_timeout`` seconds, answers
with an error, or uploads something that fails its checks is left out of that step with a logged
reason (a round needs at least one client); a client whose training diverges stops the run with
the local engine's message.

Entry points: ``serve`` (the run's methods x seeds on a Grid; ``runner.run(engine=...)`` calls it),
``simulate`` (the same in Flower's Simulation Engine, Ray backend: ``fedsim run --engine flower``)
and ``app`` (the ServerApp of a real deployment; fedsim/flower/deploy.py starts one).
"""
from __future__ import annotations

import logging
import os
import time

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from geomkern import fedmc, ggeur

from .. import runner
from ..algorithms.base import ClientUpdate
from ..augmenters import _DP_ITERS
from ..client import DivergedError
from . import _reaper, codec

log = logging.getLogger("fedsim.flower")
EXCHANGING = ("none", "oversample", "ggeur", "fedmc")  # the augmenters whose exchange is written here
ROUND_TIMEOUT = 600.0  # seconds a step waits for its replies
# clients per batch of GGEUR's query.upload / query.geometry messages: the server holds one batch's
# replies (C x D x D covariances each) at a time, and keeps only their held classes (HeldStatistics)
EXCHANGE_BATCH = 32


def check_supported(cfg) -> None:
    """The configurations the Flower engine runs (everything else is refused by name)."""
    for m in cfg.methods:
        if m.augmenter not in EXCHANGING:
            raise ValueError(f"--engine flower: methods[{m.name}] uses augmenter {m.augmenter!r}, whose exchange "
                             f"has no Flower messages; it runs {list(EXCHANGING)}")
        from ..algorithms import ALGORITHMS

        algo = ALGORITHMS[m.algorithm.lower()]
        if getattr(algo, "personal", False) or getattr(algo, "needs_trunk", False):
            raise ValueError(f"--engine flower: methods[{m.name}] uses algorithm {m.algorithm!r}; the Flower engine "
                             "runs the global-model algorithms (fedavg, fedprox, scaffold, moon, feddyn, fedopt/"
                             "fedadam/fedyogi/fedavgm, fedntd, fedproto)")


class FlowerEngine:
    """The client side of ``runner.run_method`` over a Flower Grid (one SuperNode per client)."""

    def __init__(self, grid: Grid, cfg, ds, *, round_timeout: float = ROUND_TIMEOUT, connect_timeout: float = 120.0):
        self.grid, self.cfg, self.ds = grid, cfg, ds
        self.cfg_json = codec.config_json(cfg)
        self.round_timeout = round_timeout
        self.wire = {"up": 0, "down": 0}  # payload bytes of the messages (codec.payload_bytes)
        self.round_dictionary = None  # FedMC algorithm1: D_{r-1}, sent down with round r's train messages
        self.nodes = self._connect(connect_timeout)

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
    def setup(self, augmenter, spec, seed: int) -> None:
        """The augmenter's one-time exchange through messages; on the server it leaves what the
        local ``setup`` leaves for the round loop (setup_bytes, privacy)."""
        self.round_dictionary = None
        if spec.augmenter in ("none", "oversample"):  # nothing is exchanged
            augmenter.setup([], n_classes=self.ds.n_classes, seed=seed)
            return
        if spec.augmenter == "ggeur":
            self._setup_ggeur(augmenter, spec, seed)
        else:
            replies = self._send("query.upload", {c: {} for c in range(self.cfg.n_clients)}, spec, seed, 0)
            self._setup_fedmc(augmenter, spec, seed, replies)

    def _ggeur_upload(self, augmenter, rec: ConfigRecord, cid: int) -> dict:
        C, D = self.ds.n_classes, self.ds.dim
        src = f"client {cid}'s GGEUR statistics"
        stats = ggeur.ClassStatistics.from_bytes(rec["stats"], source=src)
        if tuple(stats.means.shape) != (C, D) or stats.means.dtype != self.ds.x_train.dtype:
            raise ValueError(f"{src} are {stats.means.dtype} for C={stats.means.shape[0]} classes in "
                             f"D={stats.means.shape[1]}; the run has {self.ds.x_train.dtype}, C={C}, D={D}")
        doms = [int(d) for d in rec["domains"]] if "domains" in rec else None
        per = [ggeur.ClassStatistics.from_bytes(rec[f"domain{i}"], source=f"{src} of domain {d}")
               for i, d in enumerate(doms or []) if f"domain{i}" in rec] or None
        if doms and len(doms) > 1 and augmenter.p["prototypes"] is not False and (per is None or len(per) != len(doms)):
            raise ValueError(f"{src}: {len(doms)} domains but {0 if per is None else len(per)} per-domain statistics")
        for s in per or []:
            if tuple(s.means.shape) != (C, D) or s.means.dtype != stats.means.dtype:
                raise ValueError(f"{src}: a per-domain entry is {s.means.dtype} {tuple(s.means.shape)}")
        return {"stats": stats, "domains": doms, "per_domain": per}

    def _setup_ggeur(self, augmenter, spec, seed: int) -> None:
        K, C, D = self.cfg.n_clients, self.ds.n_classes, self.ds.dim
        batches = [range(lo, min(lo + EXCHANGE_BATCH, K)) for lo in range(0, K, EXCHANGE_BATCH)]
        uploads: dict[int, dict] = {}
        for batch in batches:  # one batch's replies at a time; what stays is their held classes
            replies = self._send("query.upload", {c: {} for c in batch}, spec, seed, 0)
            for cid in batch:
                if cid in replies:
                    try:
                        u = self._ggeur_upload(augmenter, replies[cid].config_records["upload"], cid)
                        uploads[cid] = augmenter.held(u)
                    except (ValueError, TypeError, KeyError) as exc:
                        self._reject(spec, seed, cid, "GGEUR statistics", exc)
            del replies
        if not uploads:
            raise RuntimeError(f"{spec.name} seed {seed}: no client's GGEUR statistics were usable")
        with_domains = any(u["domains"] is not None for u in uploads.values())
        dtype = next(iter(uploads.values()))["stats"].means.dtype
        empty = {"stats": ggeur.HeldStatistics(torch.zeros(C, dtype=torch.int64), torch.zeros(C, D, dtype=dtype),
                                               torch.zeros(0, dtype=torch.int64), torch.zeros(0, D, D, dtype=dtype)),
                 "domains": [] if with_domains else None, "per_domain": None}
        # a client left out takes part as a client without rows (count 0 everywhere)
        augmenter.seed, augmenter.cache = seed, {}
        augmenter.combine([uploads.get(cid, empty) for cid in range(K)])
        del uploads
        down = ConfigRecord({"geometry": augmenter.geometry.to_bytes()})
        for batch in batches:
            contents = {}
            for cid in batch:
                contents[cid] = {"geometry": down}
                if augmenter.use_protos:
                    P, L = augmenter.others[cid]
                    contents[cid]["others"] = codec.arrays({"prototypes": P, "labels": L})
            self._send("query.geometry", contents, spec, seed, 0)

    def _lgds(self, spec, seed: int, replies, B, gamma: float, *, what: str = "FedMC local geometry",
              optional: bool = False) -> dict:
        """The FedMC LGDs in ``replies`` (cid -> LocalGeometry), each checked against the GAB; a
        malformed one is logged and left out; ``optional``: a reply without one (an algorithm1
        client without rows) is skipped."""
        D = self.ds.dim
        lgds: dict[int, fedmc.LocalGeometry] = {}
        for cid in sorted(replies):
            rec = replies[cid].config_records.get("upload")
            if optional and rec is not None and "lgd" not in rec:
                continue
            try:
                g = fedmc.LocalGeometry.from_bytes(rec["lgd"], source=f"client {cid}'s FedMC LGD")
                if g.centers.shape[1] != D or g.betas.shape[2] != B.shape[0] or g.gamma != gamma:
                    raise ValueError(f"it has D={g.centers.shape[1]}, S={g.betas.shape[2]}, gamma={g.gamma}; the "
                                     f"server's GAB has D={D}, S={B.shape[0]}, gamma={gamma}")
                lgds[cid] = g
            except (ValueError, TypeError, KeyError) as exc:
                self._reject(spec, seed, cid, what, exc)
        return lgds

    def _setup_fedmc(self, augmenter, spec, seed: int, replies) -> None:
        K, D = self.cfg.n_clients, self.ds.dim
        p = augmenter.p
        released: dict[int, fedmc.PrototypeRelease] = {}
        for cid in sorted(replies):
            rec = replies[cid].config_records["upload"]
            if "prototypes" not in rec:
                continue  # a client without rows releases nothing (as in fedmc.setup)
            try:
                pr = fedmc.PrototypeRelease.from_bytes(rec["prototypes"], source=f"client {cid}'s FedMC prototypes")
                if pr.centers.shape[1] != D or pr.centers.dtype != self.ds.x_train.dtype:
                    raise ValueError(f"prototypes are {pr.centers.dtype} in D={pr.centers.shape[1]}; the run has "
                                     f"{self.ds.x_train.dtype} in D={D}")
                released[cid] = pr
            except (ValueError, TypeError) as exc:
                self._reject(spec, seed, cid, "FedMC prototypes", exc)
        if not released:
            raise RuntimeError(f"{spec.name} seed {seed}: no client's FedMC prototypes were usable")
        B, gamma = fedmc.setup_server_basis([released[c].prototypes() for c in sorted(released)], n_base=p["n_base"],
                                            gamma=p["gamma"], seed=seed)
        gab = fedmc.GAB(B).to_bytes()
        if p["protocol"] == "algorithm1":  # the GAB down to every client; the LGDs follow round by round
            augmenter.start_rounds([released.get(c) for c in range(K)], B, gamma, seed=seed)
            down = ConfigRecord({"gab": gab, "gamma": gamma})
            self._send("query.geometry", {c: {"geometry": down} for c in range(K)}, spec, seed, 0)
            return
        replies = self._send("query.lgd", {c: {"gab": ConfigRecord({"gab": gab, "gamma": gamma})} for c in released},
                             spec, seed, 0)
        lgds = self._lgds(spec, seed, replies, B, gamma)
        if not lgds:
            raise RuntimeError(f"{spec.name} seed {seed}: no client's FedMC local geometry was usable")
        dictionary = fedmc.setup_server_fuse([lgds[c] for c in sorted(lgds)], n_entries=p["n_entries"], seed=seed)
        augmenter.receive(B, gamma, dictionary, n_classes=self.ds.n_classes)
        # two DP releases per client that released; bytes as the local setup counts them
        eps = fedmc.spent(augmenter.release_epsilon(), p["delta"], iters=_DP_ITERS, releases=2)
        augmenter.account(released, lgds, [eps if c in released else 0.0 for c in range(K)], p["delta"])
        down = ConfigRecord({"gab": gab, "gamma": gamma, "dictionary": dictionary.to_bytes()})
        self._send("query.geometry", {c: {"geometry": down} for c in range(K)}, spec, seed, 0)

    # ------------------------------------------------------------------ one round
    def begin_round(self, augmenter, spec, seed: int, r: int, selected: list[int]) -> None:
        """The augmenter's per-round exchange through messages (FedMC's algorithm1: S_r's LGDs up
        in ``query.lgd``, D_{r-1} down with the train messages); the server side is the augmenter's
        own ``round_exchange``, as in the local engine. Nothing for the other augmenters."""
        if spec.augmenter != "fedmc" or augmenter.p["protocol"] != "algorithm1":
            return
        previous = augmenter.rebuild_from(r)
        rebuild = None if previous is None else self._round_lgds(augmenter, spec, seed, r - 1, previous)[0]
        lgds, sent = self._round_lgds(augmenter, spec, seed, r, selected)
        augmenter.round_exchange(r, selected, lgds, rebuild=rebuild, released=sent)
        d = augmenter.dictionary
        self.round_dictionary = None if d is None else ConfigRecord({"dictionary": d.to_bytes()})

    def _round_lgds(self, augmenter, spec, seed: int, r: int, cids: list[int]) -> tuple[dict, list[int]]:
        """Round r's LGDs of ``cids`` (checked), and the clients that sent one, usable or not: each
        of them made a DP release, which their privacy report counts."""
        replies = self._send("query.lgd", {c: {} for c in cids}, spec, seed, r)
        sent = [c for c in sorted(replies) if "lgd" in replies[c].config_records.get("upload", {})]
        return self._lgds(spec, seed, replies, augmenter.B, augmenter.gamma, what=f"FedMC LGD of round {r + 1}",
                          optional=True), sent

    def train(self, spec, seed: int, r: int, selected: list[int], global_params: dict, algo) -> list:
        algo.download_bytes(global_params)  # SCAFFOLD makes its c at first use, as begin_client does locally
        state = algo.state_dict()
        down_state = codec.arrays({k: v for k, v in state.items() if k.split("/")[0] in algo.download_state})
        weights = codec.arrays(global_params)
        records = {"global": weights, "algo": down_state}
        if self.round_dictionary is not None:
            records["dictionary"] = self.round_dictionary
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


def serve(engine, cfg, seeds, ds, partitions, out, *, progress: bool, dataset_sum: str,
          round_timeout: float = ROUND_TIMEOUT) -> dict:
    """Every (method, seed) of the run through ``runner.run_method`` with its clients on Flower.
    ``engine``: a Flower Grid (inside a ServerApp), or "flower" for the Simulation Engine.
    Returns {(method name, seed): (metrics, timings)}."""
    check_supported(cfg)
    if engine == "flower":
        return simulate(cfg, seeds, ds, partitions, out, progress=progress, dataset_sum=dataset_sum,
                        round_timeout=round_timeout)
    eng = FlowerEngine(engine, cfg, ds, round_timeout=round_timeout)
    results = {}
    for spec in cfg.methods:
        for s in seeds:
            before = dict(eng.wire)
            run_dir = out / "runs" / f"{runner.slug(spec.name)}-seed{s}"
            metrics, tim = runner.run_method(cfg, spec, s, ds, partitions[s], run_dir, progress=progress,
                                             dataset_sum=dataset_sum, engine=eng)
            tim["engine"] = "flower"
            # the final model (the checkpoint run_method wrote last) on every client's own rows
            final = torch.load(run_dir / "checkpoint.pt", weights_only=True, map_location=cfg.device)["global"]
            tim["federated_accuracy"] = eng.evaluate(spec, s, final)
            tim["wire_bytes_up"] = eng.wire["up"] - before["up"]
            tim["wire_bytes_down"] = eng.wire["down"] - before["down"]
            results[(spec.name, s)] = (metrics, tim)
    return results


def simulate(cfg, seeds, ds, partitions, out, *, progress: bool, dataset_sum: str,
             round_timeout: float = ROUND_TIMEOUT, num_cpus: int | None = None) -> dict:
    """``serve`` in Flower's Simulation Engine (Ray backend): n_clients virtual SuperNodes running
    ``client_app.app``, this process running the ServerApp."""
    from flwr.simulation import run_simulation

    from .client_app import app as client_app

    held: dict = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            held["results"] = serve(grid, cfg, seeds, ds, partitions, out, progress=progress,
                                    dataset_sum=dataset_sum, round_timeout=round_timeout)
        except BaseException as exc:  # re-raised below, in the caller's thread
            held["error"] = exc

    cpus = num_cpus or int(os.environ.get("FEDSIM_FLOWER_CPUS", 0)) or os.cpu_count() or 1
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": cpus, "include_dashboard": False}}
    _reaper.start()  # Ray's processes go too if this process is killed outright
    try:
        run_simulation(server_app=server, client_app=client_app, num_supernodes=cfg.n_clients,
                       backend_config=backend)
    except KeyboardInterrupt:  # Ctrl-C: take Ray's processes down before the caller exits
        _shutdown_ray()
        raise
    if "error" in held:
        raise held["error"]
    if "results" not in held:
        raise RuntimeError("the Flower simulation ended without running fedsim's ServerApp (see Flower's log above)")
    return held["results"]


def _shutdown_ray() -> None:
    """Stop the Ray runtime this process started, if any (its raylet, GCS and workers)."""
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()


# ---------------------------------------------------------------------- a real deployment
app = ServerApp()


@app.main()
def deployed(grid: Grid, context: Context) -> None:
    """The ServerApp under ``flower-superlink``: run-config ``config`` (a fedsim config file, TOML or
    config.json) and ``out`` (the run folder), optionally ``round-timeout`` (s)."""
    from pathlib import Path

    rc = context.run_config
    path = Path(str(rc["config"]))
    if path.suffix == ".json":
        cfg = runner.RunConfig.from_dict(runner.read_config_json(path)[0])  # [1], the engine it records: not needed
    else:
        cfg = runner.load_config(path)
    runner.run(cfg, Path(str(rc["out"])), progress=False, engine=grid,
               round_timeout=float(rc.get("round-timeout", ROUND_TIMEOUT)))
