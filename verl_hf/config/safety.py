"""Safety (Safe-RLHF, PPO-Lagrangian): on when cost_funcs or cost_model_path is set."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from ..algorithms import advantage_spec
from .applies import COST_MODEL, SAFE_RL, _help, raise_first_failed


@dataclass
class SafetyFields:
    cost_funcs: list[str] | None = field(
        default=None,
        metadata=_help("Cost functions, in the same forms as reward_funcs; their sum is a response's cost, and "
                       "cost > 0 marks it unsafe. Training keeps the mean cost under cost_limit."),
    )
    cost_model_path: str | None = field(
        default=None,
        metadata=_help("A sequence-classification cost model (id or path) scored like a reward model; added to "
                       "cost_funcs as 'cost_model'."),
    )
    cost_model_label_index: Annotated[int | None, COST_MODEL] = field(
        default=None, metadata=_help("Which logit of a cost model with num_labels > 1 is the cost.")
    )
    cost_limit: Annotated[float, SAFE_RL] = field(default=0.0, metadata=_help("d: the bound on the mean episode cost, E[cost] <= d."))
    lambda_init: Annotated[float, SAFE_RL] = field(default=1.0, metadata=_help("Initial Lagrange multiplier lambda (> 0)."))
    lambda_lr: Annotated[float, SAFE_RL] = field(
        default=0.1, metadata=_help("Step size of the multiplier: log(lambda) += lambda_lr * (mean cost - d) * lambda.")
    )
    lambda_max: Annotated[float | None, SAFE_RL] = field(default=None, metadata=_help("Upper bound on lambda; None: unbounded."))
    lambda_update_delay_steps: Annotated[int, SAFE_RL] = field(
        default=0, metadata=_help("Optimizer steps before lambda starts to move (it stays at lambda_init).")
    )
    episode_cost_window_size: Annotated[int, SAFE_RL] = field(
        default=128, metadata=_help("The mean episode cost that drives lambda is over this many latest responses "
                                    "(all processes together).")
    )
    safety_filter_threshold: Annotated[float | None, SAFE_RL] = field(
        default=None,
        metadata=_help("Drop responses whose cost exceeds this from the update (masked; safety/filtered_frac logs "
                       "the rate). None: keep all."),
    )

    @property
    def safe_rl(self) -> bool:
        """Safe-RLHF is on: there are costs to constrain."""
        return bool(self.cost_funcs or self.cost_model_path)


def resolve_safety(cfg) -> None:
    if isinstance(cfg.cost_funcs, str):  # one name, not its characters
        cfg.cost_funcs = [cfg.cost_funcs]


def check_safety(cfg) -> None:
    if not cfg.safe_rl:
        return
    spec = advantage_spec(cfg.adv_estimator)
    if cfg.use_kl_in_reward and not spec.needs_values:
        raise ValueError(f"Safe-RLHF with adv_estimator={cfg.adv_estimator!r} normalises costs per group, so KL "
                         f"cannot ride in the reward (it would become cost noise); set use_kl_in_reward=False (KL as "
                         f"a loss term) or use adv_estimator='gae'.")
    if spec.needs_greedy_baseline:
        raise ValueError(f"Safe-RLHF needs an advantage for costs too, but {spec.display_name}'s baseline is the greedy "
                         f"response's reward; use adv_estimator='gae' (PPO-Lagrangian), 'grpo' or 'rloo' with costs.")
    if spec.needs_turn_rewards:
        raise ValueError(f"Safe-RLHF with adv_estimator={cfg.adv_estimator!r}: its turn-level credit reads the "
                         f"environment's per-turn rewards, and costs have no such turns; use adv_estimator='grpo' or "
                         f"'rloo' with costs.")
    raise_first_failed(cfg, [
        ("lambda_init", cfg.lambda_init > 0, "must be > 0 (it is kept as log(lambda))"),
        ("lambda_lr", cfg.lambda_lr >= 0, "must be >= 0"),
        ("lambda_max", cfg.lambda_max is None or cfg.lambda_max >= cfg.lambda_init,
         f"must be >= lambda_init ({cfg.lambda_init})"),
        ("lambda_update_delay_steps", cfg.lambda_update_delay_steps >= 0, "must be >= 0"),
        ("episode_cost_window_size", cfg.episode_cost_window_size >= 1, "must be >= 1"),
    ])
