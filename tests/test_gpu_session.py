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
OPS = ("rbf_gram", "rbf_gram_cross", "rbf_matmul", "projection", "preimage", "eigh", "kmeans_assign", "kpca")
STEPS = ("wheel", "wheel:native", "peers", "headline", "schemes", "gpu_tests", "build", "native", "rest:model")

def _checkout_wheel(dest: Path) -> Path:
    """A geomkern wheel put together from the checkout as it is (its Python files and the
    libraries built in geomkern/), in a second: the session's wheel step is plumbing to check
    here (install, which files load, the tests against them); whether a wheel built from the
    sdist works is tests/test_packaging.py's question."""
    import base64
    import hashlib
    import zipfile
    dest.mkdir(parents=True, exist_ok=True)
    whl = dest / "geomkern-0.1.0-cp310-abi3-linux_x86_64.whl"
    files = sorted(p for p in (ROOT / "geomkern").rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and (p.suffix == ".py" or p.name in ("_C.abi3.so", "_C_cuda.abi3.so")))
    info = "geomkern-0.1.0.dist-info"
    meta = {f"{info}/METADATA": "Metadata-Version: 2.1\nName: geomkern\nVersion: 0.1.0\n",
            f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp310-abi3-linux_x86_64\n"}
    record = []
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in [(str(p.relative_to(ROOT)), p.read_bytes()) for p in files] + \
                [(k, v.encode()) for k, v in meta.items()]:
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    return whl


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    pytest.importorskip("triton", reason="the dry run compiles Triton kernels for sm_90")
    out = tmp_path_factory.mktemp("gpu-session")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(GPU_SESSION_DRY="1", OUT=str(out), PYTHON=sys.executable,
               GPU_SESSION_BUDGET_S="900",
               GPU_SESSION_WHEEL=str(_checkout_wheel(tmp_path_factory.mktemp("wheel"))))
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh")], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = [json.loads(line) for line in (out / "session.jsonl").read_text().splitlines()]
    return recs, out, proc.stdout


@pytest.mark.xdist_group("gpu-session-dry-run")
def test_every_step_ran_and_succeeded(session):
    recs, _, stdout = session
    steps = {r["step"]: r for r in recs if r.get("kind") == "step"}
    assert set(STEPS) <= set(steps), f"missing steps: {set(STEPS) - set(steps)}\n{stdout[-2000:]}"
    for name in STEPS:
        assert steps[name]["status"] == "ok", f"{name}: {steps[name]}"
    assert steps["findings"]["status"] == "skipped" and "needs a GPU" in steps["findings"]["why"]
    assert steps["findings:eigh"]["status"] == "skipped" and "eigh_crossover" in steps["findings:eigh"]["why"]
    assert recs[0]["kind"] == "env" and recs[0]["dry"] is True
    assert recs[-1]["kind"] == "end"
    # the carried wheel's steps first, then the peers (the build only starts before it, in the
    # background; here the source build runs too: a dry run's wheel never serves, no GPU)
    assert [r["step"] for r in recs if r.get("kind") == "step"][:3] == ["wheel", "wheel:native", "peers"]
    assert steps["peers"]["peer_ops"] == sorted(OPS) and steps["peers"]["peers_file"].startswith("peers-cpu-")


@pytest.mark.xdist_group("gpu-session-dry-run")
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


@pytest.mark.xdist_group("gpu-session-dry-run")
def test_build_and_tests_are_real(session):
    recs, _, _ = session
    steps = {r["step"]: r for r in recs if r.get("kind") == "step"}
    assert steps["build"]["built"] and steps["build"]["loads"], steps["build"]
    # the build record says whether libstdc++ stayed shared (the GPU image's crash, session 12)
    needs = steps["build"]["needs_libstdcxx"]
    assert needs and all(v in (True, None) for v in needs.values()), needs
    assert steps["gpu_tests"]["passed"] > 10 and steps["gpu_tests"]["failures"] == 0


@pytest.mark.xdist_group("gpu-session-dry-run")
def test_wheel_step_installs_and_tests_the_carried_wheel(session):
    """The first step pip-installs the carried wheel into a folder of its own and imports geomkern
    from there, not from the checkout: its libraries are the ones mapped, in the probe and in the
    pytest that tests them; no GPU here, so why_not('native', 'cuda') gives a reason."""
    recs, _, _ = session
    steps = {r["step"]: r for r in recs if r.get("kind") == "step"}
    wheel, tests = steps["wheel"], steps["wheel:native"]
    site = wheel["site"]
    assert wheel["wheel"].startswith("geomkern-") and wheel["from_wheel"], wheel
    assert wheel["geomkern_file"].startswith(site) and wheel["loaded_so"], wheel
    assert all(p.startswith(site) for p in wheel["loaded_so"]), wheel["loaded_so"]
    assert any(p.endswith("/geomkern/_C.abi3.so") for p in wheel["loaded_so"])
    assert not wheel["why_not_cpu"] and wheel["why_not_cuda"], wheel
    needs = wheel["needs_libstdcxx"]
    assert needs and all(v in (True, None) for v in needs.values()), needs
    with_cuda = (ROOT / "geomkern" / "_C_cuda.abi3.so").exists()
    if with_cuda:  # in the wheel: loaded, and it says why it cannot run here
        assert any(p.endswith("/geomkern/_C_cuda.abi3.so") for p in wheel["loaded_so"]), wheel["loaded_so"]
        assert "sees no CUDA device" in wheel["why_not_cuda"] and wheel["cuda_built"], wheel
    # the loading tests of tests/geomkern/test_cuda_native.py, two of them on the wheel's _C_cuda
    assert tests["status"] == "ok" and tests["failures"] == 0, tests
    assert tests["passed"] == (3 if with_cuda else 1), tests
    assert tests["pytest_from_wheel"] and tests["pytest_loaded_so"], tests
    assert any(r["step"] == "wheel:native" for r in recs if r.get("kind") == "test")


@pytest.mark.xdist_group("gpu-session-dry-run")
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


@pytest.mark.xdist_group("gpu-session-dry-run")
def test_dry_run_reports_every_test_as_it_finishes(session):
    """The GPU tests' outcomes reach the JSONL one by one (scripts/_pytest_jsonl.py), before their
    step's own record: a step cut short still names what ran."""
    recs, _, _ = session
    order = [r.get("kind") if r.get("kind") != "step" else r["step"] for r in recs]
    tests = [r for r in recs if r.get("kind") == "test" and r["step"] == "gpu_tests"]
    steps = {r["step"]: r for r in recs if r.get("kind") == "step"}
    assert sum(r["outcome"] == "passed" for r in tests) == steps["gpu_tests"]["passed"]
    assert order.index("test") < order.index("gpu_tests")
    assert any(r["step"] == "native" for r in recs if r.get("kind") == "test")


def test_plugin_records_failures_with_their_message(tmp_path):
    """One record per test, a failure's and a broken fixture's message included."""
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2, 'the bad message'\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('setup broke')\n"
        "def test_err(broken): pass\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_skip(): pass\n")
    out = tmp_path / "t.jsonl"
    env = {**os.environ, "GPU_SESSION_JSONL": str(out), "GPU_SESSION_STEP": "sample",
           "PYTHONPATH": str(ROOT / "scripts")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "_pytest_jsonl", "test_sample.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:]
    recs = {r["nodeid"].split("::")[1]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(recs) == {"test_ok", "test_bad", "test_err", "test_skip"}
    assert {k: r["outcome"] for k, r in recs.items()} == {
        "test_ok": "passed", "test_bad": "failed", "test_err": "error", "test_skip": "skipped"}
    assert "the bad message" in recs["test_bad"]["message"]
    assert "setup broke" in recs["test_err"]["message"]
    assert recs["test_skip"]["message"].endswith("not here") and recs["test_ok"]["step"] == "sample"


@pytest.mark.parametrize("script", ["scripts/gpu_findings.py", "scripts/tf32x3_schemes.py",
                                    "scripts/sm90_report.py", "scripts/gpu_peers.py"])
def test_gpu_scripts_imports_resolve(script):
    """The GPU-only scripts import some names inside their functions (they run on CUDA only, so
    the dry run never calls them): every such name must still exist. GPU session 11 lost the kpca
    finding to a helper the test tree's move (tests/geomkern) had renamed."""
    import ast
    import importlib
    tree = ast.parse((ROOT / script).read_text())
    code = ("import sys, importlib; sys.path[:0] = [{!r}, {!r}, {!r}]\n".format(
        str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "geomkern")))
    checks = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                checks += [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                checks += [(a.name, None) for a in node.names]
    assert checks, f"{script}: no function-level imports found (the test looks at nothing)"
    # the peers' optional providers: absent here, and recorded as skipped with the reason there
    optional = ("pykeops", "cupy")
    checks = [c for c in checks if c[0].split(".")[0] not in optional]
    for mod, name in sorted(set(checks), key=lambda c: (c[0], c[1] or "")):
        code += (f"m = importlib.import_module({mod!r})\n" +
                 (f"assert hasattr(m, {name!r}), '{mod}.{name} is gone'\n" if name else ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_gpu_scripts_paths_exist():
    """Every repository path the benchmark and session scripts spell as ROOT / "..." exists (the
    tests' move to tests/geomkern left sm90_report's nvcc part loading tests/test_nvcc_compile.py,
    which only a full compile report, never CI's --no-cuda one, reads). Outputs and build folders
    the scripts create are exempt."""
    import re
    created = {"gpu-out"}
    seen = 0
    for f in sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "scripts").glob("*.py")):
        for m in re.finditer(r'ROOT((?:\s*/\s*"[^"]+")+)', f.read_text()):
            rel = "/".join(re.findall(r'"([^"]+)"', m.group(1)))
            seen += 1
            if rel not in created:
                assert (ROOT / rel).exists(), f"{f.relative_to(ROOT)}: ROOT / {rel} does not exist"
    assert seen >= 10


@pytest.mark.parametrize("only, chosen", [
    ("rest:bench", {"rest:bench"}),               # one step by its whole name (session 12 ran none)
    ("rest", {"rest:model", "rest:bench"}),       # a family
    ("build,native", {"build", "native"}),
    ("findings", {"findings", "findings:eigh"}),
    ("wheel", {"wheel", "wheel:native"}),
    ("", {"wheel", "wheel:native", "peers", "headline", "schemes", "gpu_tests", "findings", "build", "native",
          "findings:eigh", "rest:model", "rest:bench"}),
])
def test_steps_are_chosen_by_name_or_family(only, chosen):
    """GPU_SESSION_STEPS picks steps by their whole name or their family: session 12's third call
    named rest:bench, and the driver ran nothing, because only the family matched."""
    names = ["wheel", "wheel:native", "peers", "headline", "schemes", "gpu_tests", "findings", "build", "native",
             "findings:eigh", "rest:model", "rest:bench"]
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('gs', {str(ROOT / 'scripts' / 'gpu_session.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"print(','.join(n for n in {names!r} if m.wanted(n)))")
    env = {**os.environ, "GPU_SESSION_STEPS": only, "OUT": "/tmp/gpu-session-wanted-test"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert set(res.stdout.strip().split(",")) - {""} == chosen


def test_findings_refuses_an_unknown_finding(tmp_path):
    """gpu_findings.py --only names what it runs (the session runs eigh_crossover after the build);
    a misspelt name is refused before anything runs, with the valid names."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_findings.py"), "--jsonl",
                          str(tmp_path / "f.jsonl"), "--only", "eigh_crosover"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "eigh_crosover" in res.stderr and "eigh_crossover" in res.stderr, res.stderr
    assert not (tmp_path / "f.jsonl").exists()


def test_eigh_crossover_records(tmp_path):
    """The eigh crossover finding's records, run on CPU (native's eigh is the reference there, so
    the speedups mean nothing; the grid, the deadline and the equal-result check are what runs)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_findings", ROOT / "scripts" / "gpu_findings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    recs = []
    mod.eigh_crossover(recs.append, budget_s=30.0, device="cpu", ns=(5, 9), batches=(1, 3))
    assert [(r["batch"], r["n"]) for r in recs] == [(1, 5), (1, 9), (3, 5), (3, 9)]
    for r in recs:
        assert r["reference_us"] > 0 and r["native_us"] > 0 and r["eigenvalue_rel_diff"] < 1e-6, r
    late = []
    mod.eigh_crossover(late.append, budget_s=-1.0, device="cpu", ns=(5,), batches=(1,))
    assert late == [{"finding": "eigh_crossover", "batch": 1, "n": 5, "skipped": "budget"}]


def test_kpca_solver_records():
    """The kpca solver finding's records, run on CPU on small clusters (the times mean nothing
    here; every solver's eigenvalues must agree with the dense solve's)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_findings", ROOT / "scripts" / "gpu_findings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    recs = []
    mod.kpca_solver(recs.append, device="cpu", cases=(("3 clusters", [40, 60, 90], 8),), d=3)
    (r,) = recs
    assert r["clusters"] == 3 and r["fastest"] in ("dense", "subspace", "auto"), r
    assert all(r[f"{s}_us"] > 0 for s in ("dense", "subspace", "auto")), r
    assert r["subspace_eigenvalue_rel_diff"] < 1e-4 and r["auto_eigenvalue_rel_diff"] < 1e-4, r
    late = []
    mod.kpca_solver(late.append, budget_s=-1.0, device="cpu", cases=(("3 clusters", [40], 8),), d=3)
    assert late == [{"finding": "kpca_solver", "case": "3 clusters", "skipped": "budget"}]


def _peers():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_peers", ROOT / "scripts" / "gpu_peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_peers_step_is_the_first_measuring_step():
    """In the driver's main(), the peers step (issue 40) runs before every other step's call."""
    import ast
    tree = ast.parse((ROOT / "scripts" / "gpu_session.py").read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    calls = [n for n in ast.walk(main) if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("step", "findings")]
    first = min(calls, key=lambda n: (n.lineno, n.col_offset))
    assert isinstance(first.args[0], ast.Constant) and first.args[0].value == "peers", ast.dump(first)[:200]


def test_peers_dry_run_records(tmp_path):
    """gpu_peers.py's dry run (CPU, toy shapes): every op, every record of the summary schema with
    an err_bound, geomkern's and the reference's results scored and within their bounds, the
    CUDA-only providers skipped with a reason."""
    mod = _peers()
    jsonl = tmp_path / "s.jsonl"
    path = mod.measure(mod.DRY_CASES, "cpu", tmp_path, budget_s=60, rounds=1, dry=True, jsonl=jsonl)
    assert path.name.startswith("peers-cpu-") and path.suffix == ".json"
    recs = json.loads(path.read_text())
    assert {r["op"] for r in recs} == set(OPS) == set(mod.OPS)
    for r in recs:
        assert set(mod.FIELDS) <= set(r), r
        assert isinstance(r["err_bound"], float) and r["err_bound"] > 0, r
        assert r["device"] == "cpu" and r["dry"] is True
        if r.get("skipped"):
            assert r["us"] is None and r["max_err"] is None and r["skipped"], r
        else:
            assert r["us"] > 0 and r["max_err"] is not None, r
    got = {(r["op"], r["provider"]): r for r in recs}
    for op in OPS:
        for prov in ("geomkern", "torch_reference"):
            assert got[(op, prov)]["max_err"] <= got[(op, prov)]["err_bound"], got[(op, prov)]
        assert got[(op, "geomkern")]["backend"], got[(op, "geomkern")]
        assert "CUDA" in got[(op, "torch_compile")]["skipped"] or "eigen" in got[(op, "torch_compile")]["skipped"]
    for op in mod.FLOOR_OPS:
        assert got[(op, "cublas_floor")]["us"] > 0
    assert got[("rbf_matmul", "keops")]["skipped"] and got[("eigh", "cupy")]["skipped"]
    assert got[("rbf_gram", "cdist_exp")]["us"] > 0
    assert len(jsonl.read_text().splitlines()) == len(recs)


def test_peers_compile_formulas_are_the_ops():
    """The plain-torch formulas the GPU run compiles (torch_compile providers) compute each op: run
    eagerly on the dry cases, within the op's bound of float64."""
    mod = _peers()
    seen = set()
    for op, _, args in mod.DRY_CASES:
        case = mod.build(op, args, "cpu")
        if case.formula is not None:
            seen.add(op)
            err = case.score(case.formula(), case.exact)
            assert err <= mod.BOUND[op], (op, err)
    assert seen == {"rbf_gram", "rbf_gram_cross", "rbf_matmul", "projection", "kmeans_assign", "preimage"}


def _rec(op, provider, us, err=1e-7, bound=1e-5, shape="s"):
    return {"op": op, "shape": shape, "provider": provider, "us": us, "max_err": err, "err_bound": bound,
            "device": "h200", "commit": "abc"}


@pytest.mark.parametrize("case, want", [
    ("pass", {"fastest": True, "accurate": True, "floor": True, "ok": True}),
    ("slower_than_peer", {"fastest": False, "accurate": True, "floor": True, "ok": False}),
    ("inaccurate", {"fastest": True, "accurate": False, "floor": True, "ok": False}),
    ("over_floor", {"fastest": True, "accurate": True, "floor": False, "ok": False}),
    ("no_floor", {"fastest": True, "accurate": True, "floor": False, "ok": False}),
])
def test_peers_check(case, want):
    """The acceptance checker on synthetic records: a pass and each kind of failure. A faster peer
    outside its own bound and the cuBLAS floor are never the peer to beat."""
    mod = _peers()
    recs = [_rec("rbf_gram", "geomkern", 100.0), _rec("rbf_gram", "torch_reference", 400.0),
            _rec("rbf_gram", "torch_compile_tf32", 50.0, err=3e-3),   # faster, outside its bound
            _rec("rbf_gram", "keops", None, err=None) | {"skipped": "no"},
            _rec("rbf_gram", "cublas_floor", 80.0)]                   # faster, but not a peer
    if case == "slower_than_peer":
        recs.append(_rec("rbf_gram", "cdist_exp", 90.0))
    elif case == "inaccurate":
        recs[0]["max_err"] = 2e-5
    elif case == "over_floor":
        recs[-1]["us"] = 70.0  # 100 / 70 > 1.3
    elif case == "no_floor":
        recs.pop()
    (row,) = mod.check(recs)
    assert {k: row[k] for k in want} == want, row


def test_peers_check_floor_only_for_dot_ops(tmp_path):
    """eigh and kpca have no floor test; --check exits 0 only when every case passes."""
    mod = _peers()
    recs = [_rec("eigh", "geomkern", 10.0, shape="a"), _rec("eigh", "cupy", 12.0, shape="a"),
            _rec("kpca", "torch_reference", 5.0, shape="b")]
    rows = mod.check(recs)
    assert rows[0]["ok"] and rows[0]["floor"] is None
    assert not rows[1]["ok"] and rows[1]["why"] == "no geomkern timing"
    f = tmp_path / "p.json"
    f.write_text(json.dumps(recs[:2]))
    assert mod.main(["--check", str(f)]) == 0
    f.write_text(json.dumps(recs))
    assert mod.main(["--check", str(f)]) == 1
