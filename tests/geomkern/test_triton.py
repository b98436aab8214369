"""Triton kernels (geomkern/backends/triton) against the float64 torch references.

Every case draws fresh random inputs (seed printed, ``--seed`` replays it), poisons every buffer
the launchers allocate (NaN, or -1 for labels) so an element a kernel fails to write fails the
comparison, and bounds |out - ref| / |ref| per dtype against the float64 reference evaluated on
the same rounded inputs.

How the CPU cases run: Triton decides between compiling and interpreting when a kernel is
decorated, i.e. when geomkern.backends.triton is imported -- and conftest.py has already imported it
(compiled) by the time this module is collected. Setting TRITON_INTERPRET=1 here would also leak
into every other test module (their ``backend`` fixture would then interpret Triton on their
large sizes). So the CPU cases run in one worker subprocess started with TRITON_INTERPRET=1
(spawned once per session, ~5 s); the check functions below run there unchanged, and failures
come back with the worker's traceback. Run under ``TRITON_INTERPRET=1 pytest tests/geomkern/test_triton.py``
they run in-process instead. The ``cuda`` cases (marked gpu) run in this process on CUDA tensors
with compiled kernels. ``test_kernels_compile_for_sm90`` compiles what the launchers would launch
for an H100 (no GPU needed) and checks the shared memory fits, so GPU-only compile errors show up
on a CPU machine too.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not importable here: pip install triton")

import geomkern as gk  # noqa: E402
from _oracle import DEVICES, HALF_TOL, TOL, assert_close_rel, offsets_from_sizes, table  # noqa: E402
from geomkern.backends.triton import _common  # noqa: E402
from geomkern.backends.triton import kmeans as tkmeans  # noqa: E402
from geomkern.backends.triton import kpca as tkpca  # noqa: E402
from geomkern.backends.triton import preimage as tpre  # noqa: E402
from geomkern.backends.triton import rbf as trbf  # noqa: E402
from geomkern.ops import kpca as rkpca  # noqa: E402
from geomkern.ops import rbf as rrbf  # noqa: E402

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
BOUND = {**TOL, **HALF_TOL}
TF32_BOUND = 5e-3
ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
FLOAT_DTYPES = (torch.float32, torch.float64)


# ------------------------------------------------------------------------------ test plumbing

@pytest.fixture
def run(triton_run):
    """run(check, device, *args): the check on CUDA here, on CPU in the interpreter worker."""
    return triton_run


@contextlib.contextmanager
def _poisoned():
    """Every buffer a launcher allocates starts as NaN (-1 for integers)."""
    orig = _common.empty

    def empty(shape, dtype, device):
        t = orig(shape, dtype, device)
        return t.fill_(float("nan") if dtype.is_floating_point else -1)

    _common.empty = empty
    try:
        yield
    finally:
        _common.empty = orig


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(gen, *shape, dtype, device, scale=1.0, shift=0.0):
    t = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift
    return t.to(dtype).to(device)


def _gamma(D, gen):
    return float(0.2 + 1.8 * torch.rand((), generator=gen, dtype=torch.float64)) / (2.0 * D)


def _d64(t):
    return t.detach().to("cpu", torch.float64)


def _bound(dtype, precision="ieee"):
    return TF32_BOUND if precision == "tf32" else BOUND[dtype]


# ------------------------------------------------------------------------- checks (run anywhere)

def _check_rbf_gram_symmetric(device, dtype, n, D, center, precision, seed):
    gen = _gen(seed)
    X, g = _randn(gen, n, D, dtype=dtype, device=device), _gamma(D, gen)
    with _poisoned():
        K = trbf.rbf_gram(X, None, g, center, precision)
    assert K.shape == (n, n) and K.dtype == dtype and K.device == X.device
    assert torch.equal(K, K.T), "symmetric Gram is not exactly symmetric"
    if not center:
        assert bool((K.diagonal() == 1).all()), "diagonal is not exactly 1"
    ref = rrbf.gram_reference(_d64(X), None, g, center)
    assert_close_rel(K, ref, _bound(dtype, precision), f"rbf_gram(X, center={center})")


def _check_rbf_gram_cross(device, dtype, n, m, D, precision, seed):
    gen = _gen(seed)
    X, Y = _randn(gen, n, D, dtype=dtype, device=device), _randn(gen, m, D, dtype=dtype, device=device)
    g = _gamma(D, gen)
    with _poisoned():
        K = trbf.rbf_gram(X, Y, g, False, precision)
    assert K.shape == (n, m) and K.dtype == dtype
    assert_close_rel(K, rrbf.gram_reference(_d64(X), _d64(Y), g, False), _bound(dtype, precision),
                     "rbf_gram(X, Y)")


def _check_rbf_matmul(device, dtype, n, m, p, D, precision, seed):
    gen = _gen(seed)
    X, Y = _randn(gen, n, D, dtype=dtype, device=device), _randn(gen, m, D, dtype=dtype, device=device)
    V, g = _randn(gen, m, p, dtype=dtype, device=device), _gamma(D, gen)
    with _poisoned():
        out = trbf.rbf_matmul(X, Y, V, g, precision)
    assert out.shape == (n, p) and out.dtype == dtype
    ref = rrbf.rbf_matmul_reference(_d64(X), _d64(Y), _d64(V), g)
    # sum_j K_ij V_jk mixes signs: bound roundoff by |K| |V| rather than by |ref| alone
    scale = rrbf.rbf_matmul_reference(_d64(X), _d64(Y), _d64(V).abs(), g)
    err = (_d64(out) - ref).abs()
    tol = _bound(dtype, precision)
    assert bool((err <= tol * scale.clamp_min(1e-300)).all()), (
        f"rbf_matmul off by {float(err.max()):.3e} (|K||V| scale {float(scale.max()):.3e})")
    assert_close_rel(out, ref, tol, "rbf_matmul")


def _check_offset_cloud(device, precision, seed):
    """Float32 rows far from the origin (distance 1, spread 0.05 / sqrt(D) per coordinate,
    gamma |x|^2 = 200): |x|^2 + |y|^2 - 2<x, y> cancels by ~|x|^2 / |x - y|^2 = 400, which costs
    the unshifted formula ~5e-5 even in IEEE float32. The launchers' common shift keeps rbf_gram
    (both forms), rbf_matmul and the projection within the float32 bound of float64."""
    gen = _gen(seed)
    D = 48
    c = torch.randn(D, generator=gen, dtype=torch.float64)
    cloud = [c / c.norm() + 0.05 * torch.randn(n, D, generator=gen, dtype=torch.float64) / D ** 0.5
             for n in (70, 40)]
    X64, Y64 = cloud
    g = 200.0 / float((X64 * X64).sum(1).mean())
    X, Y = X64.float().to(device), Y64.float().to(device)
    tol = BOUND[torch.float32]
    K = trbf.rbf_gram(X, None, g, False, precision)
    assert_close_rel(K, rrbf.gram_reference(_d64(X), None, g, False), tol, "offset rbf_gram(X)")
    K = trbf.rbf_gram(X, Y, g, False, precision)
    assert_close_rel(K, rrbf.gram_reference(_d64(X), _d64(Y), g, False), tol, "offset rbf_gram(X, Y)")
    V = torch.rand(40, 3, generator=gen, dtype=torch.float64)  # positive: no cancellation in K V
    out = trbf.rbf_matmul(X, Y, V.float().to(device), g, precision)
    ref = rrbf.rbf_matmul_reference(_d64(X), _d64(Y), _d64(V.float()), g)
    assert_close_rel(out, ref, tol, "offset rbf_matmul")
    off = offsets_from_sizes([30, 40]).to(device)
    alphas = torch.rand(70, 2, generator=gen, dtype=torch.float64)
    beta = tkpca.project_onto_basis(X, alphas.float().to(device), off, Y, g, precision)
    ref = rkpca.projection_reference(_d64(X), _d64(alphas.float()), off.cpu(), _d64(Y), g)
    assert_close_rel(beta, ref, tol, "offset project_onto_basis")


# The ops auto runs on Triton on CUDA, each for a recorded H100 win (the notes at their
# registrations in geomkern/backends/triton): never on CPU, where the kernels run only in the
# interpreter, for tests.
AUTO_TRITON = {"cuda": {"rbf_gram", "rbf_matmul", "project_onto_basis"}, "cpu": set()}


def _check_dispatch(device):
    """set_backend("triton") routes every Triton op here; auto picks Triton for exactly the ops
    of AUTO_TRITON[device]."""
    triton_ops = [op for op, b in gk._dispatch.registered_ops().items() if "triton" in b]
    assert set(triton_ops) == {"rbf_gram", "rbf_matmul", "kpca",
                               "project_onto_basis", "preimage_gd", "preimage_fixed_point",
                               "kmeans"}
    with gk.set_backend("triton"):
        assert all(gk._dispatch.resolve(op, device) == "triton" for op in triton_ops)
    with gk.set_backend("auto"):
        auto = {op for op in triton_ops if gk._dispatch.resolve(op, device) == "triton"}
    assert auto == AUTO_TRITON[device], f"auto picks Triton on {device} for {sorted(auto)}"


# --------------------------------------------------------------------------------------- tests

# rbf_gram at the IEEE precision (symmetric, centred, cross; every dtype) against float64: the
# oracle table of tests/geomkern/test_rbf.py (entries triton-cpu and triton-cuda), the shapes that
# were here among its rows. Here the precisions only the Triton kernels have.


@pytest.mark.gpu
def test_rbf_gram_tf32(seed, run):
    """TF32 does not exist in the Triton interpreter (numpy computes in float32): on a GPU only."""
    device = "cuda"
    run(_check_rbf_gram_symmetric, device, torch.float32, 300, 64, False, "tf32", seed)
    run(_check_rbf_gram_cross, device, torch.float32, 300, 100, 512, "tf32", seed)
    run(_check_rbf_matmul, device, torch.float32, 300, 200, 16, 512, "tf32", seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ("tf32x3", "ieee"))
def test_offset_cloud_within_the_float32_bound(device, precision, seed, run):
    run(_check_offset_cloud, device, precision, seed)


# rbf_matmul at the IEEE precision against float64: the oracle table of tests/geomkern/test_rbf.py
# (rows signed, entries triton-cpu and triton-cuda).


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision,D", (("ieee", 5), ("tf32x3", 5), ("tf32x3", 200)))
def test_rbf_matmul_split_over_y(device, precision, D, seed, run):
    # 2,100 Y rows for 20 X rows: one row tile, so the launcher splits Y into chunks (a third grid
    # axis, partial products summed after) to fill the SMs; float32 (the split is dtype-blind)
    run(_check_rbf_matmul, device, torch.float32, 20, 2100, 3, D, precision, seed)


# segment_means, segmented_gram and kpca of many clusters against float64 (every shape that was
# here): the segment-means, segmented-Gram and kpca oracle tables of tests/geomkern/test_kpca.py
# (entries triton-cpu and triton-cuda).


# project_onto_basis against float64 (every shape that was here, the split-rows one included):
# the projection oracle table of tests/geomkern/test_kpca.py (entries triton-cpu, triton-cuda).


# The pre-image kernels against the float64 reference (CPU in the interpreter worker, CUDA
# compiled): the pre-image oracle table (tests/geomkern/test_preimage.py, entries triton-cpu and
# triton-cuda), the shapes that were here among its rows.


# assign and kmeans against float64 (every shape that was here): the assignment and K-Means
# oracle tables of tests/geomkern/test_kmeans.py (entries triton-cpu and triton-cuda).


def _triton_op_cases(device, seed):
    import geomkern.backends.triton.operators  # noqa: F401  (registers torch.ops.geomkern_triton)
    gen = _gen(seed)
    X = _randn(gen, 70, 9, dtype=torch.float32, device=device, shift=1.5)
    Y = _randn(gen, 33, 9, dtype=torch.float32, device=device)
    V = _randn(gen, 33, 4, dtype=torch.float32, device=device)
    off = offsets_from_sizes([30, 0, 40]).to(device)
    alphas = _randn(gen, 70, 3, dtype=torch.float32, device=device)
    Xb, Cb = X[:66].reshape(3, 22, 9), _randn(gen, 3, 5, 9, dtype=torch.float32, device=device)
    ops = torch.ops.geomkern_triton
    return [  # (operator call, the launcher it wraps)
        (lambda: ops.rbf_gram(X, None, 0.2, True, "tf32x3"), lambda: trbf.rbf_gram(X, None, 0.2, True)),
        (lambda: ops.rbf_gram(X, Y, 0.2, False, "ieee"), lambda: trbf.rbf_gram(X, Y, 0.2, False, "ieee")),
        (lambda: ops.rbf_matmul(X, Y, V, 0.2, "tf32x3"), lambda: trbf.rbf_matmul(X, Y, V, 0.2)),
        (lambda: ops.project_onto_basis(X, alphas, off, Y, 0.2, "tf32x3"),
         lambda: tkpca.project_onto_basis(X, alphas, off, Y, 0.2)),
        (lambda: ops.kmeans_assign(Xb, Cb, "tf32x3"), lambda: tkmeans.assign(Xb, Cb)),
    ]


def _check_triton_ops(device, seed):
    """The launchers registered with torch.library.triton_op: their schemas, and in eager mode
    the same bits as the launchers they wrap."""
    import geomkern.backends.triton.operators  # noqa: F401  (registers torch.ops.geomkern_triton)
    schema = str(torch.ops.geomkern_triton.rbf_gram.default._schema)
    assert schema == ("geomkern_triton::rbf_gram(Tensor X, Tensor? Y, float gamma, bool center, "
                      "str precision) -> Tensor"), schema
    for op, launcher in _triton_op_cases(device, seed):
        got, want = op(), launcher()
        assert got.shape == want.shape and torch.equal(got, want)
    with pytest.raises(ValueError, match=r"kmeans_assign takes batched X \(m, n, D\)"):
        torch.ops.geomkern_triton.kmeans_assign(torch.zeros(4, 3, device=device),
                                                torch.zeros(2, 3, device=device), "tf32x3")


@pytest.mark.parametrize("device", DEVICES)
def test_triton_launchers_are_torch_operators(device, seed, run):
    run(_check_triton_ops, device, seed)


@pytest.mark.gpu
def test_triton_operators_compile_fullgraph(seed):
    """On a GPU, torch.compile(fullgraph=True) over the triton_op operators (their kernels inside
    the graph, wrap_triton) matches eager mode."""
    for op, _ in _triton_op_cases("cuda", seed):
        eager = op()
        compiled = torch.compile(op, fullgraph=True)()
        if eager.is_floating_point():
            assert_close_rel(compiled, eager.double(), 1e-6, "compiled against eager")
        else:
            assert torch.equal(compiled, eager)


@pytest.mark.parametrize("device", DEVICES)
def test_dispatch_routes_triton_ops(device, run):
    run(_check_dispatch, device)


def test_geomkern_imports_without_triton():
    code = ("import sys; sys.modules['triton'] = None\n"
            "import geomkern as gk\n"
            "assert 'triton' not in gk.available_backends()\n"
            "try:\n    gk.set_backend('triton')\nexcept RuntimeError as e:\n"
            "    assert 'pip install triton' in str(e), e\nelse:\n    raise AssertionError('no error')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# ---------------------------------------------------------- GPU code path, compiled on the CPU

# Largest dynamic shared memory per block on an H100 (sm_90): 227 KiB.
_SM90_SHARED = 232448


@contextlib.contextmanager
def _captured_launches():
    """Replace JITFunction.run so launchers record (kernel, args, kwargs) instead of launching."""
    from triton.runtime.jit import JITFunction

    launches, orig = [], JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = orig


def _compile_for(fn, args, kwargs, arch: int):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    options = {k: kwargs.pop(k) for k in list(kwargs) if k in ("num_warps", "num_stages")}
    bound = dict(zip(inspect.signature(fn.fn).parameters, args), **kwargs)
    signature, constexprs = {}, {}
    for p in fn.params:
        if p.is_constexpr:
            signature[p.name], constexprs[p.name] = "constexpr", bound[p.name]
        else:
            signature[p.name] = p.annotation_type or mangle_type(bound[p.name])
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", arch, 32), options=options)


def _launch_cases(dtype):
    X, B = torch.zeros(300, 512, dtype=dtype), torch.zeros(64, 512, dtype=dtype)
    off = torch.tensor([0, 100, 300])
    wide = 1024
    return {
        "rbf_gram_centred": lambda: trbf.rbf_gram(X, None, 0.1, True),
        "rbf_gram_cross": lambda: trbf.rbf_gram(X, B, 0.1, False),
        "rbf_matmul_resident": lambda: trbf.rbf_matmul(X[:, :128], B[:, :128], B[:, :8], 0.1),
        "rbf_matmul_streamed": lambda: trbf.rbf_matmul(X, B, B[:, :8], 0.1),
        "segmented_gram": lambda: tkpca.segmented_gram(X, off, 0.1, True),
        "project_onto_basis": lambda: tkpca.project_onto_basis(X, X[:, :8], off, B, 0.1),
        "preimage_gd": lambda: tpre.preimage_gd(X, B, X[:, :64], 0.1, 3, X[:, 0]),
        "preimage_fixed_point_widest": lambda: tpre.preimage_fixed_point(
            torch.zeros(30, wide, dtype=dtype), torch.zeros(64, wide, dtype=dtype),
            torch.zeros(30, 64, dtype=dtype), 0.1, 3),
        "assign": lambda: tkmeans.assign(X, B),
    }


_HALF_CASES = ("rbf_gram_centred", "rbf_gram_cross")


# only rbf_gram takes float16/bfloat16; the float64 and half compiles take ~1 min in all (slow)
@pytest.mark.skipif(IN_INTERPRETER, reason="kernels are interpreted in this process (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("dtype,case", table(
    [pytest.param(d, id=str(d), marks=[] if d == torch.float32 else [pytest.mark.slow]) for d in ALL_DTYPES],
    list(_launch_cases(torch.float32)),
    keep=lambda dtype, case: dtype not in (torch.float16, torch.bfloat16) or case in _HALF_CASES))
def test_kernels_compile_for_sm90(dtype, case):
    """What the launchers launch compiles for an H100 and fits its shared memory."""
    with _captured_launches() as launches, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _launch_cases(dtype)[case]()
        except Exception:  # buffers of never-run launches hold garbage: later host steps may fail
            if not launches:
                raise
    assert launches, f"{case} launched no kernel"
    for fn, args, kwargs in launches:
        compiled = _compile_for(fn, args, dict(kwargs), 90)
        assert compiled.metadata.shared <= _SM90_SHARED, (
            f"{fn.fn.__name__} needs {compiled.metadata.shared} B of shared memory on sm_90")


def test_auto_prefers_triton_on_cuda_where_it_measured_faster():
    """auto on CUDA takes the Triton kernels of rbf_gram, rbf_matmul and project_onto_basis (each
    measured faster than the torch reference at float32 accuracy on an H100, through the public
    op: geomkern/backends/triton/rbf.py's note) and leaves the ops where it did not (the pre-image:
    0.87-0.91x) or was not measured that way on the reference; never auto on CPU."""
    from geomkern import _dispatch
    for op in ("rbf_gram", "rbf_matmul", "project_onto_basis"):
        assert _dispatch._REGISTRY[op].auto_order.get("cuda", ())[:1] == ("triton",), op
    for op in ("preimage_gd", "preimage_fixed_point", "kpca", "kmeans"):
        assert "triton" not in _dispatch._REGISTRY[op].auto_order.get("cuda", ()), op
    for op, entry in _dispatch._REGISTRY.items():
        assert "triton" not in entry.auto_order.get("cpu", ()), op


def _kernels():
    """Every @triton.jit kernel a launcher starts (the JITFunctions defined in the backend's modules
    whose names start with an underscore and end in _kernel)."""
    mods = (trbf, tkpca, tkmeans, tpre)
    # .fn: the Python function under @triton.jit (a JITFunction, or the interpreter's wrapper)
    out = {f"{m.__name__.rsplit('.', 1)[1]}.{n}": f for m in mods for n, f in vars(m).items()
           if n.endswith("_kernel") and callable(getattr(f, "fn", None))}
    assert len(out) >= 8, sorted(out)
    return out


@pytest.mark.skipif(IN_INTERPRETER, reason="Inductor copies compiled kernels (JITFunction); this process "
                                            "interprets them")
@pytest.mark.parametrize("name", sorted(_kernels()))
def test_kernels_stand_alone_as_inductor_copies_them(name, tmp_path):
    """torch.compile on a GPU compiles a copy of each kernel: Inductor writes the kernel's source,
    the @triton.jit functions it calls and its plain constant globals into a fresh module, and
    nothing else (torch._inductor.codegen.wrapper.user_defined_triton_kernel_transitive_closure_
    source_code). A kernel that reaches a helper through a module alias (``C.mma``) compiled in
    eager mode but not under torch.compile (H100, GPU session 11: "C is not defined"). Here, on
    CPU: exec that copy as Inductor does and check every global name each function in it reads."""
    import builtins
    import dis
    import importlib.util

    from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code
    from triton.runtime.jit import JITFunction
    kernel = _kernels()[name]
    src = user_defined_triton_kernel_transitive_closure_source_code(kernel)
    # Inductor's header for user kernels (async_compile.triton's module): triton and tl; a file,
    # because @triton.jit reads its function's source
    path = tmp_path / "inductor_copy.py"
    path.write_text("import triton\nimport triton.language as tl\n\n@triton.jit\n" + src)
    spec = importlib.util.spec_from_file_location(f"inductor_copy_{name.replace('.', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ns = vars(mod)
    fns = [v for v in ns.values() if isinstance(v, JITFunction)]
    assert kernel.fn.__name__ in ns, src[:500]
    missing = {f"{f.fn.__name__}: {i.argval}" for f in fns for i in dis.Bytecode(f.fn)
               if i.opname == "LOAD_GLOBAL" and i.argval not in ns and not hasattr(builtins, i.argval)}
    assert not missing, f"names the Inductor copy of {name} cannot resolve: {sorted(missing)}"


_EAGER_LAUNCH_CHECK = r"""
import gc, sys, weakref
import torch
from torch._higher_order_ops.triton_kernel_wrap import TraceableTritonKernelWrapper, kernel_side_table
from torch._subclasses.fake_tensor import FakeTensorMode
from geomkern.backends.triton import _common as C, kmeans as tkm, preimage as tpre, rbf as trbf
kernels = [tpre._preimage_kernel, trbf._sym_gram_kernel, tkm._assign_kernel]
for k in kernels:
    k.run = lambda *a, **kw: None  # no GPU here: the host side of each launch only
