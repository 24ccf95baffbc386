#!/usr/bin/env bash
# The GPU check on the lent GPU machine (one H100 or H200, Python 3.12, no network): installs the wheels it lacks
# from gpu_wheels/ (made here by `bash scripts/gpu_wheels.sh`; they travel with the working tree) into /tmp/site,
# puts them and this checkout on PYTHONPATH, and runs scripts/gpu_check.py with the arguments given:
#
#   bash scripts/gpu_check.sh [--only SECTION ...] [--out DIR]    # from the repository root, about 8 minutes
#   bash scripts/gpu_check.sh --cpu --out /tmp/gc                 # the CPU mode (tests/test_gpu_check.py runs it)
#
# gpu_wheels/ is ignored by git: a call to the GPU machine must carry it explicitly (with the working tree).
# Sections, figures and the verdict (OUT/verdict.json, exit 1 if a section FAILED): see scripts/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python  # here: the project's environment
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The wheels are built for Python 3.12 (the GPU machine's); any other Python keeps what it has.
if compgen -G "gpu_wheels/*.whl" > /dev/null && "$PY" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))"; then
    # --no-deps: gpu_wheels.sh checked the closure; --no-index: nothing is reachable from that machine anyway
    if "$PY" -m pip --version > /dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site gpu_wheels/*.whl
    else  # no pip there: a wheel is a zip laid out for site-packages (none of these needs its install scripts)
        "$PY" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall('/tmp/site') for w in sys.argv[1:]]" \
            gpu_wheels/*.whl
    fi
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PY" scripts/gpu_check.py "$@"
