"""fedsim's Flower apps above the runner: a whole run in Flower's Simulation Engine
(``run_simulation``: ``fedsim run --engine flower``) and the ServerApp of a real deployment
(``app``, whose main is ``deployed``; fedsim/flower/deploy.py starts one). Each hands the runner a
``FlowerEngine`` (fedsim/flower/engine.py, below the runner); the clients are ``client_app.app``.
"""
from __future__ import annotations

import os

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from .. import runner
from ..config import RunConfig, read_config_json
from . import _reaper
from .client_app import app as client_app
from .engine import ROUND_TIMEOUT, FlowerEngine


def run_simulation(cfg, out, *, resume: bool = False, progress: bool = True, changes: dict | None = None,
                   round_timeout: float = ROUND_TIMEOUT, num_cpus: int | None = None) -> dict:
    """``runner.run`` in Flower's Simulation Engine (Ray backend): n_clients virtual SuperNodes
    running ``client_app.app``, this process running the ServerApp. Every check runs here first
    (``runner.plan``), before Ray starts and before anything is written."""
    from flwr.simulation import run_simulation as flwr_run_simulation  # Ray: only for the Simulation Engine

    plan = runner.plan(cfg, out, resume=resume, changes=changes, engine=FlowerEngine(None))
    held: dict = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            held["results"] = runner.execute(plan, engine=FlowerEngine(grid, round_timeout=round_timeout),
                                             progress=progress)
        except BaseException as exc:  # re-raised below, in the caller's thread
            held["error"] = exc

    cpus = num_cpus or int(os.environ.get("FEDSIM_FLOWER_CPUS", 0)) or os.cpu_count() or 1
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": cpus, "include_dashboard": False}}
    _reaper.start()  # Ray's processes go too if this process is killed outright
    try:
        flwr_run_simulation(server_app=server, client_app=client_app, num_supernodes=plan.cfg.n_clients,
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
        cfg = RunConfig.from_dict(read_config_json(path)[0])  # [1], the engine it records: not needed
    else:
        cfg = runner.load_config(path)
    runner.run(cfg, Path(str(rc["out"])), progress=False,
               engine=FlowerEngine(grid, round_timeout=float(rc.get("round-timeout", ROUND_TIMEOUT))))
