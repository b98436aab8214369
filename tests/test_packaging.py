"""Packaging: `pip install geomkern` is the kernels and the FL math only; the simulator's packages
(and the test oracles) are extras, and the fedsim command says which extra it needs."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FEDSIM_ONLY = ("matplotlib", "sklearn", "scipy", "tqdm", "PIL")
DISTRIBUTIONS = {"matplotlib", "scikit-learn", "scipy", "tqdm", "pillow"}


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def _loaded_after(imports: str, baseline: str = "import torch, numpy, safetensors") -> list[str]:
    """Top-level packages among FEDSIM_ONLY that ``imports`` loads beyond what the core
    dependencies in ``baseline`` load by themselves (torch.hub imports tqdm whenever it is
    installed, dp-accounting's PLD accountant imports scipy)."""
    code = f"""
import sys
names = {FEDSIM_ONLY!r}
def loaded():
    return {{m.split('.')[0] for m in sys.modules if m.split('.')[0] in names}}
{baseline}
before = loaded()
{imports}
print(sorted(loaded() - before))
"""
    res = _python(code)
    assert res.returncode == 0, res.stderr
    return eval(res.stdout.strip().splitlines()[-1])


def test_import_geomkern_loads_no_fedsim_package():
    assert _loaded_after("import geomkern") == []


def test_eager_use_does_not_import_the_compiler():
    """Loading every backend and running ops eagerly imports neither torch._dynamo nor
    torch._inductor (about 1 s: torch.library.triton_op imports both, which is why the Triton
    operators register only on request, geomkern.backends.triton.operators)."""
    res = _python("import sys, torch, geomkern as gk\n"
                  "gk.available_backends()\n"
                  "X = torch.randn(30, 4)\n"
                  "gk.rbf_gram(X, gamma=0.3); gk.kmeans(X, 3); gk.rbf_matmul(X, X, X[:, :2], gamma=0.3)\n"
                  "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout


def test_fl_modules_load_only_the_accountants_scipy():
    baseline = "import torch, numpy, safetensors, dp_accounting.pld"
    assert _loaded_after("from geomkern import fedmc, ggeur, privacy", baseline) == []


def test_geomkern_works_without_the_fedsim_packages():
    """Hide the five packages (as in an install without extras) and run an op."""
    code = f"""
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {FEDSIM_ONLY!r}:
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
import torch, geomkern as gk
print(float(gk.rbf_gram(torch.ones(3, 2), gamma=1.0).sum()))
"""
    res = _python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "9.0"


def test_pyproject_core_dependencies_hold_no_fedsim_package():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs}

    core = names(project["dependencies"])
    extras = project["optional-dependencies"]
    assert not core & DISTRIBUTIONS, core & DISTRIBUTIONS
    assert {"torch", "numpy", "safetensors", "dp-accounting"} <= core
    assert {"matplotlib", "pillow", "scikit-learn", "tqdm"} <= names(extras["fedsim"])
    assert "geomkern" in names(extras["test"]) and "geomkern[fedsim]" in extras["test"]
    # the flower extra (issue 17) is the one that fedsim/flower needs: Flower with its Ray simulation
    assert "flwr[simulation]>=1.41" in extras["flower"] and "geomkern[fedsim]" in extras["flower"]


def test_fedsim_cli_without_its_extra_says_which_extra_in_one_line():
    res = _python("import sys\nsys.modules['matplotlib'] = None\nfrom fedsim.cli import main\n"
                  "sys.exit(main(['run', '--rounds', '1']))")
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'geomkern[fedsim]'" in lines[0], res.stderr
    assert "matplotlib" in lines[0]


def _setup_module():
    """setup.py as a module (its setup() call runs only as __main__)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("geomkern_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cuda_arch_list_defaults_only_without_a_gpu_and_without_a_choice():
    """No GPU visible and no TORCH_CUDA_ARCH_LIST: build for sm_80 and sm_90 (+PTX) instead of
    torch's arch detection, which indexed an empty device list (IndexError, 8 min into a build)."""
    setup = _setup_module()
    assert setup.default_cuda_arch_list(None, gpu_visible=False) == "8.0;9.0+PTX"
    assert setup.default_cuda_arch_list("", gpu_visible=False) == "8.0;9.0+PTX"
    assert setup.default_cuda_arch_list("7.5", gpu_visible=False) is None  # the user's choice
    assert setup.default_cuda_arch_list(None, gpu_visible=True) is None  # torch asks the GPU


# with the wheel's tests: both write geomkern.egg-info/ in the checkout while they build an sdist
@pytest.mark.xdist_group("wheel-from-sdist")
def test_sdist_holds_every_native_source(tmp_path):
    """The sdist carries every file under csrc/ (headers included: without MANIFEST.in a wheel
    built from it stopped at 'ops.h: No such file or directory')."""
    import tarfile
    res = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "GEOMKERN_NO_CUDA": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    (sdist,) = tmp_path.glob("geomkern-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    native = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*")
              if p.is_file() and p.suffix in (".h", ".cpp", ".cu", ".def")}
    assert native and native <= members, f"missing from the sdist: {sorted(native - members)}"


