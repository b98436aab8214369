#!/usr/bin/env bash
# Sets up .venv inside the repo and installs geomkern (with the compiled geomkern._C) plus the
# extras `make run` and `make test` need: fedsim (the simulator's packages), test and docs (the
# documentation site, which the tests build).
# Safe to re-run: it only rebuilds when setup.py, pyproject.toml or csrc/ changed.
#
# torch: a torch that Python already sees (e.g. a CUDA build on a GPU machine) is reused, never
# replaced: the venv is made with --system-site-packages and torch is installed only if missing,
# as torch==2.14.1 with torchvision==0.29.1 (both served from local wheel files on the project's
# machines; a CUDA build, which runs on the CPU). torchvision is what open_clip (the image encoder
# of `fedsim embed`) imports, and it has no PyPI build that imports beside the CPU torch 2.13.0
# this script installed before; docs/history.md (§14, "The image path in the default tests") has
# the set-up time, disk and test time of this choice against a second venv for the open_clip tests.
# With that torchvision importable, open_clip_torch and timm are added with --no-deps (they never
# replace torch); beside a torch of yours without one, open_clip is left out and its tests skip.
# The extensions are built with --no-build-isolation so pip never fetches a second torch into a
# build environment. geomkern._C_cuda (the CUDA kernels, on torch's stable ABI like _C) is built
# wherever torch is a CUDA build and a CUDA toolkit is found, GPU or not: the dev install then
# holds what the wheel holds, and its loading (no GPU: gk.why_not says so) is tested here too
# (nvcc: ~30 s more, once per change of the sources). CUDA_HOME defaults to /usr/local/cuda where
# that is a toolkit; GEOMKERN_NO_CUDA=1 skips the CUDA kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
TORCH_SPEC=${GEOMKERN_TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}  # one or more requirements

if [ ! -x "$VENV/bin/python" ]; then
  echo "[bootstrap] creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
VPY="$VENV/bin/python"

if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "[bootstrap] no torch found; installing $TORCH_SPEC"
  # shellcheck disable=SC2086  # a list of requirements, split on purpose
  "$VPY" -m pip install -q $TORCH_SPEC
fi
if "$VPY" -c "import torchvision" >/dev/null 2>&1; then clip=1; else clip=0; fi
GEOMKERN_NO_CUDA=${GEOMKERN_NO_CUDA:-0}
export GEOMKERN_NO_CUDA
if [ -z "${CUDA_HOME:-}" ] && [ -f /usr/local/cuda/include/cuda_runtime.h ]; then
  export CUDA_HOME=/usr/local/cuda  # torch would take /usr/local from a /usr/local/bin/nvcc wrapper
fi

stamp_file="$VENV/.geomkern-build-stamp"
stamp=$( { cat setup.py pyproject.toml; find csrc -type f | sort | xargs cat; "$VPY" -c "import torch; print(torch.__version__)"; echo "clip=$clip no_cuda=$GEOMKERN_NO_CUDA cuda_home=${CUDA_HOME:-}"; } | sha256sum | cut -d' ' -f1)
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && "$VPY" -c "from geomkern.backends import native; raise SystemExit(bool(native.why_not('cpu')))" >/dev/null 2>&1; then
  echo "[bootstrap] geomkern up to date ($("$VPY" -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi
echo "[bootstrap] installing build tools"
"$VPY" -m pip install -q 'setuptools>=77' wheel ninja  # pyproject's build requirement
# Dependencies come from pyproject.toml; the torch present satisfies its torch requirement, so
# pip leaves it alone.
extras=fedsim,test,docs
[ "$clip" = 1 ] && extras=fedsim,test,docs,clip
echo "[bootstrap] building geomkern._C (C++/OpenMP) and _C_cuda (where CUDA is found), installing geomkern[$extras]"
"$VPY" -m pip install -q --no-build-isolation -e ".[$extras]"
if [ "$clip" = 1 ]; then
  echo "[bootstrap] installing open_clip (fedsim embed's image encoder) beside torchvision"
  "$VPY" -m pip install -q --no-deps open_clip_torch 'timm>=1.0.17'
  "$VPY" -c "import open_clip" || { echo "[bootstrap] open_clip does not import (above)" >&2; exit 1; }
else
  echo "[bootstrap] open_clip left out: no torchvision imports beside $("$VPY" -c 'import torch; print("torch", torch.__version__)') (fedsim embed --encoder open_clip and its tests need it; docs/data.md says how to add it)"
fi
"$VPY" -c "import geomkern as gk; print('[bootstrap] backends:', gk.available_backends())"
echo "$stamp" > "$stamp_file"
