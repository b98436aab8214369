"""docs/development.md, "Add an op with a native and a Triton backend": the recipe, followed as written
on its Python side. A toy op in a module of its own: a torch reference registered for the op name, a
public function that dispatches, and a native family (``kernels(C, C_cuda)`` and ``auto(C)``, what
geomkern/backends/native/<family>.py holds) added to the native backend's FAMILIES (a real family is
found by its file: tested below); its kernel calls a
stand-in for geomkern._C (compiling a C++ op takes too long for a test; the C++ side, csrc/ops.def, is
checked against the schemas the built library registered). All on copies of the registry."""
from __future__ import annotations

import copy
import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

import geomkern as gk
from geomkern import _dispatch
from geomkern.backends import native

ROOT = Path(__file__).resolve().parents[2]

TOY = '''
from geomkern import _dispatch


def toy_scale_reference(X, alpha):
    return X * alpha


_dispatch.register("toy_scale", "reference")(toy_scale_reference)


def toy_scale(X, alpha):  # the public function: validation, then the dispatched backend
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"X must be a torch.Tensor, got {type(X).__name__}")
    return _dispatch.implementation("toy_scale", X.device.type)(X, alpha)


# what geomkern/backends/native/<family>.py holds
def kernels(C, C_cuda):
    if C is None:
        return {}
    return {"toy_scale": {"cpu": lambda X, alpha: C.toy_scale(X, float(alpha))}}


def auto(C):
    return {"cpu": ("toy_scale",)}  # a measured win, in a real family
'''


class _ToyC:
    """Stands in for geomkern._C with the toy's kernel (the other families' kernels are never
    called here); a CPU variant auto may prefer."""

    def __init__(self):
        self.calls = []

    def cpu_isa(self):
        return "avx2+fma"

    def toy_scale(self, X, alpha):
        self.calls.append(alpha)
        return X * alpha


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy family imported from a temporary module and registered through native.register, on
    copies of the registry; native's CPU extension is the stand-in."""
    (tmp_path / "toy_family.py").write_text("import torch\n" + TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_dispatch, "_REGISTRY", copy.deepcopy(_dispatch._REGISTRY))
    monkeypatch.setattr(_dispatch, "_REPORTED", set())
    sys.modules.pop("toy_family", None)
    mod = importlib.import_module("toy_family")
    fake = _ToyC()
    monkeypatch.setattr(native, "_CPU", native._Extension(fake, "", False))
    monkeypatch.setattr(native, "FAMILIES", native.FAMILIES + (mod,))
    native.register(fake, None)
    yield mod, fake
    sys.modules.pop("toy_family", None)


def test_the_toy_op_is_registered_for_both_backends(toy):
    assert _dispatch.registered_ops()["toy_scale"] == ("reference", "native")
    assert "toy_scale" in native.auto_devices(toy[1])["cpu"]
    assert _dispatch.serves("toy_scale", "native", "cpu")
    assert not _dispatch.serves("toy_scale", "native", "cuda")


def test_auto_and_native_dispatch_cpu_tensors_to_the_toy_kernel(toy):
    mod, fake = toy
    X = torch.arange(6.0).reshape(2, 3)
    assert _dispatch.resolve("toy_scale", "cpu") == "native"
    assert torch.equal(mod.toy_scale(X, 3), X * 3) and fake.calls == [3.0]
    with gk.set_backend("native"):
        assert torch.equal(mod.toy_scale(X, 2), X * 2) and fake.calls == [3.0, 2.0]
    with gk.set_backend("reference"):
        assert _dispatch.resolve("toy_scale", "cpu") == "reference"
        assert torch.equal(mod.toy_scale(X, 5), X * 5) and fake.calls == [3.0, 2.0]


def test_a_device_without_the_kernel_runs_the_reference(toy):
    with gk.set_backend("native"):  # native has no CUDA kernel for the toy
        assert _dispatch.resolve("toy_scale", "cuda") == "reference"


def test_native_asked_for_but_unavailable_is_refused_with_the_reason(toy, monkeypatch):
    mod, fake = toy
    X = torch.ones(2, 2)
    reason = "the native CPU kernels are unavailable: geomkern._C is not built (toy)"
    with gk.set_backend("native"):
        monkeypatch.setattr(native, "_CPU", native._Extension(None, reason, False))
        with pytest.raises(RuntimeError, match=r"backend 'native' was asked for .* cannot run toy_scale on "
                                               r"cpu tensors here: the native CPU kernels are unavailable"):
            mod.toy_scale(X, 2)
    assert _dispatch.resolve("toy_scale", "cpu") == "reference"  # auto falls back instead
    assert torch.equal(mod.toy_scale(X, 2), X * 2) and not fake.calls


