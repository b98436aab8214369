#!/usr/bin/env bash
# Everything issues 5 and 6 need from a lent GPU machine, in one call (the machine is bare each
# time and device minutes are scarce):
#   1. build geomkern._C + geomkern._C_cuda in place with the machine's CUDA torch and nvcc,
#      keeping the build log (issue 6 asks for its "CUDA kernels built" line);
#   2. the GPU-marked correctness tests (Triton kernels, CUDA Jacobi eigh / pre-image, the
#      reference ops on CUDA tensors, the CuPy eigh path);
#   3. the GPU benchmarks (Triton ops vs eager / torch.compile / KeOps; eigh: ours vs torch vs
#      CuPy), whose JSON lands in benchmarks/results/ and is copied to $OUT.
#
# Prepare here once (the machine cannot download; dp-accounting is the only missing package):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl dp-accounting==0.6.0 dm-tree==0.1.10
# then call the device tool with carry [".whl"] and the command `bash scripts/gpu_session.sh`.
# Each step has its own time limit so the whole call ends inside the tool's 10 minutes.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| triton', triton.__version__)"
    $PY -c "import cupy; print('cupy', cupy.__version__)" 2>&1
    nvcc --version | tail -1
} 2>&1 | tee "$OUT/env.txt"

# 1. build in place (no pip: the image's torch stays untouched)
timeout 300 $PY setup.py build_ext --inplace 2>&1 | tee "$OUT/build.log" | grep -E "geomkern|error" || true
$PY -c "import geomkern as gk; print('backends', gk.available_backends())" 2>&1 | tee -a "$OUT/build.log"

# 1b. issue 13: the sm_90 compile report's cases timed beside its model (benchmarks/gpu_model.py)
timeout 240 $PY benchmarks/sm90_report.py --measure --out "$OUT/sm90-measured.json" 2>&1 | tee "$OUT/sm90_report.log" | tail -45

# 2. GPU correctness
timeout 240 $PY -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" \
    tests/test_triton.py tests/test_cuda_native.py tests/test_kpca.py tests/test_moments.py \
    tests/test_preimage.py tests/test_rbf.py tests/test_kmeans.py tests/test_dispatch.py \
    tests/test_validation.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -15

# 3. GPU benchmarks (results JSON written by benchmarks/conftest.py)
timeout 240 $PY -m pytest -q --benchmark-only -p no:cacheprovider \
    benchmarks/test_eigh_gpu.py benchmarks/test_triton_gpu.py 2>&1 | tee "$OUT/gpu_bench.log" | tail -40
cp benchmarks/results/eigh_gpu-*.json benchmarks/results/triton_gpu-*.json "$OUT"/ 2>/dev/null
ls -la "$OUT"
