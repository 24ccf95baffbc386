"""Train the demo task with any algorithm by name: each is a YAML in examples/configs/.

    python examples/train_algorithm.py ppo                      # = verl-hf train examples/configs/ppo.yaml
    python examples/train_algorithm.py dapo --max_steps 100     # any VerlConfig field can be overridden

Algorithms: grpo, drgrpo, dapo, gspo, rloo, reinforce_pp, remax, ppo. Copy a YAML to start your own run
(set model_name_or_path and dataset_name); `base_config: demo` pulls in the demo's settings.
"""

import sys
from pathlib import Path

from verl_hf.cli import main

CONFIGS = Path(__file__).resolve().parent / "configs"

if __name__ == "__main__":
    if len(sys.argv) < 2 or not (CONFIGS / f"{sys.argv[1]}.yaml").exists():
        names = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
        sys.exit(f"usage: python examples/train_algorithm.py NAME [--field value ...]; NAME is one of {names}")
    sys.exit(main(["train", str(CONFIGS / f"{sys.argv[1]}.yaml"), *sys.argv[2:]]))
