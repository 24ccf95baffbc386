"""Real `accelerate launch` runs: two CPU processes with DDP (gloo)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, os, sys
from verl_hf.cli import parse_config
from verl_hf.runner import run_training
script, config = parse_config(sys.argv[1], sys.argv[2:])
summary = run_training(script, config)
with open(os.path.join(config.output_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(summary, f)
"""


def test_ddp_two_processes_train_and_agree_on_metrics(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script),
           str(REPO / "examples/configs/demo.yaml"), "--max_steps", "4", "--eval_steps", "2", "--logging_steps", "2",
           "--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64", "--use_cpu", "false",
           "--output_dir", str(tmp_path / "out")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert summaries[0]["steps"] == summaries[1]["steps"] == 4
    # Metrics are pooled over both processes, and evaluation covers all 200 problems once: ranks agree.
    for key in ("accuracy_before", "accuracy_after", "reward_first", "reward_last"):
        assert summaries[0][key] == summaries[1][key], key
    assert summaries[0]["accuracy_before"] == 0.315  # the warm start's accuracy on the full held-out set
