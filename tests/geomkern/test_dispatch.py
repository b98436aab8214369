"""Backend selection: set_backend as a call and as a context manager, GEOMKERN_BACKEND, the
registry, and that every backend built here agrees with the reference on every op it has."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch

import geomkern as gk
from geomkern import _dispatch
from geomkern.backends import native
from geomkern.ops.kpca import SOLVERS
from _oracle import TOL, assert_close_rel, offsets_from_sizes


def _run(code: str, env_value: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("GEOMKERN_BACKEND", None)
    if env_value is not None:
        env["GEOMKERN_BACKEND"] = env_value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(autouse=True)
def _restore_backend():
    """Whatever a test does to the backend choice, the next test starts from the same state."""
    token = _dispatch._current.set(_dispatch._current.get())
    yield
    _dispatch._current.reset(token)


def test_reference_always_available_and_native_built():
    avail = gk.available_backends()
    assert "reference" in avail
    # CI builds geomkern._C (setup.py), so the native extension must load here
    assert not native.why_not(), native.why_not()
    native_ops = [op for op, impls in gk.registered_ops().items() if "native" in impls]
    # available_backends lists backends that are built AND implement at least one op
    assert ("native" in avail) == bool(native_ops)
    for name in avail:
        assert any(name in impls for impls in gk.registered_ops().values())


def test_set_backend_as_call_stays_in_force():
    start = gk.get_backend()
    gk.set_backend("reference")
    assert gk.get_backend() == "reference"
    gk.set_backend("  AUTO ")  # names are normalised
    assert gk.get_backend() == "auto"
    gk.set_backend(start)


def test_set_backend_as_context_manager_restores():
    start = gk.get_backend()
    with gk.set_backend("reference") as ctx:
        assert gk.get_backend() == "reference"
        assert ctx is not None
        for op in gk.registered_ops():
            assert _dispatch.resolve(op, "cpu") == "reference"
        if "native" in gk.available_backends():
            with gk.set_backend("native"):
                assert gk.get_backend() == "native"
            assert gk.get_backend() == "reference"
    assert gk.get_backend() == start
    with pytest.raises(KeyError):
        with gk.set_backend("reference"):
            raise KeyError("boom")
    assert gk.get_backend() == start, "not restored after an exception"


def test_explicit_backend_falls_back_to_reference_for_ops_it_lacks():
    for name in gk.available_backends():
        with gk.set_backend(name):
            for op, impls in gk.registered_ops().items():
                got = _dispatch.resolve(op, "cpu")
                if _dispatch.serves(op, name, "cpu"):
                    assert got == name
                else:
                    assert got == "reference"


def test_auto_only_picks_available_backends():
    with gk.set_backend("auto"):
        for op in gk.registered_ops():
            assert _dispatch.resolve(op, "cpu") in gk.available_backends()


def test_unknown_and_unavailable_backends():
    with pytest.raises(ValueError, match="not a geomkern backend"):
        gk.set_backend("cuda")
    if "triton" not in gk.available_backends():
        with pytest.raises(RuntimeError, match="backend 'triton' is not available"):
            gk.set_backend("triton")
    if "cupy" not in gk.available_backends():
        with pytest.raises(RuntimeError, match="backend 'cupy' is not available.*pip install cupy-cuda12x"):
            gk.set_backend("cupy")


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="triton can run here (CUDA or TRITON_INTERPRET=1)")
def test_triton_unavailable_on_this_cpu_machine():
    assert "triton" not in gk.available_backends()
    with pytest.raises(RuntimeError, match="not available"):
        gk.set_backend("triton")


def test_env_var_sets_initial_backend():
    show = "import geomkern as gk; print(gk.get_backend()); gk.set_backend('auto'); " \
           "print(gk.get_backend())"
    r = _run(show, "reference")
    assert r.returncode == 0, r.stderr
    # the variable is the initial choice; set_backend overrides it
    assert r.stdout.split() == ["reference", "auto"]
    r = _run("import geomkern as gk; print(gk.get_backend())", "")
    assert r.returncode == 0 and r.stdout.strip() == "auto", r.stderr
    r = _run("import geomkern as gk; print(gk.get_backend())", "bogus")
    assert r.returncode != 0 and "not a geomkern backend" in r.stderr


def _cases(gen):
    X = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    B = torch.randn(9, 3, generator=gen, dtype=torch.float64)
    off = offsets_from_sizes([7, 33])
    fit = gk.kpca(X, off, n_components=2, gamma=0.3)
    # well-posed pre-image problems (ill-posed ones amplify roundoff differences between
    # backends by the conditioning, not by any defect): exact kernel targets of points near B
    x = B[:5] + 0.05 * torch.randn(5, 3, generator=gen, dtype=torch.float64)
    T = gk.rbf_gram(x, B, gamma=0.3)
    Tb = gk.rbf_gram(B[:5], B, gamma=0.3)  # basis points: exactly representable (fixed_point)
    P = torch.randn(4, 9, generator=gen, dtype=torch.float64)
    return {
        "rbf_gram": lambda: gk.rbf_gram(X, B, gamma=0.3),
        "rbf_matmul": lambda: gk.rbf_matmul(X, B, B[:, :2], gamma=0.3),
        "kpca": lambda: torch.cat([gk.kpca(X, off, n_components=2, gamma=0.3, solver=s).alphas
                                   for s in SOLVERS]),
        "project_onto_basis": lambda: gk.project_onto_basis(X, fit, B, gamma=0.3),
        "preimage_gd": lambda: gk.preimage(x + 0.1, B, T, gamma=0.3, steps=30),
        "preimage_fixed_point": lambda: gk.preimage(B[:5] + 0.1, B, Tb, gamma=0.3, steps=30,
                                                    method="fixed_point"),
        "preimage_coordinates": lambda: gk.preimage(x + 0.1, B, T @ P.T, gamma=0.3, steps=10,
                                                    method="coordinates", proj=P),
        "class_moments": lambda: gk.class_moments(X, torch.arange(40) % 4, 4)[2],
        "eigh": lambda: gk.eigh(X.T @ X, k=2)[0],
        "sqrtm_psd": lambda: gk.sqrtm_psd(X.T @ X),
        "kmeans": lambda: gk.kmeans(X, 3, offsets=off, seed=1)[1],
    }


def test_every_backend_agrees_with_reference(gen):
    cases = _cases(gen)
    assert set(cases) == set(gk.registered_ops()), "a registered op has no dispatch check here"
    with gk.set_backend("reference"):
        ref = {op: f() for op, f in cases.items()}
    for name in gk.available_backends():
        with gk.set_backend(name):
            for op, f in cases.items():
                if _dispatch.resolve(op, "cpu") != name:
                    continue
                out = f()
                if op == "kmeans":  # different arithmetic may break near-ties differently
                    assert out.shape == ref[op].shape and bool(torch.isfinite(out).all())
                else:
                    assert_close_rel(out, ref[op], TOL[torch.float64], f"{name}:{op}")


def test_resolve_takes_the_public_preimage_name_with_its_method():
    """gk.preimage dispatches one registered op per method: resolve('preimage', dev, method=m) is
    the backend gk.preimage(..., method=m) runs on; method defaults to gk.preimage's default."""
    import inspect

    from geomkern.ops.preimage import METHODS

    default, variants = _dispatch.METHOD_OPS["preimage"]
    assert set(variants) == set(METHODS), "METHOD_OPS is out of step with gk.preimage's methods"
    assert default == inspect.signature(gk.preimage).parameters["method"].default
    assert set(variants.values()) <= set(gk.registered_ops())
    for choice in ["auto"] + gk.available_backends():
        with gk.set_backend(choice):
            for m, op in variants.items():
                assert gk.resolve("preimage", "cpu", method=m) == _dispatch.resolve(op, "cpu")
            assert gk.resolve("preimage", "cpu") == gk.resolve("preimage", "cpu", method="gd")
    with gk.set_backend("reference"):
        assert {gk.resolve("preimage", "cpu", method=m) for m in METHODS} == {"reference"}