def test_native_library_carries_no_debug_info():
    """setup.py builds with -g0: the interpreter's CFLAGS carry -g, which made _C 31 MB."""
    import shutil
    lib = next((ROOT / "geomkern").glob("_C.*.so"), None)
    if lib is None or shutil.which("readelf") is None:
        pytest.skip("geomkern._C is not built here, or readelf is missing")
    sections = subprocess.run(["readelf", "-S", "-W", str(lib)], capture_output=True, text=True).stdout
    assert ".debug_info" not in sections, f"{lib.name} has DWARF debug info ({lib.stat().st_size} bytes)"


def test_default_build_is_portable_and_native_arch_is_opt_in():
    """The default build targets baseline x86-64 (the AVX2/AVX-512 kernels are variants picked at
    load); GEOMKERN_NATIVE_ARCH=1 builds for the build machine's CPU. Both keep -ffp-contract=off
    (every variant and tile width computes the same bits) and -g0."""
    setup = _setup_module()
    portable, native = setup.cxx_flags({}), setup.cxx_flags({"GEOMKERN_NATIVE_ARCH": "1"})
    assert not any(f.startswith("-march") for f in portable), portable
    assert "-march=native" in native and "-DGEOMKERN_NATIVE_ARCH" in native, native
    for flags in (portable, native):
        assert "-ffp-contract=off" in flags and "-g0" in flags, flags


def test_only_the_isa_variants_hold_avx_code():
    """In a portable build every function that uses an AVX instruction (VEX/EVEX: a v-mnemonic,
    ymm/zmm or mask registers) belongs to the AVX2 or AVX-512 variant (csrc/cpu/isa.h), so the
    library loads and runs its baseline code on any x86-64 CPU. An inline function of a C++ or
    ATen header compiled inside a variant's target region would show up here."""
    import shutil
    from geomkern.backends import native
    lib = next((ROOT / "geomkern").glob("_C.*.so"), None)
    if lib is None or native._C is None or shutil.which("objdump") is None:
        pytest.skip("geomkern._C is not built and loaded here, or objdump is missing")
    if "baseline" not in native._C.cpu_isas(runnable_only=False):
        pytest.skip("built with GEOMKERN_NATIVE_ARCH=1 or not for x86-64: one variant, no baseline")
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(lib)], capture_output=True,
                          text=True, check=True).stdout
    avx = re.compile(r"^\s+[0-9a-f]+:\s+(v[a-z0-9]+\s|.*%[yz]mm|.*%k[0-7])")
    variant = re.compile(r"geomkern::isa_(avx2|avx512f)::")
    where, offending, variant_fns = None, set(), 0
    for line in dump.splitlines():
        if line.endswith(">:"):
            where = line
        elif where is not None and avx.match(line):
            if variant.search(where):
                variant_fns += 1
            else:
                offending.add(where)
            where = None  # one hit per function is enough
    assert variant_fns > 0, "no AVX code found at all: is this the portable build?"
    assert not offending, f"AVX code outside the ISA variants: {sorted(offending)[:5]}"


