#!/usr/bin/env bash
# Fill gpu_wheels/ (ignored by git) with the wheels the lent GPU machine lacks, for its Python 3.12:
#
#   bash scripts/gpu_wheels.sh            # from the repository root, here (it needs PyPI and .venv)
#
# That machine has torch (CUDA), transformers, accelerate, peft, pytest, numpy, pandas, pyarrow, safetensors,
# tokenizers, matplotlib and tensorboard, reaches no package registry, and a device call carries at most 64 MiB of
# files. So what it lacks travels as wheels: datasets, evaluate, trl and deepspeed with the needs of theirs that
# nothing there brings. scripts/gpu_check.sh installs them on arrival, without pip reaching anything:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site gpu_wheels/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#
# --no-deps on both sides: the list below is the closure, checked at the end against every wheel's Requires-Dist.
# Assumed there already, as needs of what it has: huggingface_hub with its filelock, fsspec, httpx, certifi and
# idna (transformers), pyyaml, tqdm, packaging, safetensors, tokenizers (transformers), psutil (accelerate), jinja2
# and typing_extensions (torch), numpy, pandas, pyarrow. A need outside both lists is printed as MISSING and the
# script exits 1. Not checked from here: the versions there (datasets 5.2 wants huggingface_hub>=1.31 and
# pyarrow>=24); the check's environment section lists any need the installed versions do not meet.
#
# Versions: the ones .venv tests with (datasets, evaluate, deepspeed and the needs), trl 1.16 (benchmarks/vs_trl.py
# measures against it). fsspec travels although huggingface_hub brings one: datasets caps it (<=2026.9.0) and a
# newer one there would break `import datasets`. requests travels for evaluate (huggingface_hub 1.x uses httpx).
# deepspeed has no wheel on PyPI: it is built here from its sdist with DS_BUILD_OPS=0, a pure-Python wheel whose
# ops DeepSpeed compiles on first use (ZeRO-3 with the Trainer's torch AdamW compiles none).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DIR=gpu_wheels
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
# This machine's pip also lists local file:// indexes that hold none of these: one warning per package, dropped.
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

rm -rf "$DIR" && mkdir -p "$DIR"
PACKAGES=(
    "datasets==$(version datasets)" "dill==$(version dill)" "multiprocess==$(version multiprocess)"
    "xxhash==$(version xxhash)" "fsspec==$(version fsspec)"                          # datasets
    "evaluate==$(version evaluate)" "requests==$(version requests)" "urllib3==$(version urllib3)"
    "charset-normalizer==$(version charset-normalizer)"                               # evaluate
    "trl==1.16.*"                                                                     # benchmarks/vs_trl.py
    "hjson==$(version hjson)" "msgpack==$(version msgpack)" "ninja==$(version ninja)" "einops==$(version einops)"
    "py-cpuinfo==$(version py-cpuinfo)" "pydantic==$(version pydantic)" "pydantic-core==$(version pydantic-core)"
    "annotated-types==$(version annotated-types)" "typing-inspection==$(version typing-inspection)"  # deepspeed
    "typing-extensions==$(version typing-extensions)"  # pydantic 2.14 wants one newer than torch needs (>=4.16)
)
# PIP_CONSTRAINT="": the machine-wide constraint file caps torch for this machine's own installs; none applies here.
PIP_CONSTRAINT="" "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DIR" "${PACKAGES[@]}" 2>&1 | quiet
DS_BUILD_OPS=0 PIP_CONSTRAINT="" "$PY" -m pip wheel -q --no-deps --no-build-isolation \
    "deepspeed==$(version deepspeed)" -w "$DIR" 2>&1 | quiet

# The closure check: every wheel's needs (for CPython 3.12 on Linux, no extras) shipped or assumed there.
"$PY" - "$DIR" <<'PYEOF'
import sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon

ASSUMED = {canon(n) for n in "torch transformers accelerate peft huggingface-hub numpy pandas pyarrow pyyaml tqdm "
           "packaging psutil jinja2 typing-extensions safetensors tokenizers filelock certifi idna".split()}
ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux", "platform_system": "Linux",
       "os_name": "posix", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
shipped = {canon(w.name.split("-")[0]) for w in wheels}
missing = []
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if (req.marker is None or req.marker.evaluate(ENV)) and canon(req.name) not in shipped | ASSUMED:
                missing.append(f"{wheel.name} needs {req}")
    print(f"  {wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
names = [canon(w.name.split("-")[0]) for w in wheels]
twice = sorted({n for n in names if names.count(n) > 1})
print(f"{len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB in all (a device call carries "
      f"64 MiB)")
if missing or twice:
    sys.exit("MISSING: " + "; ".join(missing) + (f" TWICE: {twice}" if twice else ""))
PYEOF
