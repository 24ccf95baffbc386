"""Every algorithm on the demo task, side by side in one run: reward and held-out accuracy after N steps,
and seconds per optimizer step (CPU).

    python benchmarks/algorithms.py --steps 200 [--algorithms grpo ppo ...]

Each algorithm is its YAML in examples/configs/ (the same files `verl-hf train` reads), with max_steps
overridden; accuracy is greedy exact match on the 200 held-out problems.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"
ALGORITHMS = ["grpo", "drgrpo", "dapo", "gspo", "rloo", "reinforce_pp", "remax", "ppo"]


def run(name: str, steps: int, seed: int = 0) -> dict:
    from verl_hf.cli import parse_config
    from verl_hf.runner import run_training

    with tempfile.TemporaryDirectory() as out:
        overrides = ["--max_steps", str(steps), "--eval_strategy", "no", "--logging_steps", str(max(steps // 10, 1)),
                     "--output_dir", out, "--seed", str(seed)]
        return run_training(*parse_config(str(CONFIGS / f"{name}.yaml"), overrides))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    args = parser.parse_args()
    rows = [(name, run(name, args.steps, args.seed)) for name in args.algorithms]
    print("\n| algorithm | train reward first -> last | held-out accuracy before -> after | s/step |")
    print("|---|---|---|---:|")
    for name, s in rows:
        print(f"| {name} | {s['reward_first']:.3f} -> {s['reward_last']:.3f} | "
              f"{s['accuracy_before']:.3f} -> {s['accuracy_after']:.3f} | {s['seconds_per_step']:.3f} |")


if __name__ == "__main__":
    main()