def calls():
    Z0, B, T = torch.randn(300, 64), torch.randn(33, 64), torch.rand(300, 33)
    yield tpre.preimage_gd(Z0, B, T, 0.5, 3, torch.full((300,), 0.1))
    yield trbf.rbf_gram(torch.randn(70, 40), None, 0.5, False)
    yield tkm.assign(torch.randn(2, 50, 40), torch.randn(2, 5, 40))
n0 = len(kernel_side_table.constant_args)
refs = [weakref.ref(out) for _ in range(3) for out in calls()]
gc.collect()
added = len(kernel_side_table.constant_args) - n0
alive = sum(r() is not None for r in refs)
assert added == 0 and alive == 0, f"eager launches: {added} side-table entries added, {alive} outputs kept alive"
assert all(C.launch(k) is k for k in kernels)
with FakeTensorMode():
    assert all(isinstance(C.launch(k), TraceableTritonKernelWrapper) for k in kernels)
print("ok")
"""


def test_eager_launches_go_straight_to_the_kernel():
    """Eager launches (real tensors) start the kernel itself, not torch.library.wrap_triton's
    higher-order operator: that path cost ~0.6 ms a Gram call on the H100 (GPU session 11 against
    9) and its side table kept every launch's non-tensor arguments, the pre-image's
    TensorDescriptors and so its output and buffers, alive for the life of the process. Inside a
    trace (here a FakeTensorMode) launch() still hands torch.compile the wrapped kernel. Compiled
    kernels, not the interpreter, so in a child process without TRITON_INTERPRET."""
    proc = subprocess.run([sys.executable, "-c", _EAGER_LAUNCH_CHECK], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2],
                          env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-1500:] + proc.stderr[-3000:]
