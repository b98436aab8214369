#!/usr/bin/env bash
# Where does geomkern._C_cuda.preimage_gd's refusal crash a process on an H100? (GPU sessions 9,
# 11 and 12: "exit -11" with nothing on stderr, while _C_cuda.eigh's own refusals raise cleanly.)
# Each variant runs in its own child under faulthandler, with a flushed line before and after
# the call, so the log says whether the throw, the message, or the process's exit crashes.
# Needs the built extension in geomkern/ and a GPU. Output: $OUT/probe.log (or ./probe.log).
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
LOG=${OUT:-.}/probe.log
pre='import os, sys, torch, geomkern
from geomkern.backends import native
C = native._C_cuda
def say(*a): print(*a, flush=True)
'
run() {  # name, code
    echo "=== $1" >>"$LOG"
    timeout 60 $PY -X faulthandler -c "$pre$2" >>"$LOG" 2>&1
    echo "--- $1: exit $?" >>"$LOG"
}
big='Z0 = torch.randn(2, 40000, device="cuda"); B = torch.randn(3, 40000, device="cuda")
T = torch.rand(2, 3, device="cuda"); lr = torch.ones(2, device="cuda")
'
run "A early check (gamma < 0, thrown before the shared-memory query)" "${big}say('call')
try: C.preimage_gd(Z0[:, :8].contiguous(), B[:, :8].contiguous(), T, -1.0, 2, lr)
except RuntimeError as e: say('raised:', str(e)[:200])
say('after')"
run "B too large, then os._exit(0)" "${big}say('points', C.preimage_gd_points(3, 40000, False, 0))
say('call')
try: C.preimage_gd(Z0, B, T, 1e-4, 2, lr)
except RuntimeError as e: say('raised:', str(e)[:200])
say('after'); os._exit(0)"
run "C too large, normal exit (the test)" "${big}say('call')
try: C.preimage_gd(Z0, B, T, 1e-4, 2, lr)
except RuntimeError as e: say('raised:', str(e)[:200])
say('after')"
run "D shared-memory query, then eigh's refusal" "say('points', C.preimage_gd_points(3, 40000, False, 0))
try: C.eigh(torch.eye(3), 1e-7, 10)
except RuntimeError as e: say('raised:', str(e)[:200])
say('after')"
run "E float64 S = D = 1500" "Z0 = torch.randn(3, 1500, device='cuda', dtype=torch.float64); B = torch.randn(1500, 1500, device='cuda', dtype=torch.float64)
say('call')
try: C.preimage_gd(Z0, B, torch.rand(3, 1500, device='cuda', dtype=torch.float64), 1e-4, 2, torch.ones(3, device='cuda', dtype=torch.float64))
except RuntimeError as e: say('raised:', str(e)[:200])
say('after')"
if command -v gdb >/dev/null; then
    echo "=== F gdb backtrace of C" >>"$LOG"
    timeout 90 gdb -q -batch -ex run -ex bt -ex "info sharedlibrary libcudart" --args $PY -c "$pre${big}
try: C.preimage_gd(Z0, B, T, 1e-4, 2, lr)
except RuntimeError as e: say('raised:', str(e)[:200])
say('after')" >>"$LOG" 2>&1
    echo "--- F: exit $?" >>"$LOG"
else
    echo "=== F: no gdb on this machine" >>"$LOG"
fi
$PY - >>"$LOG" 2>&1 <<'PYEOF'
import subprocess, geomkern.backends.native as n, glob
so = glob.glob("geomkern/_C_cuda*.so")
print("ldd:", subprocess.run(["ldd"] + so, capture_output=True, text=True).stdout)
PYEOF
