"""verl_hf: online RL post-training for LLMs as a drop-in `transformers.Trainer`.

    dataset row -> prompts -> rollout engine -> responses -> rewards -> advantages -> loss -> optimizer
    (datasets)    (chat      (HF generate)     (token ids)   (reward     (GRPO, RLOO,  (PPO clip (Trainer /
                  template,                                   functions)  Dr.GRPO, ...) + KL)     accelerate)
                  data_key_map)

`VerlTrainer.training_step` runs those stages as numbered steps on the roles (`verl_hf.roles`); the math
is in `verl_hf.algorithms`; `VerlConfig` holds every knob.

See it work: `make demo` (a tiny model learns arithmetic with GRPO on a CPU), examples/swap_trainer.py.
"""

__version__ = "0.1.0"

from .batch import GenerationOutput, RolloutBatch
from .config import VerlConfig
from .data import RLHFDataset
from .placement import ResourcePool
from .roles import Actor, Critic, ReferencePolicy, RewardModel, TeacherPolicy
from .trainer import VerlTrainer

__all__ = [
    "Actor", "Critic", "GenerationOutput", "RLHFDataset", "ReferencePolicy", "ResourcePool", "RewardModel",
    "RolloutBatch", "TeacherPolicy", "VerlConfig", "VerlTrainer", "__version__",
]
