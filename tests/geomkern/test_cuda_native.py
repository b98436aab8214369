"""The CUDA C++ kernels (geomkern._C_cuda, csrc/cuda/) against float64 oracles on a GPU, and their
registration with the dispatcher.

GPU tests (marked ``gpu``; left out without a CUDA device, skipped when _C_cuda was not built):
  * Jacobi eigh on random symmetric matrices: the eigh oracle table (tests/geomkern/test_eigh.py,
    entry cuda: 500 of 100 x 100, 64 of 512 x 512 through the global workspace, odd sizes 1, 7,
    33, 257); here centred RBF Grams and the public gk.eigh under the native backend;
  * the fused pre-image loop's refusals of what its shared memory cannot hold (its values vs
    gd_reference: the oracle table of tests/geomkern/test_preimage.py, entry cuda).
The same kernels run under host emulation in tests/geomkern/test_cuda_emulated.py (no GPU needed).

CPU tests: the device-dispatching wrappers geomkern/backends/native/__init__.py registers when
_C_cuda exists, exercised with a stand-in for _C_cuda, so the CPU native registration they wrap
is checked to survive unchanged on every machine.
"""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _preimage_problem import preimage_problem
from _eigh_oracle import check_eigh

import geomkern as gk
from geomkern import _dispatch
from geomkern.backends import native as native_cuda
from geomkern.ops.eigh import eigh_reference
from geomkern.ops.preimage import default_gd_lr

CUDA = torch.cuda.is_available()
# on a GPU machine where setup.py did not build the extension, say why instead of failing;
# bool(): pytest evaluates a str condition as Python source, and "" (built) was a SyntaxError there
needs_ext = pytest.mark.skipif(bool(CUDA and native_cuda.why_not("cuda")),
                               reason=native_cuda.why_not("cuda") or "built")
# Same bounds as the emulated tests (tests/geomkern/test_cuda_emulated.py): the solver computes in double,
# so float32 results are limited by their final rounding (emulation: <= 1e-7).
EIGH_TOL = {torch.float32: 1e-6, torch.float64: 1e-12}
ROOT = Path(__file__).resolve().parents[2]


