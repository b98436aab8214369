"""The pytest-benchmark suites as their users run them (benchmarks/, at --smoke size): a -k subset
writes only where the command line says (and pytest-benchmark's .benchmarks/), never into the
checkout; pytest-benchmark's own JSON has a group per workload, named parameters, the quality
check and the same-run ratios in extra_info; --save-results writes the summary into the directory
it names and nowhere else.

What a run writes is recorded by an audit hook inside its process (every file opened for writing,
renamed or copied), not by comparing the checkout before and after, which other work in the same
tree would disturb."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytest_benchmark", reason="pytest-benchmark is not installed: pip install pytest-benchmark")

ROOT = Path(__file__).resolve().parents[1]

# runs pytest with an audit hook that logs every path the process opens for writing, renames or
# copies to, and writes that list to argv[1] when pytest returns
_LOGGED_PYTEST = r"""
import os, sys
written = set()
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def hook(event, args):
    if event == "open":
        path, mode, flags = args
        if isinstance(path, (str, bytes, os.PathLike)) and (
                any(c in (mode or "") for c in "wax+") or (isinstance(flags, int) and flags & WRITE)):
            written.add(os.path.abspath(os.fsdecode(path)))
    elif event in ("os.rename", "shutil.copyfile", "shutil.move"):
        written.add(os.path.abspath(os.fsdecode(args[1])))

sys.addaudithook(hook)
import pytest
rc = pytest.main(sys.argv[2:])
log = sorted(written)
with open(sys.argv[1], "w") as f:
    f.write("\n".join(log))
sys.exit(rc)
"""


def _run_suite(tmp_path: Path, args: list[str], env_extra: dict | None = None) -> str:
    """pytest on a suite from the repository root, as a user types it; asserts that it passed and
    wrote nothing inside the checkout but pytest-benchmark's store and bytecode caches."""
    # as a user's own pytest: not a pytest-xdist worker's (PYTEST_XDIST_WORKER, which make test's
    # workers set, turns pytest-benchmark's timing off, and --benchmark-only then refuses to run)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, **(env_extra or {})}
    log = tmp_path / "written.txt"
    proc = subprocess.run([sys.executable, "-c", _LOGGED_PYTEST, str(log), *args, "--benchmark-only", "--smoke",
                           "-q", "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"pytest {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    written = [Path(p) for p in log.read_text().splitlines()]
    assert written, "the audit hook saw no write at all (not even --benchmark-json): it is not working"
    inside = [p for p in written if p.is_relative_to(ROOT) and not p.is_relative_to(tmp_path)
              and not p.is_relative_to(ROOT / ".benchmarks") and "__pycache__" not in p.parts]
    assert not inside, f"pytest {' '.join(args)} wrote into the checkout: {[str(p.relative_to(ROOT)) for p in inside]}"
    return proc.stdout


def test_ggeur_subset_writes_only_the_json_it_is_given(tmp_path):
    # the reproduction: a -k subset once rewrote the committed results of every dtype
    out = tmp_path / "bench.json"
    _run_suite(tmp_path, ["benchmarks/test_ggeur_speed.py", "-k", "float32", "--benchmark-json", str(out)])
    runs = json.loads(out.read_text())
    assert "torch" in runs["machine_info"]["geomkern_bench"]
    benches = {b["name"].split("[")[0]: b for b in runs["benchmarks"]}
    assert set(benches) == {"test_ours_aggregate", "test_ours_augment", "test_official_per_sample"}
    for b in runs["benchmarks"]:
        assert b["params"] == {"dtype": "float32"}, b["params"]
        assert b["group"] and "float32" in b["group"], b["group"]
        assert b["extra_info"]["provider"]
    assert len({b["group"] for b in runs["benchmarks"]}) == 3  # one workload per group
    assert benches["test_ours_aggregate"]["extra_info"]["eig_rel_err"] <= 5e-4
    official = benches["test_official_per_sample"]
    # timed one sample per round, so the table's times are per sample
    assert "per sample" in official["group"]
    assert official["stats"]["rounds"] == official["extra_info"]["samples_timed"]
    augment = benches["test_ours_augment"]["extra_info"]
    assert abs(augment["noise_z"]) < 5 and abs(official["extra_info"]["noise_z"]) < 5
    ratios = augment["speedup"]
    assert any("augment only [float32]" in label for label in ratios), ratios
    assert all(v > 0 for v in ratios.values())


def test_cpu_floor_subset_by_provider_and_save_results(tmp_path):
    import geomkern as gk

    if "native" not in gk.available_backends():
        pytest.skip("benchmarks/test_cpu_floor.py needs the native backend (geomkern._C is not built)")
    out, store = tmp_path / "bench.json", tmp_path / "store"
    text = _run_suite(tmp_path, ["benchmarks/test_cpu_floor.py", "-k", "kpca and not grams", "--benchmark-json",
                                 str(out), "--save-results", str(store)], {"GK_BENCH_ROUNDS": "1"})
    runs = json.loads(out.read_text())["benchmarks"]
    assert {b["params"]["provider"] for b in runs} == {"sklearn", "gk"}  # the floor left out, nothing else
    assert all(set(b["params"]) == {"round", "provider"} and b["group"] == "cpu_floor: kpca+projection, 3 clusters, d 8"
               for b in runs)
    gk_bench = next(b for b in runs if b["params"]["provider"] == "gk")
    assert gk_bench["extra_info"]["eig_rel_err"] <= 1e-5
    assert any("vs sklearn ARPACK" in label for label in gk_bench["extra_info"]["speedup"])
    assert [p.name for p in store.iterdir()] == ["cpu_floor-cpu.json"], text[-2000:]
    saved = json.loads((store / "cpu_floor-cpu.json").read_text())
    assert saved["smoke"] is True and "--save-results" in saved["command"]
    assert set(saved["results"]) == {"kpca: sklearn KernelPCA[arpack] + rbf_kernel",
                                     "kpca: gk.kpca + project_onto_basis [auto]"}
    assert [r["label"] for r in saved["ratios"]] == ["kpca+projection: gk vs sklearn ARPACK (goal >= 6x)"]


def test_benchmarks_holds_only_suites():
    """benchmarks/ is the pytest-benchmark suites (test_*.py, each timing through the `benchmark`
    fixture) and their conftest.py; tools live in scripts/, one-off measurements in studies/."""
    files = sorted(p.name for p in (ROOT / "benchmarks").iterdir()
                   if p.is_file() and p.suffix in {".py", ".sh", ".md", ".ipynb"})
    others = [f for f in files if f != "conftest.py" and not (f.startswith("test_") and f.endswith(".py"))]
    assert not others, f"benchmarks/ holds only pytest-benchmark suites; move {others} to scripts/ or studies/"
    untimed = [f for f in files if f.startswith("test_")
               and "benchmark" not in (ROOT / "benchmarks" / f).read_text()]
    assert not untimed, f"not pytest-benchmark suites (no `benchmark` fixture): {untimed}"
