"""fedsim's Flower apps (fedsim/flower): the same results as the local engine, geometry checked on
receipt, failures handled. Needs the `flower` extra (skipped without flwr).

Fast tests drive the real ClientApp and ServerApp logic through ``InProcessGrid`` (a Flower Grid
that hands each message to ``client_app.app`` in this process, one Flower Context per node: Flower's
messages, records and app routing, without Ray or gRPC). The real deployment (flower-superlink +
3 flower-supernode processes, 3 rounds) runs in the default suite, so CI runs it (~4-5.6 min on a
busy 2-core machine, docs/flower.md); the Simulation Engine (Ray) parity and the killed-SuperNode
tests are slow (--runslow).
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

flwr = pytest.importorskip("flwr")

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from _fedsim_helpers import save_blobs  # noqa: E402
from fedsim.flower._reaper import alive, descendants  # noqa: E402
from fedsim.flower.engine import FlowerEngine  # noqa: E402
from fedsim.runner import MethodSpec, RunConfig, run  # noqa: E402
from geomkern import fedmc, ggeur  # noqa: E402
from geomkern.exchange import read_bytes  # noqa: E402


class InProcessGrid(Grid):
    """A Flower Grid whose nodes are ``client_app.app`` called in this process. ``tamper(cid, kind,
    reply)`` may replace a reply (a malformed upload) or return None (a node that never answers)."""

    def __init__(self, n: int, tamper=None):
        from fedsim.flower.client_app import app

        self.app, self.tamper = app, tamper
        self.contexts = {100 + k: Context(run_id=1, node_id=100 + k, state=RecordDict(), run_config={},
                                          node_config={"partition-id": k, "num-partitions": n}) for k in range(n)}
        for name in ("run_id", "task_id", "node_id"):
            setattr(TaskIdentity, name, 1)

    def set_run(self, run):
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            node = m.metadata.dst_node_id
            try:
                rep = self.app(m, self.contexts[node])
            except Exception as exc:  # what a SuperNode does with a ClientApp exception
                rep = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=m)
            if self.tamper is not None:
                rep = self.tamper(node - 100, m.metadata.message_type, rep)
            if rep is not None:
                out.append(rep)
        return out


@pytest.fixture
def blobs(tmp_path):
    return save_blobs(tmp_path / "blobs.npz", classes=4, dim=8, noise=0.6, n_train=240, n_test=80, seed=0)


def _cfg(data, methods, **kw):
    """4 clients, 3 of them per round; 2 rounds in the fast tests (a client's state then carries over
    between rounds), 3 in the slow ones."""
    return RunConfig(**{"dataset": str(data), "n_clients": 4, "rounds": 2, "min_size": 5, "client_fraction": 0.75,
                        "methods": methods, **kw})


def _seed_metrics(results):
    return {m: v["seeds"]["0"] for m, v in results["methods"].items()}


PARITY = [MethodSpec("FedAvg+GGEUR", augmenter="ggeur"), MethodSpec("FedAvg+FedMC", augmenter="fedmc"),
          MethodSpec("SCAFFOLD", algorithm="scaffold")]
# the Simulation Engine test adds these (slow): plain FedAvg, FedProto's prototypes sent down, MOON's
# previous model and FedDyn's grad_i kept by the client, FedDyn's h and FedAdam's moments by the server
MORE = [MethodSpec("FedAvg"), MethodSpec("FedProto+GGEUR", algorithm="fedproto", augmenter="ggeur"),
        MethodSpec("MOON", algorithm="moon"), MethodSpec("FedDyn", algorithm="feddyn"),
        MethodSpec("FedAdam", algorithm="fedadam")]


def test_flower_apps_give_the_local_engines_results(blobs, tmp_path):
    """Per round accuracy, loss and bytes identical (bit for bit): the ClientApp runs the local
    engine's client_round with randomness from (seed, round, client); the server sorts updates by cid."""
    local = run(_cfg(blobs, PARITY), tmp_path / "local", progress=False)
    grid = InProcessGrid(4)
    flower = run(_cfg(blobs, PARITY), tmp_path / "flower", progress=False, engine=FlowerEngine(grid))
    assert _seed_metrics(flower) == _seed_metrics(local)
    for name in ("results.json", "results.csv", "timings.json", "accuracy.png"):
        assert (tmp_path / "flower" / name).is_file()
    assert json.loads((tmp_path / "flower" / "config.json").read_text())["engine"] == "flower"
    tim = json.loads((tmp_path / "flower" / "timings.json").read_text())["FedAvg+GGEUR"]["0"]
    m = flower["methods"]["FedAvg+GGEUR"]["seeds"]["0"]
    # wire bytes = tensor bytes + headers (npy per array, safetensors JSON per blob), never less
    assert tim["engine"] == "flower" and tim["wire_bytes_up"] >= m["bytes_up"] and tim["wire_bytes_down"] > 0
    assert 0.0 <= tim["federated_accuracy"] <= 1.0  # @app.evaluate: the final model on the clients' rows
    # client state lives in the nodes' Flower contexts: SCAFFOLD's c_i of every client that trained
    keys = [k for ctx in grid.contexts.values() for k in ctx.state.array_records if k.startswith("2.0.algo")]
    assert keys