def _random_symmetric(batch, n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    X = torch.randn(batch, n, n, generator=g, device="cuda", dtype=torch.float64)
    return ((X + X.transpose(1, 2)) / 2).to(dtype).contiguous()


def _solve(A):
    w, V, info = native_cuda._C_cuda.eigh(A, native_cuda.eigh_tol(A.dtype, A.shape[-1]),
                                                 native_cuda.MAX_SWEEPS)
    assert w.is_cuda and V.is_cuda and w.dtype == A.dtype and V.dtype == A.dtype
    assert bool((info >= 0).all()), f"not converged: {info[info < 0].numel()} matrices"
    return w, V, info


# ------------------------------------------------------------------------------------ GPU: eigh

@pytest.mark.gpu
@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_eigh_centred_grams(seed, dtype):
    """The kernel-PCA use: centred RBF Grams (PSD, one eigenvalue 0, fast-decaying spectrum)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    X = torch.randn(50, 100, 16, generator=g, device="cuda", dtype=torch.float64)
    sq = torch.cdist(X, X).square()
    K = torch.exp(-sq / sq.flatten(1).median(1).values[:, None, None])
    K = K - K.mean(-1, keepdim=True)
    K = K - K.mean(-2, keepdim=True)
    A = ((K + K.transpose(1, 2)) / 2).to(dtype).contiguous()
    w, V, _ = _solve(A)
    check_eigh(A.cpu().numpy(), w.cpu().numpy(), V.cpu().numpy(), EIGH_TOL[dtype], name="CUDA jacobi, Grams")


@pytest.mark.gpu
@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_public_eigh_native_matches_reference(seed, dtype):
    """gk.eigh under the native backend: same contract (descending, top k, sign fix) as the
    reference, which runs torch.linalg.eigh in float64 here."""
    A = _random_symmetric(3 * 5, 40, dtype, seed).reshape(3, 5, 40, 40)
    with gk.set_backend("native"):
        assert gk.resolve("eigh", "cuda") == "native"
        w, V = gk.eigh(A, k=7)
    w_ref, V_ref = eigh_reference(A.double(), 7)
    assert w.shape == (3, 5, 7) and V.shape == (3, 5, 40, 7) and w.device == A.device
    tol = EIGH_TOL[dtype]
    assert float((w.double() - w_ref).norm() / w_ref.norm()) <= tol
    # the sign convention: each column's largest-|.| entry is positive
    top = V.gather(-2, V.abs().argmax(-2, keepdim=True))
    assert bool((top > 0).all())
    # vectors up to sign (two entries of nearly equal size can flip the convention's choice);
    # eigenvector error ~ tol ||A|| / gap, and these random spectra have gaps > 1e-3 ||A||
    signs = torch.sign((V.double() * V_ref).sum(-2, keepdim=True))
    assert float((V.double() * signs - V_ref).norm() / V_ref.norm()) <= 1e3 * tol


@pytest.mark.gpu
@needs_ext
def test_jacobi_reports_non_convergence(seed):
    A = _random_symmetric(4, 20, torch.float32, seed)
    _, _, info = native_cuda._C_cuda.eigh(A, 1e-7, 0)
    assert bool((info == -1).all())


@pytest.mark.gpu
@needs_ext
def test_jacobi_rejects_bad_input():
    """The library's checks, tagged (csrc/stable.h) and raised as the Python type they name."""
    with pytest.raises(ValueError, match="A must be a CUDA tensor, got one on cpu"):
        native_cuda._C_cuda.eigh(torch.eye(3), 1e-7, 10)
    A = torch.randn(4, 4, device="cuda")
    with pytest.raises(TypeError, match="must be float32 or float64"):
        native_cuda._C_cuda.eigh(A.half(), 1e-7, 10)
    with pytest.raises(ValueError, match="contiguous"):
        native_cuda._C_cuda.eigh((A + A.T).t(), 1e-7, 10)


@pytest.mark.gpu
@needs_ext
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_launch_check_runs(tmp_path):
    """tests/cuda_host/launch_check.cu (linked, not run, by test_nvcc_compile.py) on the device."""
    nvcc = shutil.which("nvcc")
    exe = tmp_path / "launch_check"
    cu = sorted(str(p) for p in (ROOT / "csrc" / "cuda").glob("*.cu"))
    build = subprocess.run([nvcc, "-arch=native", "-std=c++17", "-I", str(ROOT / "csrc" / "cuda"),
                            str(ROOT / "tests" / "cuda_host" / "launch_check.cu"), *cu, "-o", str(exe)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "launch_check: ok" in run.stdout, run.stdout + run.stderr


# ------------------------------------------------------------------------------- GPU: pre-image



# The kernel against the float64 reference (GPU): the pre-image oracle table
# (tests/geomkern/test_preimage.py, entry cuda, with a 16- and 8-point-per-block size and a large batch).


@pytest.mark.gpu
@needs_ext
def test_preimage_too_large_raises(seed):
    """float64 at S = D = 1500 fits no block (8 points need 242 KB): a clear error through the
    public op, said by the Python wrapper (an H100 ended the process with a segmentation fault
    where the binding threw it, GPU session 9)."""
    assert native_cuda._C_cuda.preimage_gd_points(1300, 1300, True, 0) == 8
    assert native_cuda._C_cuda.preimage_gd_points(1500, 1500, True, 0) == 0
    Z0, B, T, gamma = preimage_problem(3, 1500, 1500, seed)
    Z0, B, T = (x.to("cuda", torch.float64) for x in (Z0, B, T))
    with gk.set_backend("native"), pytest.raises(RuntimeError, match="shared memory.*'triton'"):
        gk.preimage(Z0, B, T, gamma=gamma, method="gd", steps=2, lr=default_gd_lr(Z0, B, gamma))


@pytest.mark.gpu
@needs_ext
def test_preimage_binding_refuses_too_large_without_crashing():
    """The binding's own check (D = 40,000 float32), in a child process: on the GPU image every
    refusal whose message formats a number crashed the process (GPU sessions 9-12; libstdc++
    linked statically, fixed by setup.py's SHARED_LIBSTDCXX: studies/preimage-throw)."""
    code = ("import torch, geomkern\n"
            "from geomkern.backends import native\n"
            "Z0 = torch.randn(2, 40000, device='cuda'); B = torch.randn(3, 40000, device='cuda')\n"
            "try:\n"
            "    native._C_cuda.preimage_gd(Z0, B, torch.rand(2, 3, device='cuda'), 1e-4, 2,\n"
            "                               torch.ones(2, device='cuda'))\n"
            "except RuntimeError as e:\n"
            "    print('raised:', e)\n"
            # and eigh's size check, whose message carries an int64 too (crashed in session 12)
            "try:\n"
            "    native._C_cuda.eigh(torch.eye(2049, device='cuda'), 1e-7, 10)\n"
            "except ValueError as e:\n"
            "    print('eigh raised:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert "raised:" in proc.stdout and "shared memory" in proc.stdout, proc.stdout
    assert "eigh raised:" in proc.stdout and "n = 2049" in proc.stdout, proc.stdout


# --------------------------------------------------------------- CPU: registration with a stand-in

class _FakeCExtension:
    """Stands in for geomkern._C_cuda: records which kernel ran."""

    def __init__(self):
        self.calls = []

    def eigh(self, A, tol, max_sweeps):
        self.calls.append("eigh")
        n = A.shape[-1]
        return torch.arange(n, 0, -1.0), torch.eye(n), torch.zeros(1, dtype=torch.int32)

    def preimage_gd_points(self, S, D, is_double, device):
        return 0 if S + D > 10000 else 16

    def preimage_gd(self, *args):
        self.calls.append("preimage_gd")
        return "cuda-result"


@pytest.fixture
def registered_with_fake_cuda(monkeypatch):
    """native.register() as it runs when _C_cuda loads on a machine with a CUDA device, on a copy
    of the registry."""
    before = copy.deepcopy(_dispatch._REGISTRY)
    monkeypatch.setattr(_dispatch, "_REGISTRY", copy.deepcopy(_dispatch._REGISTRY))
    fake = _FakeCExtension()
    monkeypatch.setattr(native_cuda, "_CUDA", native_cuda._Extension(fake, "", False, cuda="13.0"))
    monkeypatch.setattr(native_cuda, "_no_device", lambda: "")  # a GPU is visible
    native_cuda.register(native_cuda._C, fake)
    return before, fake


def test_kernel_table_follows_what_was_built():
    fake = _FakeCExtension()
    assert native_cuda.kernels(None, None) == {}
    cpu_only = native_cuda.kernels(object(), None)
    assert {dev for per in cpu_only.values() for dev in per} == {"cpu"}
    cuda_only = native_cuda.kernels(None, fake)
    assert set(cuda_only) == {"eigh", "preimage_gd"}
    assert {dev for per in cuda_only.values() for dev in per} == {"cuda"}
    both = native_cuda.kernels(object(), fake)
    assert set(both["preimage_gd"]) == {"cpu", "cuda"} and set(both["preimage_fixed_point"]) == {"cpu"}


def test_registration_keeps_cpu_native(registered_with_fake_cuda, seed):
    before, fake = registered_with_fake_cuda
    reg = _dispatch._REGISTRY
    assert set(reg) == set(before) | {"eigh"}
    for op, entry in reg.items():
        assert entry.auto_order == before[op].auto_order, f"{op}: auto order changed"
        assert {k: v for k, v in entry.impls.items() if k != "native"} == \
               {k: v for k, v in before[op].impls.items() if k != "native"}
    if native_cuda._C is not None:
        # CPU tensors reach the same CPU kernel as before, with identical results
        Z0, B, T, gamma = preimage_problem(9, 7, 5, seed)
        lr = default_gd_lr(Z0, B, gamma)
        with gk.set_backend("native"):
            assert _dispatch.resolve("preimage_gd", "cpu") == "native"
            got = _dispatch.implementation("preimage_gd", "cpu")(Z0, B, T, gamma, 3, lr)
        want = before["preimage_gd"].impls["native"]["cpu"](Z0, B, T, gamma, 3, lr)
        assert torch.equal(got, want)
    # eigh has no CPU kernel: CPU tensors get the reference, even under set_backend("native")
    A = torch.randn(6, 6, dtype=torch.float64)
    A = A + A.T
    with gk.set_backend("native"):
        assert _dispatch.resolve("eigh", "cpu") == "reference"
        w, V = gk.eigh(A)
    w_ref, V_ref = eigh_reference(A, 6)
    assert torch.equal(w, w_ref) and torch.equal(V, V_ref)
    assert not fake.calls


def test_registration_routes_cuda_tensors(registered_with_fake_cuda):
    _, fake = registered_with_fake_cuda
    with gk.set_backend("native"):
        assert _dispatch.resolve("eigh", "cuda") == "native"
        w, V = _dispatch.implementation("eigh", "cuda")(torch.zeros(3, 3), 2)
        assert torch.equal(w, torch.tensor([3.0, 2.0])) and V.shape == (3, 2)
        gd = _dispatch.implementation("preimage_gd", "cuda")
        assert gd(torch.zeros(2, 3), torch.zeros(4, 3), None, 1.0, 1, None) == "cuda-result"
        # a problem the kernel's shared memory cannot hold: the wrapper says so, the kernel is
        # not called
        with pytest.raises(RuntimeError, match="S = 20000, D = 3 in torch.float32 exceed.*'triton'"):
            gd(torch.zeros(2, 3), torch.zeros(20000, 3), None, 1.0, 1, None)
        # a native CPU op without a CUDA kernel sends CUDA tensors to the reference
        assert _dispatch.resolve("preimage_fixed_point", "cuda") == "reference"
    with gk.set_backend("auto"):  # no GPU benchmark yet: auto never prefers a CUDA kernel
        assert _dispatch.resolve("eigh", "cuda") == "reference"
    assert fake.calls == ["eigh", "preimage_gd"]


# ------------------------------------------------------- CPU: loading geomkern._C_cuda (no GPU needed)

_BUILT = bool(native_cuda._compiled_files("_C_cuda")) and torch.version.cuda is not None
needs_built = pytest.mark.skipif(not _BUILT or native_cuda._C_cuda is None,
                                 reason=native_cuda._CUDA.why_not or "geomkern._C_cuda is not built here")


@needs_built
def test_library_loads_and_records_its_cuda_version():
    """The stable-ABI library loads into this torch and says which CUDA it was built with: the
    same major version as torch's (the loader refuses another)."""
    built = int(torch.ops.geomkern_cuda.cuda_version())
    assert built // 1000 == int(torch.version.cuda.split(".")[0]) and built % 10 == 0, built
    assert native_cuda._CUDA.cuda == f"{built // 1000}.{built % 1000 // 10}"
    if not CUDA:
        reason = gk.why_not("native", "cuda")
        assert reason.startswith("the native CUDA kernels are unavailable: geomkern._C_cuda (CUDA ")
        assert "sees no CUDA device (torch.cuda.is_available() is False" in reason
        with gk.set_backend("native"), pytest.raises(RuntimeError, match="sees no CUDA device"):
            gk.resolve("eigh", "cuda")


@needs_built
def test_library_refuses_cpu_tensors_by_name():
    """Its operators take CPU tensors to the same checks (registered for CPU too), which name the
    argument, tagged and raised as ValueError/TypeError, before any CUDA call."""
    C = native_cuda._C_cuda
    with pytest.raises(ValueError, match="^A must be a CUDA tensor, got one on cpu$"):
        C.eigh(torch.eye(3), 1e-7, 10)
    with pytest.raises(ValueError, match="^Z0 must be a CUDA tensor, got one on cpu$"):
        C.preimage_gd(torch.ones(2, 3), torch.ones(4, 3), torch.ones(2, 4), 0.5, 3, torch.ones(2))
    assert C.preimage_gd_points(0, 4, False, 0) == -1  # refused before any device query


@needs_built
def test_cuda_major_mismatch_is_named_with_the_fix(monkeypatch):
    """A torch of another CUDA major than the build's: not loaded for use, warned about (broken),
    both versions and the two ways out named."""
    built = int(torch.ops.geomkern_cuda.cuda_version()) // 1000
    other = f"{built - 1}.8"
    monkeypatch.setattr(native_cuda.torch.version, "cuda", other)
    ext = native_cuda._load_cuda(native_cuda._BUILD_CUDA)
    assert ext.module is None and ext.broken
    for part in (f"was built with CUDA {built}.", f"uses CUDA {other}", "the major versions must match",
                 f"download.pytorch.org/whl/cu{built}0", "pip install --no-build-isolation ."):
        assert part in ext.why_not, ext.why_not


def test_cpu_only_torch_is_a_reason_not_a_fault(monkeypatch, tmp_path):
    """Beside a CPU-only torch the wheel's _C_cuda is not even loaded (it links libtorch_cuda):
    a reason, no warning (broken False)."""
    (tmp_path / "_C_cuda.abi3.so").write_bytes(b"")
    monkeypatch.setattr(native_cuda, "_PACKAGE", tmp_path)
    monkeypatch.setattr(native_cuda.torch.version, "cuda", None)
    ext = native_cuda._load_cuda(native_cuda._BUILD_CUDA)
    assert ext.module is None and not ext.broken
    assert "is a CPU-only build (torch.version.cuda is None)" in ext.why_not and "_C_cuda.abi3.so" in ext.why_not


def test_unbuilt_and_foreign_cuda_files(monkeypatch, tmp_path):
    monkeypatch.setattr(native_cuda, "_PACKAGE", tmp_path)
    monkeypatch.setattr(native_cuda.torch.version, "cuda", "13.0")
    ext = native_cuda._load_cuda(native_cuda._BUILD_CUDA)
    assert ext.module is None and not ext.broken
    assert ext.why_not.startswith("geomkern was not compiled with CUDA: geomkern._C_cuda is not built")
    # an older build's per-torch Python module (pybind11), or garbage: named, broken, how to rebuild
    (tmp_path / "_C_cuda.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    ext = native_cuda._load_cuda(native_cuda._BUILD_CUDA)
    assert ext.module is None and ext.broken
    for part in ("geomkern._C_cuda is built (_C_cuda.cpython-311-x86_64-linux-gnu.so) but cannot be loaded",
                 "rebuild it for this environment"):
        assert part in ext.why_not


def _cuobjdump() -> str | None:
    """cuobjdump from the CUDA toolkit, or the one triton ships with its NVIDIA backend."""
    found = shutil.which("cuobjdump") or next(
        (str(p) for p in (Path(shutil.which("nvcc") or "/nonexistent").resolve().parent / "cuobjdump",
                          Path("/usr/local/cuda/bin/cuobjdump")) if p.is_file()), None)
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    ship = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(ship) if ship.is_file() else None


@pytest.mark.skipif(not (ROOT / "geomkern" / "_C_cuda.abi3.so").exists() or _cuobjdump() is None,
                    reason="geomkern/_C_cuda.abi3.so is not built here, or no cuobjdump")
def test_library_holds_sass_for_sm80_sm90_and_ptx():
    """The default architectures (setup.DEFAULT_CUDA_ARCH_LIST, 8.0;9.0+PTX): machine code for A100
    and H100/H200, and compute_90 PTX that newer GPUs JIT, for both kernel files. (A build on a
    GPU machine targets its GPUs instead: then this checks nothing it was not asked for.)"""
    lib = ROOT / "geomkern" / "_C_cuda.abi3.so"
    co = _cuobjdump()
    elf = subprocess.run([co, "--list-elf", str(lib)], capture_output=True, text=True, timeout=60).stdout
    ptx = subprocess.run([co, "--list-ptx", str(lib)], capture_output=True, text=True, timeout=60).stdout
    if CUDA:
        pytest.skip("built on a GPU machine: for its GPUs")
    assert elf.count(".sm_80.cubin") == 2 and elf.count(".sm_90.cubin") == 2, elf  # eigh.cu, preimage.cu
    assert ptx.count(".sm_90.ptx") == 2 and ".sm_80.ptx" not in ptx, ptx
    sass = subprocess.run([co, "-sass", str(lib)], capture_output=True, text=True, timeout=120).stdout
    for kernel in ("eigh_kernelIf", "eigh_kernelId", "preimage_gd_kernelIfLi32", "preimage_gd_kernelIdLi8"):
        assert kernel in sass, f"no SASS for {kernel}"