def test_resolve_refuses_unknown_names_and_stray_methods_clearly():
    with pytest.raises(ValueError, match=r"op='pre_image' is not a geomkern op; choose one of \[") as e:
        gk.resolve("pre_image", "cpu")
    for name in ("preimage", "preimage_gd", "rbf_gram", "kpca", "eigh"):
        assert repr(name) in str(e.value)
    with pytest.raises(ValueError, match=r"method='newton' is not a method of 'preimage'; choose one of"):
        gk.resolve("preimage", "cpu", method="newton")
    with pytest.raises(ValueError, match="method is only taken for"):
        gk.resolve("eigh", "cpu", method="gd")
    with pytest.raises(TypeError, match="op must be a string"):
        gk.resolve(None, "cpu")
    with pytest.raises(TypeError, match="device_type must be"):
        gk.resolve("eigh", 0)


def test_resolve_takes_a_device_string_or_torch_device():
    for op in gk.registered_ops():
        assert gk.resolve(op, torch.device("cpu")) == gk.resolve(op, "cpu")
        assert gk.resolve(op, "cuda:0") == gk.resolve(op, "cuda")
        assert gk.resolve(op, torch.device("cuda", 1)) == gk.resolve(op, "cuda")


def test_why_not_is_public():
    assert gk.why_not is _dispatch.why_not and "why_not" in gk.__all__
    assert gk.why_not("reference") == ""
    for name in _dispatch.KNOWN_BACKENDS:
        assert (gk.why_not(name) == "") == (name in gk.available_backends())
    assert "no module registered backend 'bogus'" in gk.why_not("bogus")