_WHEEL_SMOKE = r"""
import sys, torch
import geomkern as gk
assert "/site-packages/geomkern" in gk.__file__, gk.__file__  # the installed wheel, not a checkout
assert "native" in gk.available_backends(), gk.why_not("native", "cpu")
g = torch.Generator().manual_seed(0)
X, Y = torch.randn(300, 7, generator=g) + 2.0, torch.randn(40, 7, generator=g)
off = torch.tensor([0, 120, 300])
def ref(f):
    with gk.set_backend("reference"):
        return f()
checks = {
    "rbf_gram": lambda X: gk.rbf_gram(X, gamma=0.3),
    "rbf_gram cross": lambda X: gk.rbf_gram(X, Y.to(X.dtype), gamma=0.3),
    "rbf_matmul": lambda X: gk.rbf_matmul(X, Y.to(X.dtype), Y.to(X.dtype)[:, :3], gamma=0.3),
    "kpca": lambda X: gk.kpca(X, off, n_components=3, gamma=0.3).eigenvalues,
    "preimage": lambda X: gk.preimage(X[:20], Y.to(X.dtype), gk.rbf_gram(X[:20] + 0.1, Y.to(X.dtype), gamma=0.3),
                                      gamma=0.3, steps=5),
}
for name, f in checks.items():
    got, want = f(X), ref(lambda: f(X.double()))
    err = float((got.double() - want).norm() / want.norm())
    assert err < 1e-5, f"{name}: relative error {err:.2e} against the float64 reference"
km = gk.kmeans(X, 3, offsets=off)
assert km.labels.shape == (300,) and km.centers.shape == (2, 3, 7) and bool((km.inertia > 0).all())
from geomkern.backends import native
cuda_why = gk.why_not("native", "cuda")
assert cuda_why or torch.cuda.is_available(), "no CUDA device, yet no reason"
so = sorted(p.name for p in native._PACKAGE.glob("_C*.so"))
print("ok", gk.resolve("rbf_gram", "cpu"), gk.cpu_isa())
print("so:", " ".join(so))
print("cuda:", cuda_why)
"""


def _wheel_libraries(wheel: Path) -> set[str]:
    import zipfile
    with zipfile.ZipFile(wheel) as z:
        return {n.split("/")[-1] for n in z.namelist() if n.endswith(".so")}


def _assert_import_is_silent(vpy: Path, cwd: Path) -> None:
    """import geomkern prints nothing beyond what import torch prints by itself (a venv that sees
    only torch's folder gets torch's own 'Failed to initialize NumPy' warning)."""
    torch_alone = _run(vpy, "-c", "import torch", cwd=cwd)
    both = _run(vpy, "-c", "import torch; import geomkern", cwd=cwd)
    assert both.stdout == "" and both.stderr == torch_alone.stderr, both.stderr


def _check_smoke(out: str, wheel: Path, torch_cuda: bool) -> None:
    """The smoke script's output for ``wheel`` beside a torch with (torch_cuda) or without CUDA:
    the CPU oracle rows passed, and why_not('native', 'cuda') says why the CUDA kernels do not
    run on this GPU-less machine."""
    lines = out.strip().splitlines()
    assert lines[0].startswith("ok native"), out
    assert lines[1] == "so: " + " ".join(sorted(_wheel_libraries(wheel))), out
    cuda_why = lines[2]
    if "_C_cuda.abi3.so" not in _wheel_libraries(wheel):
        assert "geomkern was not compiled with CUDA" in cuda_why, out
    elif torch_cuda:  # loaded from the wheel, no GPU here
        assert "geomkern._C_cuda (CUDA " in cuda_why and "sees no CUDA device" in cuda_why, out
    else:  # beside a CPU-only torch: not loaded, said why
        assert "is a CPU-only build (torch.version.cuda is None)" in cuda_why, out