def _forge(blob: bytes, *, nan=False, version=None, drop_dim=False) -> bytes:
    """The bytes of a geometry container changed the way a faulty or hostile client could."""
    import safetensors.torch

    kind, fields = read_bytes(blob, "geomkern.ggeur")
    t = {k: v for k, v in fields.items() if isinstance(v, torch.Tensor)}
    if nan:
        t["means"] = t["means"].clone()
        t["means"][0, 0] = float("nan")
    if drop_dim:
        t["means"], t["covs"] = t["means"][:, :-1].contiguous(), t["covs"][:, :-1, :-1].contiguous()
    meta = {"format": "geomkern.ggeur", "version": version or "1", "kind": kind, "scalars": "{}"}
    return safetensors.torch.save(t, metadata=meta)


@pytest.mark.parametrize("fault,reason", [({"nan": True}, "NaN"), ({"version": "7"}, "format version 7"),
                                          ({"drop_dim": True}, "D=7")])
def test_malformed_geometry_is_rejected_with_its_reason(blobs, tmp_path, caplog, fault, reason):
    """Client 1 uploads broken GGEUR statistics: the server logs why and leaves them out; the
    round runs with the other clients and nothing becomes NaN."""

    def tamper(cid, kind, rep):
        if cid == 1 and kind == "query.upload":
            rec = rep.content.config_records["payload"]
            rec["stats"] = _forge(rec["stats"], **fault)
        return rep

    with caplog.at_level(logging.WARNING, logger="fedsim.flower"):
        res = run(_cfg(blobs, [MethodSpec("FedAvg+GGEUR", augmenter="ggeur")]), tmp_path / "run", progress=False,
                  engine=FlowerEngine(InProcessGrid(4, tamper)))
    msgs = [r.getMessage() for r in caplog.records if "rejected client 1" in r.getMessage()]
    assert msgs and reason in msgs[0], caplog.text
    acc = res["methods"]["FedAvg+GGEUR"]["seeds"]["0"]["accuracy"]
    assert len(acc) == 2 and all(0.0 <= a <= 1.0 for a in acc)


def test_a_client_that_never_answers_is_left_out_and_the_round_completes(blobs, tmp_path, caplog):
    def tamper(cid, kind, rep):
        return None if (cid == 2 and kind == "train") else rep

    cfg = _cfg(blobs, [MethodSpec("FedAvg")], client_fraction=1.0)
    with caplog.at_level(logging.WARNING, logger="fedsim.flower"):
        res = run(cfg, tmp_path / "run", progress=False, engine=FlowerEngine(InProcessGrid(4, tamper), round_timeout=5))
    assert "client(s) [2]" in caplog.text
    assert len(res["methods"]["FedAvg"]["seeds"]["0"]["accuracy"]) == 2


def test_a_failing_client_is_an_error_reply_and_left_out(blobs, tmp_path, caplog):
    def tamper(cid, kind, rep):
        if cid == 0 and kind == "train":
            return Message(Error(code=1, reason="ClientAppException: out of memory"), reply_to=_last[0])
        return rep

    _last = [None]
    grid = InProcessGrid(4, tamper)
    real = grid.app

    def app(m, ctx):
        _last[0] = m
        return real(m, ctx)

    grid.app = app
    with caplog.at_level(logging.WARNING, logger="fedsim.flower"):
        run(_cfg(blobs, [MethodSpec("FedAvg")], client_fraction=1.0), tmp_path / "run", progress=False,
            engine=FlowerEngine(grid))
    assert "client 0 failed in train" in caplog.text and "out of memory" in caplog.text


def test_every_client_failing_stops_the_run_with_a_message(blobs, tmp_path):
    grid = InProcessGrid(4, lambda cid, kind, rep: None if kind == "train" else rep)
    with pytest.raises(RuntimeError, match="none of the 3 selected clients returned a usable update"):
        run(_cfg(blobs, [MethodSpec("FedAvg")]), tmp_path / "run", progress=False,
            engine=FlowerEngine(grid, round_timeout=1))


