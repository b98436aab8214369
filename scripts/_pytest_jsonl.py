"""pytest plugin for scripts/gpu_session.py: one JSONL record per test as soon as its outcome is
known, so a step cut short by its time limit still says which tests ran, passed and failed, and
why (a junit file is written only when pytest ends; `-q -v` printed only dots: GPU session 11
lost the failing tests' names and messages of three steps so).

    GPU_SESSION_JSONL=out.jsonl GPU_SESSION_STEP=name pytest -p _pytest_jsonl ...  (scripts/ on PYTHONPATH)

Records: {"kind": "test", "step", "nodeid", "outcome", "when", "seconds"}, plus "message" (the
failure's last lines) for a failure or error. Under pytest-xdist only the controller writes (it
sees every worker's reports), so lines never interleave."""
from __future__ import annotations

import json
import os

_CONFIG = None


def pytest_configure(config):
    global _CONFIG
    _CONFIG = config


def _write(rec: dict) -> None:
    path = os.environ.get("GPU_SESSION_JSONL")
    if not path or hasattr(_CONFIG, "workerinput"):  # an xdist worker: the controller writes
        return
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def pytest_runtest_logreport(report):
    # one record per test: its call, or the setup/teardown phase that failed or skipped it
    if report.when != "call" and report.passed:
        return
    rec = {"kind": "test", "step": os.environ.get("GPU_SESSION_STEP", ""), "nodeid": report.nodeid,
           "outcome": report.outcome if report.when == "call" or not report.failed else "error",
           "when": report.when, "seconds": round(report.duration, 3)}
    if report.failed:
        text = report.longreprtext or ""
        rec["message"] = text[-1500:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        rec["message"] = str(report.longrepr[2])[:300]
    _write(rec)