def _cuda_home() -> str | None:
    """The CUDA toolkit a build here uses for geomkern._C_cuda: CUDA_HOME, else /usr/local/cuda,
    where it has the runtime's headers and torch is a CUDA build; None: the wheel is CPU-only."""
    import os

    import torch
    if torch.version.cuda is None:
        return None
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "include" / "cuda_runtime.h").is_file() and (Path(home) / "bin" / "nvcc").exists():
            return home
    return None


def _run(*cmd, cwd, cuda=False):
    """cmd, which must succeed; a build in it makes geomkern._C_cuda only with cuda=True."""
    import os
    env = {**os.environ, "GEOMKERN_NO_CUDA": "1"}
    if cuda:
        env.update(GEOMKERN_NO_CUDA="0", CUDA_HOME=_cuda_home())
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=1200, env=env)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def _sdist_key(sdist: Path, *extra: str) -> str:
    """A hash of what a wheel built from ``sdist`` depends on: every member's name and bytes (not
    the archive's, whose timestamps change with each build) and ``extra`` (the torch and nvcc
    versions)."""
    import hashlib
    import tarfile
    h = hashlib.sha256()
    with tarfile.open(sdist) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.isfile():
                h.update(m.name.encode() + b"\0" + tar.extractfile(m).read() + b"\0")
    for e in extra:
        h.update(e.encode() + b"\0")
    return h.hexdigest()[:20]


# Wheels built from the sdist, one per key (_sdist_key): building the CUDA kernels costs minutes on
# this 2-core machine (nvcc: sm_80 and sm_90 SASS and PTX), so an unchanged source, torch and
# toolkit reuse the last wheel; a change of any of them builds again. (.venv is the bootstrap's.)
WHEEL_CACHE = ROOT / ".venv" / "geomkern-test-wheels"


@pytest.fixture(scope="module")
def wheel_from_sdist(tmp_path_factory):
    """Build the sdist, then a wheel from that sdist (not from the tree): the path from a source
    release to a user's environment. With a CUDA torch and toolkit here the one wheel holds
    geomkern._C and _C_cuda (built without a GPU); it is cached by the sdist's contents."""
    import shutil as sh

    import torch
    if not sys.platform.startswith("linux"):
        pytest.skip("builds the C++ library with g++")
    tmp = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", tmp / "dist", ROOT, cwd=tmp)
    (sdist,) = (tmp / "dist").glob("geomkern-*.tar.gz")
    home = _cuda_home()
    nvcc = _run(Path(home) / "bin" / "nvcc", "--version", cwd=tmp).stdout if home else "no CUDA"
    cache = WHEEL_CACHE / _sdist_key(sdist, torch.__version__, nvcc)
    cached = sorted(cache.glob("geomkern-*.whl"))
    if not cached:
        _run(sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
             "-w", tmp / "wheels", sdist, cwd=tmp, cuda=home is not None)
        (built,) = (tmp / "wheels").glob("geomkern-*.whl")
        sh.rmtree(WHEEL_CACHE, ignore_errors=True)  # the previous source's wheel
        cache.mkdir(parents=True)
        cached = [Path(sh.copy2(built, cache / built.name))]
    return sdist, cached[0]


def _venv_with(tmp_path: Path, wheel: Path, *site_dirs: Path) -> Path:
    """A fresh venv that sees ``site_dirs`` (torch and the rest) through a .pth, in that order,
    with ``wheel`` installed into it; returns its python. (The machine's geomkern is an editable
    install whose finder lives in a .pth of its own, which a plain path entry does not run.)"""
    tmp_path.mkdir(parents=True, exist_ok=True)
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    vpy = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "machine_packages.pth").write_text("".join(f"{d}\n" for d in site_dirs))
    _run(sys.executable, "-m", "pip", "--python", vpy, "install", "-q", "--no-deps", "--ignore-installed",
         wheel, cwd=tmp_path)
    return vpy