# ------------------------------------------- availability per device type, and how a fallback is told

def test_why_not_answers_per_device_type():
    assert gk.why_not("reference", "cuda") == ""
    assert gk.why_not("native", "cpu") == native.why_not("cpu") == ""  # CI builds geomkern._C
    assert gk.why_not("native", torch.device("cuda", 0)) == gk.why_not("native", "cuda:1") \
        == native.why_not("cuda")
    if native._C_cuda is None:
        reason = gk.why_not("native", "cuda")
        assert reason.startswith("geomkern was not compiled with CUDA: geomkern._C_cuda is not built")
        for fix in ("pip install --no-build-isolation .", "CUDA_HOME", "TORCH_CUDA_ARCH_LIST",
                    "GEOMKERN_NO_CUDA"):
            assert fix in reason
    assert "kernels for cpu and cuda tensors only, not mps" in gk.why_not("native", "mps")
    with pytest.raises(TypeError, match="device_type must be"):
        gk.why_not("native", 0)


def test_explicit_native_refuses_a_device_type_it_was_not_built_for(monkeypatch):
    """set_backend("native") with CUDA tensors and no _C_cuda: the ops native has CUDA kernels for
    raise the reason instead of quietly running the reference; the others run the reference as
    for any backend, and auto never raises."""
    missing = native._Extension(None, "geomkern was not compiled with CUDA: test", False)
    monkeypatch.setattr(native, "_CUDA", missing)
    with gk.set_backend("native"):
        for op in ("eigh", "preimage_gd"):  # the ops of csrc/cuda
            with pytest.raises(RuntimeError, match=rf"backend 'native' was asked for .* cannot run {op} on "
                                                   "cuda tensors here: geomkern was not compiled with CUDA"):
                gk.resolve(op, "cuda:0")
        assert gk.resolve("rbf_gram", "cuda") == "reference"
        assert gk.resolve("preimage_gd", "cpu") == "native"  # the CPU kernels are unaffected
    for op in gk.registered_ops():
        assert gk.resolve(op, "cuda") != "native"