def test_a_misspelt_op_is_refused_naming_the_ops_that_exist(toy):
    with pytest.raises(ValueError, match=r"op='toy_scal' is not a geomkern op; choose one of .*'toy_scale'"):
        _dispatch.resolve("toy_scal", "cpu")


def _ops_def():
    """(name, schema after the name) of every GEOMKERN_OP entry in csrc/ops.def."""
    text = re.sub(r"//[^\n]*", "", (ROOT / "csrc" / "ops.def").read_text())
    return re.findall(r'GEOMKERN_OP\(\s*(\w+)\s*,.*?"([^"]*)"', text, re.S)


def test_ops_def_is_what_the_built_library_registered():
    """Every kernel op of csrc/ops.def is registered with its schema, and geomkern_native has no
    other op than those and the three variant ops written by hand in geomkern.cpp."""
    entries = _ops_def()
    assert len(entries) >= 8, entries
    if native._C is None:
        pytest.skip(f"geomkern._C is not loaded: {native.why_not('cpu')}")
    ops = torch.ops.geomkern_native
    for name, schema in entries:
        assert str(getattr(ops, name).default._schema) == f"geomkern_native::{name}{schema}"
    registered = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
                  if s.name.startswith("geomkern_native::")}
    assert registered == {name for name, _ in entries} | {"cpu_isa", "cpu_isas", "select_cpu_isa"}


def test_the_recipe_names_files_that_exist():
    """Every concrete path the recipe's steps name (not a <family> template) is in the tree (the
    edit-site count after them names the files K-Means had before, some now gone)."""
    doc = (ROOT / "docs" / "development.md").read_text()
    section = doc.split("## Add an op with a native and a Triton backend", 1)[1].split("\n## ", 1)[0]
    section = section.split("Edit sites for K-Means", 1)[0]
    paths = set(re.findall(r"`((?:geomkern|csrc|tests|setup)[\w/.]*\.(?:py|cpp|h|def))`", section))
    assert len(paths) >= 6, paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"the recipe names files that do not exist: {missing}"


def test_a_new_family_is_its_file(tmp_path, monkeypatch):
    """A backend's family modules are found, not listed (geomkern.backends.families): a new file in
    the package is a family, a private module or a skipped one is not; and each real backend's
    FAMILIES is exactly its package's public modules."""
    from geomkern.backends import families

    pkg = tmp_path / "toy_backend"
    pkg.mkdir()
    for name, text in {"__init__": "", "_common": "", "operators": "", "scale": "OPERATORS = {}\n"}.items():
        (pkg / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = families("toy_backend", [str(pkg)], skip=("operators",))
        assert [m.__name__ for m in found] == ["toy_backend.scale"]
    finally:
        for name in [m for m in sys.modules if m == "toy_backend" or m.startswith("toy_backend.")]:
            sys.modules.pop(name)
    triton = importlib.import_module("geomkern.backends.triton")  # imports without triton too
    for folder, skip, fams in [("native", (), native.FAMILIES),
                               ("triton", ("operators",), getattr(triton, "FAMILIES", None))]:
        if fams is None:  # triton is not installed: no family is imported
            continue
        files = sorted(p.stem for p in (ROOT / "geomkern" / "backends" / folder).glob("*.py")
                       if not p.stem.startswith("_") and p.stem not in skip)
        assert [m.__name__.rsplit(".", 1)[1] for m in fams] == files, folder


def _triton_backend():
    pytest.importorskip("triton", reason="the Triton backend's families need triton")
    return importlib.import_module("geomkern.backends.triton")


def test_operators_registers_what_each_triton_family_names():
    """operators.py holds no op of its own: it registers each family's OPERATORS, every one of them,
    as torch.ops.geomkern_triton.<name> with the function's signature."""
    import inspect

    T = _triton_backend()
    ops = importlib.import_module("geomkern.backends.triton.operators")
    named = {name: fn for fam in T.FAMILIES for name, fn in getattr(fam, "OPERATORS", {}).items()}
    assert {"rbf_gram", "rbf_matmul", "project_onto_basis", "kmeans_assign"} <= set(named)
    assert set(ops.OPERATORS) == set(named)
    for name, fn in named.items():
        schema = getattr(torch.ops.geomkern_triton, name).default._schema
        assert [a.name for a in schema.arguments] == list(inspect.signature(fn).parameters), name