@pytest.mark.xdist_group("wheel-from-sdist")
def test_sdist_builds_a_wheel_that_works_in_a_clean_venv(tmp_path, wheel_from_sdist):
    """The wheel built from the sdist, in a fresh venv that sees only this machine's torch, run
    from outside the repository: the ops against the float64 reference, the native backend
    listed. The wheel holds no Python-version or torch-version binary: it is tagged abi3."""
    import torch

    wheel = wheel_from_sdist[1]
    assert "-cp310-abi3-" in wheel.name, wheel.name
    # one wheel for CPU and CUDA: _C_cuda inside wherever this machine can build it
    want = {"_C.abi3.so"} | ({"_C_cuda.abi3.so"} if _cuda_home() else set())
    assert _wheel_libraries(wheel) == want, (wheel.name, _wheel_libraries(wheel))
    vpy = _venv_with(tmp_path, wheel, Path(torch.__file__).resolve().parents[1])
    _assert_import_is_silent(vpy, tmp_path)
    out = _run(vpy, "-c", _WHEEL_SMOKE, cwd=tmp_path).stdout
    _check_smoke(out, wheel, torch.version.cuda is not None)


def _other_torch_wheel() -> Path | None:
    """A CPU torch wheel of another version than the one running the tests (this machine keeps
    2.13.0 and 2.14.1 in /opt/wheels; GEOMKERN_OTHER_TORCH_WHEEL names one elsewhere)."""
    import os

    import torch
    mine = torch.__version__.split("+")[0]
    named = os.environ.get("GEOMKERN_OTHER_TORCH_WHEEL")
    found = [Path(named)] if named else sorted(Path("/opt/wheels").glob("torch-2.*-cp311-*.whl"))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return next((w for w in found if w.is_file() and f"-{tag}-" in w.name
                 and not w.name.startswith(f"torch-{mine}")), None)


@pytest.mark.xdist_group("wheel-from-sdist")
def test_one_wheel_loads_into_another_torch(tmp_path, wheel_from_sdist):
    """geomkern._C and _C_cuda are on torch's stable ABI (setup.py), so a wheel is not tied to the
    torch it was built with. Both ways: this machine's wheel (with _C_cuda where it was built),
    not rebuilt, beside another torch version (2.13.0, a CPU-only build: _C_cuda is not loaded
    and why_not says so); and a wheel built from the sdist against that other torch, beside this
    machine's torch. Each time: import geomkern silent, native listed, every CPU op against the
    float64 reference, a reason from why_not('native', 'cuda')."""
    import numpy
    import torch

    other = _other_torch_wheel()
    if other is None:
        pytest.skip("no CPU torch wheel of another version than this one in /opt/wheels "
                    "(set GEOMKERN_OTHER_TORCH_WHEEL)")
    sdist, wheel = wheel_from_sdist
    mine = Path(torch.__file__).resolve().parents[1]
    numpy_site = Path(numpy.__file__).resolve().parents[1]
    site = tmp_path / "other-torch"
    _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", site, other,
         cwd=tmp_path)
    want = other.name.split("-")[1].split("+")[0]
    # this machine's wheel beside the other torch
    vpy = _venv_with(tmp_path / "a", wheel, site, mine, numpy_site)
    version = _run(vpy, "-c", "import torch; print(torch.__version__)", cwd=tmp_path).stdout.strip()
    assert version.split("+")[0] == want != torch.__version__.split("+")[0], (version, other.name)
    _assert_import_is_silent(vpy, tmp_path)
    other_cuda = _run(vpy, "-c", "import torch; print(torch.version.cuda is not None)", cwd=tmp_path).stdout
    out = _run(vpy, "-c", _WHEEL_SMOKE, cwd=tmp_path).stdout
    _check_smoke(out, wheel, other_cuda.strip() == "True")
    # and the reverse: a wheel built from the sdist against the other torch, beside this one
    build = tmp_path / "build-env"
    _run(sys.executable, "-m", "venv", "--without-pip", build, cwd=tmp_path)
    bpy = build / "bin" / "python"
    purelib = Path(_run(bpy, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                        cwd=tmp_path).stdout.strip())
    (purelib / "machine_packages.pth").write_text(f"{site}\n{mine}\n{numpy_site}\n")
    assert _run(bpy, "-c", "import torch; print(torch.__version__)", cwd=tmp_path).stdout.startswith(want)
    _run(bpy, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", tmp_path / "w2", sdist,
         cwd=tmp_path)
    (wheel2,) = (tmp_path / "w2").glob("geomkern-*.whl")
    vpy = _venv_with(tmp_path / "b", wheel2, mine, numpy_site)
    out = _run(vpy, "-c", _WHEEL_SMOKE, cwd=tmp_path).stdout
    _check_smoke(out, wheel2, torch.version.cuda is not None)