def test_refused_configurations_are_named(blobs, tmp_path):
    with pytest.raises(TypeError, match="engine must be an engine.Engine"):
        run(_cfg(blobs, [MethodSpec("FedAvg")]), tmp_path / "b", progress=False, engine="bogus")
    with pytest.raises(ValueError, match="cannot be resumed"):
        run(_cfg(blobs, [MethodSpec("FedAvg")]), tmp_path / "c", resume=True, engine=FlowerEngine(None))
    with pytest.raises(ValueError, match="algorithm 'flic'"):
        run(_cfg(blobs, [MethodSpec("FLIC", algorithm="flic")]), tmp_path / "d", progress=False,
            engine=FlowerEngine(InProcessGrid(4)))
    assert not any((tmp_path / d).exists() for d in "bcd")


def test_a_supernode_of_another_federation_size_is_refused(blobs, tmp_path):
    grid = InProcessGrid(4)
    for ctx in grid.contexts.values():
        ctx.node_config["num-partitions"] = 5
    with pytest.raises(RuntimeError, match="num-partitions=5, but the run has n_clients=4"):
        run(_cfg(blobs, [MethodSpec("FedAvg")]), tmp_path / "run", progress=False, engine=FlowerEngine(grid))


def test_exchanged_containers_round_trip_through_bytes():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 6, generator=g)
    y = torch.randint(0, 3, (60,), generator=g)
    s = ggeur.local_statistics(X, y, 3)
    blob = s.to_bytes()
    back = ggeur.ClassStatistics.from_bytes(blob, source="client 4's upload")
    assert all(torch.equal(getattr(back, k), getattr(s, k)) for k in ("counts", "means", "covs"))
    assert len(blob) > s.nbytes()  # the safetensors header on top of the tensor bytes
    pr = fedmc.PrototypeRelease(*fedmc.client_prototypes(X, 4, epsilon=float("inf"), delta=1e-5, clip_norm=None,
                                                         generator=g))
    assert torch.equal(fedmc.PrototypeRelease.from_bytes(pr.to_bytes()).centers, pr.centers)
    with pytest.raises(ValueError, match="client 4's upload holds a class_statistics, expected a global_geometry"):
        ggeur.GlobalGeometry.from_bytes(blob, source="client 4's upload")
    with pytest.raises(ValueError, match="client 4's upload is not a readable safetensors blob"):
        ggeur.ClassStatistics.from_bytes(blob[:-5], source="client 4's upload")
    with pytest.raises(ValueError, match="is not a geomkern.fedmc file"):
        fedmc.PrototypeRelease.from_bytes(blob)


@pytest.mark.slow
def test_simulation_engine_gives_the_local_engines_results(blobs, tmp_path):
    """`fedsim run --engine flower`: Flower's Simulation Engine (Ray backend), 4 virtual SuperNodes."""
    from fedsim.cli import main

    methods = PARITY + MORE
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as Ray's actors (one CPU each): FedMC's float sums depend on the thread count
    try:
        local = run(_cfg(blobs, methods, rounds=3), tmp_path / "local", progress=False)
    finally:
        torch.set_num_threads(threads)
    cfg = _cfg(blobs, methods, rounds=3)
    toml = tmp_path / "run.toml"
    toml.write_text(f'dataset = "{blobs}"\nn_clients = 4\nrounds = 3\nmin_size = 5\nclient_fraction = 0.75\n'
                    + "".join(f'[[methods]]\nname = "{m.name}"\nalgorithm = "{m.algorithm}"\naugmenter = "{m.augmenter}"\n'
                              for m in cfg.methods))
    assert main(["run", "--config", str(toml), "--engine", "flower", "--quiet", "--out", str(tmp_path / "sim")]) == 0
    sim = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert _seed_metrics(sim) == _seed_metrics(local)


