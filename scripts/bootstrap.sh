#!/usr/bin/env bash
# Sets up .venv inside the repo and installs geomkern (with the compiled geomkern._C) plus the
# extras `make run` and `make test` need: fedsim (the simulator's packages) and test.
# Safe to re-run: it only rebuilds when setup.py, pyproject.toml or csrc/ changed.
#
# torch: a torch that Python already sees (e.g. a CUDA build on a GPU machine) is reused, never
# replaced: the venv is made with --system-site-packages and torch is installed only if missing,
# as torch==2.13.0 (served from a local CPU wheel on the project's machines). The extension is
# built with --no-build-isolation so pip never fetches a second torch into a build environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
TORCH_SPEC=${GEOMKERN_TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[bootstrap] creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
VPY="$VENV/bin/python"

if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "[bootstrap] no torch found; installing $TORCH_SPEC"
  "$VPY" -m pip install -q "$TORCH_SPEC"
fi

stamp_file="$VENV/.geomkern-build-stamp"
stamp=$( { cat setup.py pyproject.toml; find csrc -type f | sort | xargs cat; "$VPY" -c "import torch; print(torch.__version__)"; } | sha256sum | cut -d' ' -f1)
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && "$VPY" -c "import geomkern._C" >/dev/null 2>&1; then
  echo "[bootstrap] geomkern up to date ($("$VPY" -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi
echo "[bootstrap] installing build tools"
"$VPY" -m pip install -q setuptools wheel pybind11 ninja
# Dependencies come from pyproject.toml; the torch present satisfies its torch requirement, so
# pip leaves it alone.
echo "[bootstrap] building geomkern._C (C++/OpenMP) and installing geomkern[fedsim,test]"
"$VPY" -m pip install -q --no-build-isolation -e ".[fedsim,test]"
"$VPY" -c "import geomkern as gk; print('[bootstrap] backends:', gk.available_backends())"
echo "$stamp" > "$stamp_file"
