#!/usr/bin/env bash
# The one prepared call for a lent GPU machine (issue 28): scripts/gpu_session.py has the steps,
# their order and limits, and how to prepare the call. Here: the carried wheels, then the driver.
#   GPU:      bash scripts/gpu_session.sh                    (device tool: carry [".whl"], timeout_s 480)
#   dry run:  GPU_SESSION_DRY=1 bash scripts/gpu_session.sh  (CPU; tests/test_gpu_session.py runs it)
#   .whl/ (git-ignored): geomkern's own wheel (CPU + CUDA kernels, built here), dp-accounting +
#   dm-tree, and pykeops + keopscore for the peers step; how to make and fetch them before a draw:
#   scripts/gpu_session.py's docstring ("Prepare here")
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
# the dependencies' wheels only: a geomkern wheel there is the driver's first step (its "wheel"
# step installs it into a folder of its own and tests it; the source build is the fallback)
deps=$(ls .whl/*.whl 2>/dev/null | grep -v '/geomkern-')
if [ -n "$deps" ] && [ "${GPU_SESSION_DRY:-0}" != 1 ]; then
    # shellcheck disable=SC2086  # a list of files, split on purpose
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $deps \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
exec $PY scripts/gpu_session.py