@pytest.mark.early
def test_real_deployment_superlink_and_three_supernodes(blobs, tmp_path):
    """flower-superlink + 3 flower-supernode processes on free ports, 3 rounds of FedAvg+GGEUR; the
    same accuracies as the local engine; every process is gone afterwards."""
    from fedsim.flower.deploy import group_members, run_deployment

    methods = [MethodSpec("FedAvg+GGEUR", augmenter="ggeur")]
    cfg = _cfg(blobs, methods, n_clients=3, client_fraction=1.0, rounds=3)
    local = run(_cfg(blobs, methods, n_clients=3, client_fraction=1.0, rounds=3), tmp_path / "local", progress=False)
    started = {}
    res = run_deployment(cfg, tmp_path / "deployed", timeout=600, round_timeout=120, on_started=started.update)
    assert _seed_metrics(res) == _seed_metrics(local)
    procs = [started["superlink"], *started["supernodes"]]
    assert all(p.poll() is not None for p in procs)
    assert not any(group_members(p.pid) for p in procs)  # the whole groups ended, app processes included


@pytest.mark.slow
def test_a_supernode_killed_during_the_run_never_hangs_it(blobs, tmp_path):
    """One of three SuperNodes is killed as soon as the run is submitted: the run either completes
    with the other two (the dead node's steps time out and it is left out) or fails with a message,
    within its time bound; every process is shut down either way."""
    import os
    import signal
    import time

    from fedsim.flower.deploy import group_members, run_deployment

    cfg = _cfg(blobs, [MethodSpec("FedAvg")], n_clients=3, client_fraction=1.0)
    started = {}

    def kill_one(procs):
        started.update(procs)
        os.killpg(procs["supernodes"][2].pid, signal.SIGKILL)

    t0 = time.monotonic()
    try:
        res = run_deployment(cfg, tmp_path / "run", timeout=300, round_timeout=20, on_started=kill_one)
        assert len(res["methods"]["FedAvg"]["seeds"]["0"]["accuracy"]) == 2
    except RuntimeError as exc:
        assert "Flower run" in str(exc) and "logs" in str(exc)
    assert time.monotonic() - t0 < 300
    assert not any(group_members(p.pid) for p in [started["superlink"], *started["supernodes"]])


@pytest.mark.early
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="follows the run's processes through /proc")
@pytest.mark.parametrize("sig", (signal.SIGINT, signal.SIGKILL), ids=("SIGINT", "SIGKILL"))
def test_a_killed_simulation_leaves_no_process(tmp_path, sig):
    """A `fedsim run --engine flower` stopped by Ctrl-C exits (130, the resume hint) instead of
    waiting on Flower's ServerApp thread, and one killed outright takes Ray's processes with it
    (fedsim/flower/_reaper.py): in both cases no process the run started is left."""
    blobs = save_blobs(tmp_path / "b.npz", classes=4, dim=8, noise=0.6, n_train=240, n_test=80, seed=0)
    (tmp_path / "r.toml").write_text(f'dataset = "{blobs}"\nn_clients = 4\nrounds = 500\nmin_size = 5\n'
                                     'client_fraction = 0.75\n[[methods]]\nname = "FedAvg"\n')
    log = (tmp_path / "log.txt").open("w")
    # SIGINT's default action in the child: a job a non-interactive shell starts with `&` (a CI
    # runner's, say) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "fedsim.cli", "run", "--config", str(tmp_path / "r.toml"),
                             "--engine", "flower", "--quiet", "--out", str(tmp_path / "out")],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            started = descendants(proc.pid)
            if any(b"raylet" in Path(f"/proc/{p}/cmdline").read_bytes() for p in started
                   if Path(f"/proc/{p}/cmdline").exists()):
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"the run ended before Ray was up: {(tmp_path / 'log.txt').read_text()[-2000:]}"
        time.sleep(3)
        started.update(descendants(proc.pid))
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(p, s) for p, s in started.items()):
            time.sleep(0.5)
        left = [p for p, s in started.items() if alive(p, s)]
        names = [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in left if Path(f"/proc/{p}/cmdline").exists()]
        assert not left, f"{len(left)} of the run's {len(started)} processes survived {sig.name}: {names}"
        if sig == signal.SIGINT:
            assert rc == 130 and "fedsim run --resume" in (tmp_path / "log.txt").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid, start in {**started, **descendants(proc.pid)}.items():
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        log.close()


