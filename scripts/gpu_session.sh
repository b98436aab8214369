#!/usr/bin/env bash
# The one prepared call for a lent GPU machine (issue 28): scripts/gpu_session.py has the steps,
# their order and limits, and how to prepare the call. Here: the carried wheels, then the driver.
#   GPU:      bash scripts/gpu_session.sh                    (device tool: carry [".whl"], timeout_s 480)
#   dry run:  GPU_SESSION_DRY=1 bash scripts/gpu_session.sh  (CPU; tests/test_gpu_session.py runs it)
#   .whl/ (git-ignored): dp-accounting + dm-tree, and pykeops + keopscore for the peers step; how to
#   fetch them before a draw: scripts/gpu_session.py's docstring ("Prepare here")
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
if ls .whl/*.whl >/dev/null 2>&1 && [ "${GPU_SESSION_DRY:-0}" != 1 ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
exec $PY scripts/gpu_session.py