@pytest.fixture
def auto_prefers_native(monkeypatch):
    """A copy of the registry with one op that auto prefers native for on CPU (whatever this
    machine's ISA), reports not yet made, and a call that dispatches it."""
    monkeypatch.setattr(_dispatch, "_REGISTRY", copy.deepcopy(_dispatch._REGISTRY))
    monkeypatch.setattr(_dispatch, "_REPORTED", set())
    _dispatch.register("probe", "reference")(lambda: "reference")
    _dispatch.register("probe", "native", devices=("cpu",), auto_on=("cpu",))(lambda: "native")
    return lambda: _dispatch.implementation("probe", "cpu")()


def _fail_load(monkeypatch, error: Exception):
    """geomkern._C's library fails to load with ``error`` (torch.ops.load_library raising, as it
    does for a missing symbol or library); nothing else is touched."""
    def fake(path):
        raise error

    monkeypatch.setattr(native.torch.ops, "load_library", fake)


def _load_cpu():
    return native._find()[0]


def test_a_built_extension_that_cannot_load_warns_once(monkeypatch, auto_prefers_native):
    _fail_load(monkeypatch, OSError("undefined symbol: torch_parallel_for"))
    ext = _load_cpu()
    built = [p.name for p in native._compiled_files("_C")]
    assert ext.module is None and ext.broken and "_C.abi3.so" in built  # the real one, untouched
    for part in ("geomkern._C is built (_C.abi3.so) but cannot be loaded here (torch ",
                 "it needs torch >= 2.10", "OSError: undefined symbol: torch_parallel_for",
                 "rebuild it for this environment", "pip install --no-build-isolation ."):
        assert part in ext.why_not
    monkeypatch.setattr(native, "_CPU", ext)
    monkeypatch.setattr(native, "_CUDA", native._Extension(None, "not compiled with CUDA", False))
    assert gk.why_not("native") == gk.why_not("native", "cpu") == ext.why_not
    assert "native" not in gk.available_backends()
    with pytest.raises(RuntimeError, match="backend 'native' is not available: the native CPU kernels"):
        gk.set_backend("native")
    with pytest.warns(RuntimeWarning, match=r"probe .* runs on the torch reference for cpu tensors, not on "
                                            r"the 'native' backend: the native CPU kernels are unavailable"):
        assert auto_prefers_native() == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: no second warning
        assert auto_prefers_native() == "reference"


def test_a_foreign_compiled_file_is_named(monkeypatch, tmp_path):
    """A file that is not this geomkern's library (an older build's Python module, or garbage)
    is named, said not to load, and the way to rebuild given."""
    (tmp_path / "_C.cpython-399-x86_64-linux-gnu.so").write_bytes(b"")
    monkeypatch.setattr(native, "_PACKAGE", tmp_path)
    ext = _load_cpu()
    assert ext.module is None and ext.broken
    for part in ("geomkern._C is built (_C.cpython-399-x86_64-linux-gnu.so) but cannot be loaded here",
                 "rebuild it for this environment"):
        assert part in ext.why_not


def test_a_never_built_extension_logs_one_info_line(monkeypatch, tmp_path, caplog, auto_prefers_native):
    monkeypatch.setattr(native, "_PACKAGE", tmp_path)  # no compiled file: a pure-torch install
    ext = _load_cpu()
    assert ext.module is None and not ext.broken
    assert f"geomkern._C is not built (no compiled file in {tmp_path})" in ext.why_not
    assert "pip install --no-build-isolation ." in ext.why_not
    monkeypatch.setattr(native, "_CPU", ext)
    with warnings.catch_warnings(), caplog.at_level("INFO", logger="geomkern"):
        warnings.simplefilter("error")  # no warning: the reference is the designed result
        assert auto_prefers_native() == "reference"
        assert auto_prefers_native() == "reference"
    lines = [r for r in caplog.records if r.name == "geomkern"]
    assert len(lines) == 1 and "geomkern._C is not built" in lines[0].getMessage()