def _needed(so: Path) -> list[str]:
    """The shared libraries an ELF file names as NEEDED (readelf -d)."""
    out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_built_extensions_need_the_shared_libstdcxx():
    """Every compiled module links libstdc++ as a shared library (setup.SHARED_LIBSTDCXX): built
    by a compiler that links it statically, _C_cuda carried its own copy beside torch's, and the
    first number an error message formatted crashed the process (GPU session 12)."""
    sos = sorted((ROOT / "geomkern").glob("_C*.so"))
    if not sos:
        pytest.skip("no geomkern/_C*.so built in this checkout")
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    for so in sos:
        assert "libstdc++.so.6" in _needed(so), f"{so.name} needs {_needed(so)}"
    assert _setup_module().SHARED_LIBSTDCXX == ["-lstdc++"]


_THROW_BUILD = """
import sys, torch, torch.utils.cpp_extension as ce
name, build, ldflags = sys.argv[1], sys.argv[2], sys.argv[3:]
std = "-std=c++20" if tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 14) else "-std=c++17"
m = ce.load(name=name, sources=[{src!r}],
            extra_cflags=["-O3", "-g0", std], extra_ldflags=ldflags, build_directory=build)
print(repr(m.format_dbl()))
try:
    m.check_tensor(torch.zeros(2, 3), -1.0)
except RuntimeError as e:
    print(repr(str(e).splitlines()[0]))
"""


@pytest.mark.slow
def test_static_libstdcxx_breaks_number_formatting_and_the_link_flag_fixes_it(tmp_path):
    """The mechanism behind GPU session 12's crash, reproduced on this CPU machine: the small
    extension of studies/preimage-throw/ built with a forced -static-libstdc++ (what the GPU image's
    compiler does), then with setup.py's flag added. The second formats numbers and raises with
    them in the message; the first, here, formats none (on the GPU image it crashed)."""
    setup = _setup_module()
    code = _THROW_BUILD.format(src=str(ROOT / "studies" / "preimage-throw" / "throwtest.cpp"))
    outs = {}
    for name, flags in (("static", ["-static-libstdc++"]),
                        ("fixed", ["-static-libstdc++"] + setup.SHARED_LIBSTDCXX)):
        build = tmp_path / name
        build.mkdir()
        res = subprocess.run([sys.executable, "-c", code, f"throw_{name}", str(build), *flags],
                             capture_output=True, text=True, timeout=600)
        outs[name] = (res.returncode, res.stdout.strip().splitlines())
        if name == "fixed":
            so = next(build.glob("throw_fixed*.so"))
            if shutil.which("readelf"):
                assert "libstdc++.so.6" in _needed(so)
    rc, lines = outs["fixed"]
    assert rc == 0 and lines == ["'1.5 7'", "'g = -1 for [2, 3]'"], outs
    # the static build alone must show the fault, or this test no longer shows what the flag fixes
    assert outs["static"] != outs["fixed"], f"-static-libstdc++ alone formats numbers here: {outs}"
    print("forced static libstdc++ alone:", outs["static"])
