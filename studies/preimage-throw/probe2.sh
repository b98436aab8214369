#!/usr/bin/env bash
# Second probe (GPU session 12): the toolchain, a small extension's throws one by one
# (throwtest.cpp), and geomkern._C_cuda.preimage_gd's refusals of different kinds.
# Output: $OUT/probe2.log. Needs geomkern/_C_cuda*.so built (scripts/gpu_session.py's build step).
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
LOG=${OUT:-.}/probe2.log
HERE=studies/preimage-throw
{
  echo "=== toolchain"; for c in c++ g++ gcc /opt/gcc/bin/g++; do command -v $c && $c --version | head -1; done
  echo "CC=${CC:-} CXX=${CXX:-}"
  $PY -c "import torch; print(torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI, torch.compiled_with_cxx11_abi())"
  $PY -c "import torch, re; cfg = torch.__config__.show(); print([l for l in cfg.splitlines() if 'Compiler' in l or 'GCC' in l or 'CXX_COMPILER' in l][:4])"
  ls -la /lib/x86_64-linux-gnu/libstdc++.so.6* /opt/gcc/lib64/libstdc++.so.6* 2>&1 | head
  grep -ao "GLIBCXX_3\.4\.[0-9]*" /lib/x86_64-linux-gnu/libstdc++.so.6 | sort -V | tail -1
} >>"$LOG" 2>&1
echo "=== build throwtest" >>"$LOG"
timeout 120 $PY - >>"$LOG" 2>&1 <<PYEOF
import os, time, torch, torch.utils.cpp_extension as ce
t = time.time()
std = "-std=c++20" if tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 14) else "-std=c++17"  # as setup.py
os.makedirs("/tmp/throwtest", exist_ok=True)
ce.load(name="throwtest", sources=["$HERE/throwtest.cpp"], extra_cflags=["-O3", "-g0", std],
        build_directory="/tmp/throwtest", verbose=True)
print("built in", round(time.time() - t, 1), "s")
PYEOF
for f in format_dbl format_str check_str check_int check_dbl std_throw check_dbl_nogil check_tensor check_tensor_cuda; do
  echo "=== $f" >>"$LOG"
  arg=""; [ $f = check_tensor ] && arg="torch.zeros(2, 3), -1.0"
  [ $f = check_tensor_cuda ] && { f=check_tensor; arg="torch.zeros(2, 3, device='cuda'), -1.0"; }
  timeout 60 $PY -X faulthandler -c "import sys, torch; sys.path.insert(0, '/tmp/throwtest')
import throwtest as t
try: print('returned', t.$f($arg), flush=True)
except RuntimeError as e: print('raised', str(e).splitlines()[0][:120], flush=True)
print('after', flush=True)" >>"$LOG" 2>&1
  echo "--- $f: exit $?" >>"$LOG"
done
pre='import torch, geomkern
from geomkern.backends import native
C = native._C_cuda
def say(*a): print(*a, flush=True)
'
run() {
  echo "=== $1" >>"$LOG"
  timeout 60 $PY -X faulthandler -c "$pre$2" >>"$LOG" 2>&1
  echo "--- $1: exit $?" >>"$LOG"
}
run "G preimage_gd on CPU tensors (check_input's refusal, as eigh's)" "z = torch.zeros(2, 4)
try: C.preimage_gd(z, torch.zeros(3, 4), torch.zeros(2, 3), 1.0, 2, torch.ones(2))
except RuntimeError as e: say('raised:', str(e)[:160])
say('after')"
run "H preimage_gd with T of the wrong shape (a message with int64 and sizes)" "z = torch.zeros(2, 4, device='cuda')
try: C.preimage_gd(z, torch.zeros(3, 4, device='cuda'), torch.zeros(2, 5, device='cuda'), 1.0, 2, torch.ones(2, device='cuda'))
except RuntimeError as e: say('raised:', str(e)[:160])
say('after')"
run "I eigh with n over the Jacobi limit (an inline check with an int64)" "A = torch.eye(4096, device='cuda')
try: C.eigh(A, 1e-7, 10)
except RuntimeError as e: say('raised:', str(e)[:160])
say('after')"
