"""Every algorithm, selected by configuration alone (its YAML in examples/configs/), learns the demo task.

Each run starts from the shipped warm start (greedy accuracy 0.315 on the 200 held-out problems) and must
raise the held-out accuracy and the training reward. Steps and margins are set from measured runs
(benchmarks/algorithms.py) with room for noise; the runs are deterministic on a given machine.
"""

from pathlib import Path

import pytest

from verl_hf.cli import parse_config
from verl_hf.runner import run_training

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"

# algorithm -> (optimizer steps, least held-out accuracy gain). Measured on 2026-11-29 (2 cores, AMD EPYC with
# AVX512-BF16): every run gained 11.5 to 19 points at these step counts (grpo +13.0, drgrpo +16.0, dapo +14.5,
# gspo +17.5, rloo +11.5, reinforce_pp +18.5, remax +17.0, ppo +19.0). Runs are deterministic per machine, but
# another CPU's kernels (2026-12-01, Intel Xeon with AMX) take another trajectory: drgrpo gained +7.0 there.
RUNS = {
    "grpo": (60, 0.08),
    "drgrpo": (60, 0.05),
    "dapo": (40, 0.08),
    "gspo": (60, 0.08),
    "rloo": (60, 0.08),
    "reinforce_pp": (60, 0.08),
    "remax": (60, 0.08),
    "ppo": (200, 0.08),  # 4 optimizer steps per rollout of 64 prompts
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_algorithm_learns_the_demo_task(name, tmp_path):
    steps, least_gain = RUNS[name]
    overrides = ["--max_steps", str(steps), "--eval_strategy", "no", "--logging_steps", str(steps // 10),
                 "--output_dir", str(tmp_path)]
    summary = run_training(*parse_config(str(CONFIGS / f"{name}.yaml"), overrides))
    assert summary["steps"] == steps
    assert summary["accuracy_after"] - summary["accuracy_before"] >= least_gain, summary
    assert summary["reward_last"] > summary["reward_first"], summary
