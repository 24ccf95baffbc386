"""Seconds per phase of one GRPO step on the demo configuration (CPU), measured side by side.

Runs `--steps` optimizer steps for each batch size given and prints one row per batch size: rollout,
reward, advantage and update seconds per step, whole-step wall time, and generated tokens per second.
Phase times come from the trainer's own `time/*` metrics.

    python benchmarks/step_phases.py --steps 30 --batch_sizes 64 128 256
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def measure(batch_size: int, steps: int) -> dict:
    from verl_hf import VerlTrainer
    from verl_hf.cli import DEMO_CONFIG, parse_config
    from verl_hf.runner import load_policy_path, load_splits

    with tempfile.TemporaryDirectory() as out:
        script, config = parse_config(str(DEMO_CONFIG), [
            "--max_steps", str(steps), "--logging_steps", str(steps), "--eval_strategy", "no",
            "--per_device_train_batch_size", str(batch_size), "--output_dir", out, "--disable_tqdm", "true"])
        train, _ = load_splits(script)
        trainer = VerlTrainer(model=load_policy_path(script.model_name_or_path), args=config, train_dataset=train)
        started = time.perf_counter()
        trainer.train()
        wall = (time.perf_counter() - started) / steps
    log = next(h for h in trainer.state.log_history if "time/rollout" in h)
    return {"batch": batch_size, "rollout": log["time/rollout"], "reward": log["time/reward"],
            "advantage": log["time/advantage"], "update": log["time/update"], "step_wall": wall,
            "tokens_per_s": log["rollout/tokens_per_s"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[64, 128, 256])
    args = parser.parse_args()
    rows = [measure(b, args.steps) for b in args.batch_sizes]
    keys = list(rows[0])
    print(" | ".join(f"{k:>12}" for k in keys))
    for row in rows:
        print(" | ".join(f"{row[k]:>12.4f}" if isinstance(row[k], float) else f"{row[k]:>12}" for k in keys))


if __name__ == "__main__":
    main()
