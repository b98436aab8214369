"""The GPU session's dry run (scripts/gpu_session.sh with GPU_SESSION_DRY=1): every step of the one
prepared GPU call runs here on CPU -- the build (into a scratch folder), compile-only sm_90 reports
in place of the timings, the tf32x3 schemes' SASS, the Triton tests under the interpreter -- and
each leaves its records in session.jsonl. A GPU draw is rare: this keeps the script from rotting
between draws. Skipped without triton's NVIDIA tools (the compile reports need its ptxas)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("headline", "schemes", "gpu_tests", "build", "native", "rest:model")

triton = pytest.importorskip("triton", reason="the dry run compiles Triton kernels for sm_90")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-session")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(GPU_SESSION_DRY="1", OUT=str(out), PYTHON=sys.executable,
               GPU_SESSION_BUDGET_S="900")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh")], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = [json.loads(line) for line in (out / "session.jsonl").read_text().splitlines()]
    return recs, out, proc.stdout


def test_every_step_ran_and_succeeded(session):
    recs, _, stdout = session
    steps = {r["step"]: r for r in recs if r.get("kind") == "step"}
    assert set(STEPS) <= set(steps), f"missing steps: {set(STEPS) - set(steps)}\n{stdout[-2000:]}"
    for name in STEPS:
        assert steps[name]["status"] == "ok", f"{name}: {steps[name]}"
    assert steps["findings"]["status"] == "skipped" and "needs a GPU" in steps["findings"]["why"]
    assert recs[0]["kind"] == "env" and recs[0]["dry"] is True
    assert recs[-1]["kind"] == "end"


def test_records_are_written_as_they_are_made(session):
    """The report records come before their step's own record: appended one by one, not at the
    end of the step (a step killed by its limit keeps what it finished)."""
    recs, _, _ = session
    order = [r.get("step") or ("report" if "kernel" in r else "?") for r in recs]
    first_report = order.index("report")
    assert first_report < order.index("headline")
    reports = [r for r in recs if "kernel" in r]
    assert {r["tf32x3_scheme"] for r in reports if r["precision"] == "tf32x3"} == {"split", "builtin"}
    for r in reports:
        assert r["predicted_us"] and r["predicted_worst_us"] >= r["predicted_us"] * 0.999
        assert "not run" in r["label"]


def test_build_and_tests_are_real(session):
    recs, _, _ = session
    steps = {r["step"]: r for r in recs if r.get("kind") == "step"}
    assert steps["build"]["built"] and steps["build"]["loads"], steps["build"]
    assert steps["gpu_tests"]["passed"] > 10 and steps["gpu_tests"]["failures"] == 0


def test_schemes_sass(session):
    """The tf32x3 schemes compiled for sm_90: 'planes' issues its products as one pipelined
    chain (no wait that drains the tensor cores), 'builtin' and 'split' wait on each group."""
    recs, _, _ = session
    sass = {r["scheme"]: r for r in recs if r.get("kind") == "scheme_sass"}
    assert set(sass) >= {"builtin", "split", "planes", "tf32"}
    assert sass["planes"]["wgmma_full_waits_per_k32"] == 0
    assert sass["builtin"]["wgmma_full_waits_per_k32"] >= 3
    assert sass["split"]["hot_loop_instructions_per_k32"] < sass["builtin"]["hot_loop_instructions_per_k32"]
    for r in sass.values():
        if r["scheme"] != "ieee":
            assert r["hgmma_per_k32"] == (4 if r["scheme"].startswith("tf32") else 12)
