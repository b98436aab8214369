"""A real Flower deployment on 127.0.0.1: ``flower-superlink``, one ``flower-supernode`` per client
(``--node-config "partition-id=K num-partitions=N"``: each loads its own partition of the run's
data) and ``flwr run`` of fedsim's apps, all in insecure mode on free ports; the run folder is
written by the ServerApp as ``fedsim run`` writes it (``fedsim flower-demo``, docs/flower.md).

Bounded in time: every process is started in its own process group and the whole group is
ended (SIGTERM, then SIGKILL) in a ``finally``, whatever happens; the run must finish within
``timeout`` seconds. The Flower processes' logs go to ``<out>/flower/logs``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .. import runner
from .._io import json_text
from . import require_flower

APP_TOML = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedsim-flower"
version = "0.1.0"
description = "fedsim's methods as Flower apps (the code is the installed fedsim package)"
license = "MIT"
dependencies = []

[tool.flwr.app]
publisher = "geomkern"

[tool.flwr.app.components]
serverapp = "fedsim.flower.apps:app"
clientapp = "fedsim.flower.client_app:app"

[tool.flwr.app.config]
config = {config}
out = {out}
round-timeout = {round_timeout}
"""


def demo_config(path=None, *, clients: int | None = None, rounds: int | None = None) -> runner.RunConfig:
    """The demo's configuration: a config file, else FedAvg+GGEUR with 3 clients for 3 rounds."""
    if path:
        cfg = runner.load_config(path)
    else:
        cfg = runner.RunConfig(n_clients=3, rounds=3, methods=[runner.MethodSpec("FedAvg+GGEUR", augmenter="ggeur")])
    if clients is not None:
        cfg.n_clients = clients
    if rounds is not None:
        cfg.rounds = rounds
    return runner.validate(cfg)


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_port(port: int, proc: subprocess.Popen, until: float, what: str, log: Path) -> None:
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it listened on port {port}; "
                               f"see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} in time; see {log}")


def _stop(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """End each process's whole group (SuperLink and SuperNodes start their app processes as
    children): SIGTERM, then SIGKILL for what is left after ``grace`` seconds."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the group may outlive its leader
        except ProcessLookupError:
            pass
        if p.poll() is None:
            p.wait(timeout=5)
    end = time.monotonic() + 10.0
    while any(group_members(p.pid) for p in procs) and time.monotonic() < end:
        time.sleep(0.1)  # SIGKILL is delivered asynchronously


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid`` (from /proc)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp, ...
            out.append(int(pid))
    return out


def run_deployment(cfg: runner.RunConfig, out, *, timeout: float = 600.0, round_timeout: float = 120.0,
                   on_started=None) -> dict:
    """Run ``cfg`` on a local SuperLink with cfg.n_clients SuperNodes; returns results.json's dict.
    ``on_started(procs)`` (tests) is called with {"superlink": Popen, "supernodes": [Popen]} once the
    run was submitted."""
    require_flower()
    runner.validate(cfg)
    out = Path(out).resolve()
    if (out / "results.json").exists() or (out / "config.json").exists():
        raise ValueError(f"--out {out} already holds a run; choose another --out")
    work = out / "flower"
    for d in ("app", "home", "logs"):
        (work / d).mkdir(parents=True, exist_ok=True)
    (work / "run-config.json").write_text(json_text(cfg.to_dict()))  # read back by read_config_json
    q = json.dumps
    (work / "app" / "pyproject.toml").write_text(APP_TOML.format(config=q(str(work / "run-config.json")),
                                                                 out=q(str(out)), round_timeout=float(round_timeout)))
    link_port, *node_ports = free_ports(1 + cfg.n_clients)
    (work / "home" / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n')
    bindir = str(Path(sys.executable).parent)  # the SuperLink starts flower-superexec by name
    env = {**os.environ, "FLWR_HOME": str(work / "home"), "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONUNBUFFERED": "1"}
    exe = lambda name: str(Path(bindir) / name)  # noqa: E731
    procs: list[subprocess.Popen] = []
    logs = []
    until = time.monotonic() + timeout

    def start(args, name):
        log = open(work / "logs" / f"{name}.log", "wb")
        logs.append(log)
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
        procs.append(p)
        return p, work / "logs" / f"{name}.log"

    try:
        link, link_log = start([exe("flower-superlink"), "--insecure", "--port", str(link_port)], "superlink")
        _wait_port(link_port, link, until, "flower-superlink", link_log)
        nodes = []
        for k, port in enumerate(node_ports):
            p, _ = start([exe("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{link_port}",
                          "--port", str(port), "--node-config",
                          f"partition-id={k} num-partitions={cfg.n_clients}"], f"supernode-{k}")
            nodes.append(p)
        sub = subprocess.run([exe("flwr"), "run", str(work / "app"), "local", "--format", "json"], env=env,
                             cwd=work, capture_output=True, text=True, timeout=max(1.0, until - time.monotonic()))
        (work / "logs" / "flwr-run.log").write_text(sub.stdout + sub.stderr)
        try:
            run_id = json.loads(sub.stdout)["run-id"]
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(f"flwr run did not start the run: {sub.stdout.strip()} {sub.stderr.strip()}"[:2000]) \
                from None
        if on_started:
            on_started({"superlink": link, "supernodes": nodes})
        status = _wait_run(run_id, out, env, exe, until, work)
        if not (out / "results.json").is_file():
            raise RuntimeError(f"the Flower run {run_id} ended ({status}) without writing results.json; see the "
                               f"logs in {work / 'logs'}")
        return json.loads((out / "results.json").read_text())
    finally:
        _stop(procs)
        for f in logs:
            f.close()


LS_EVERY = 10.0  # seconds between two `flwr ls` of _wait_run


def _wait_run(run_id, out: Path, env, exe, until: float, work: Path) -> str:
    """Poll until the run's status is finished (or results.json appears); a clear error at the deadline.
    results.json is looked for every 0.5 s; ``flwr ls`` (a Python process of ~1.5 s CPU, which
    competes with the run's own processes) only every LS_EVERY seconds, to see a run that failed."""
    status = "unknown"
    next_ls = time.monotonic() + LS_EVERY
    while time.monotonic() < until:
        if (out / "results.json").is_file():
            return "finished"
        if time.monotonic() < next_ls:
            time.sleep(0.5)
            continue
        next_ls = time.monotonic() + LS_EVERY
        try:
            ls = subprocess.run([exe("flwr"), "ls", "local", "--run-id", str(run_id), "--format", "json"], env=env,
                                cwd=work, capture_output=True, text=True, timeout=30)
            runs = json.loads(ls.stdout).get("runs", [])
            if runs:
                status = str(runs[0].get("status", status))
                if status.startswith("finished"):
                    time.sleep(1.0)  # results.json is written before the ServerApp returns
                    return status
        except (subprocess.TimeoutExpired, ValueError, AttributeError):
            pass
    raise RuntimeError(f"the Flower run {run_id} did not finish in time (last status {status}); every Flower "
                       f"process was shut down; see the logs in {work / 'logs'}")