def _run_example(augmenter: dict) -> str:
    """examples/flower_exchange/app.py in Flower's Simulation Engine (2 rounds, 4 clients)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "EXAMPLE_AUGMENTER": json.dumps(augmenter), "PYTHONPATH": str(root)}
    p = subprocess.run([sys.executable, str(root / "examples" / "flower_exchange" / "app.py")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


@pytest.mark.early
@pytest.mark.parametrize("augmenter", [
    {"name": "ggeur", "target_per_class": 60},
    pytest.param({"name": "fedmc", "protocol": "fixed", "target_per_class": 60, "n_prototypes": 8, "n_base": 16},
                 marks=pytest.mark.slow)])
def test_the_example_adds_an_augmenter_to_flowers_own_fedavg(augmenter):
    """A Flower app of one's own (Flower's FedAvg strategy, its own model and data) adds GGEUR or
    FedMC through the exchange hooks alone, without fedsim's runner: the geometry went up and down,
    every client trained on 80 added rows (2 held classes filled to 60 from about 20 rows each:
    the augmenter's samples, not its own), and both rounds ran."""
    out = _run_example(augmenter)
    up, down = (int(v) for v in re.search(r"exchange: (\d+) bytes up, (\d+) bytes down", out).groups())
    assert up > 0 and down > 0, out[-2000:]
    assert re.search(r"'augmented': '8\.0000e\+01'\}, 2: \{'augmented': '8\.0000e\+01'", out), out[-2000:]
    assert re.search(r"final accuracy 0\.\d+", out)


def _set(record, **kv):
    for k, v in kv.items():
        record[k] = v


_GGEUR = MethodSpec("g", augmenter="ggeur")
_FEDMC = MethodSpec("m", augmenter="fedmc", augmenter_params={"n_prototypes": 8, "n_base": 16, "n_clusters": 3,
                                                              "n_components": 2, "n_entries": 6})


def _other_kind(content):  # a GlobalGeometry where ClassStatistics belong
    g = torch.Generator().manual_seed(0)
    geo = ggeur.aggregate([ggeur.local_statistics(torch.randn(30, 8, generator=g), torch.randint(0, 4, (30,), generator=g), 4)])
    _set(content.config_records["payload"], stats=geo.to_bytes())
    _set(content.config_records["payload.schema"], stats="container:geomkern.ggeur/global_geometry")


def _prototypes_d7(content):
    rec = content.config_records["payload"]
    if "prototypes" in rec:
        pr = fedmc.PrototypeRelease.from_bytes(rec["prototypes"])
        rec["prototypes"] = fedmc.PrototypeRelease(pr.centers[:, :-1].contiguous(), pr.counts, pr.epsilon,
                                                   pr.delta).to_bytes()


def _lgd_as_prototypes(content):
    if "lgd" in content.config_records["payload"]:
        _set(content.config_records["payload.schema"], lgd="container:geomkern.fedmc/prototypes")


# forged exchange uploads (what a faulty or hostile client can send through the generic codec): each
# is rejected with a reason that names it, and the run goes on without that client
FORGED = {
    "unknown kind": (_GGEUR, lambda c: _set(c.config_records["payload.schema"], stats="module:os/system"),
                     "entry 'stats' is of an unknown kind 'module:os/system'"),
    "another container": (_GGEUR, _other_kind, "are a GlobalGeometry, not a ClassStatistics"),
    "entry missing": (_GGEUR, lambda c: (c.config_records["payload.schema"].pop("stats"),
                                         c.config_records["payload"].pop("stats")), "it has no entry 'stats'"),
    "text for bytes": (_GGEUR, lambda c: _set(c.config_records["payload"], stats="hello"), "(stats) must be bytes"),
    "listed, not sent": (_GGEUR, lambda c: _set(c.config_records["payload.schema"], extra="tensor"),
                         "entry 'extra' is listed (tensor) but not sent"),
    "domains not ids": (_GGEUR, lambda c: (_set(c.config_records["payload"], domains="abc"),
                                           _set(c.config_records["payload.schema"], domains="value")),
                        "domains must be a list of domain ids, got 'abc'"),
    "fedmc D=7": (_FEDMC, _prototypes_d7, "FedMC prototypes are torch.float32 in D=7; the run has torch.float32 in D=8"),
    "fedmc wrong kind": (_FEDMC, _lgd_as_prototypes, "holds a local_geometry, expected a prototypes"),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_exchange_upload_is_rejected_by_name(blobs, tmp_path, caplog, case):
    spec, forge, reason = FORGED[case]

    def tamper(cid, kind, rep):
        if cid == 1 and kind == "query.upload" and "payload.schema" in rep.content.config_records:
            forge(rep.content)
        return rep

    with caplog.at_level(logging.WARNING, logger="fedsim.flower"):
        res = run(_cfg(blobs, [spec]), tmp_path / "run", progress=False, engine=FlowerEngine(InProcessGrid(4, tamper)))
    msgs = [r.getMessage() for r in caplog.records if "rejected client 1" in r.getMessage()]
    assert msgs and reason in msgs[0], caplog.text
    assert len(res["methods"][spec.name]["seeds"]["0"]["accuracy"]) == 2
