"""The critic (PPO: adv_estimator="gae"): where it starts, its learning rate, value clipping, warm-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from .applies import CRITIC, _help, raise_first_failed


@dataclass
class CriticFields:
    critic_model_path: Annotated[str | None, CRITIC] = field(
        default=None,
        metadata=_help("Checkpoint the critic starts from: a causal LM (a fresh value head is added) or a one-output "
                       "sequence-classification model, e.g. the reward model, as Safe-RLHF starts its reward critic. "
                       "Default: the policy's checkpoint."),
    )
    critic_learning_rate: Annotated[float, CRITIC] = field(default=1e-5, metadata=_help("The critic's own AdamW learning rate."))
    cliprange_value: Annotated[float, CRITIC] = field(default=0.5, metadata=_help("Value clipping around the rollout-time values."))
    critic_warmup_steps: Annotated[int, CRITIC] = field(
        default=0, metadata=_help("Optimizer steps that train only the critic before the actor starts moving."))


def check_critic(cfg) -> None:
    raise_first_failed(cfg, [
        ("critic_learning_rate", cfg.critic_learning_rate > 0, "must be > 0"),
        ("critic_warmup_steps", cfg.critic_warmup_steps >= 0, "must be >= 0"),
    ])
