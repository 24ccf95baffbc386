"""Safe-RLHF (Dai et al., ICLR 2024) inside VerlTrainer: costs per response, the Lagrange multiplier, and
under PPO a cost critic.

Costs come from cost functions (the reward-function signature; cost > 0 marks a response unsafe) and/or a cost
model (a score model loaded like a reward model). Every process keeps the same window of the latest episode
costs (all processes' costs are gathered into it), so lambda stays identical across ranks without being sent.
The math is in verl_hf.algorithms.lagrangian.

See it work: tests/test_safety.py, examples/safe_rlhf/.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from .algorithms import lagrange_multiplier_step, unsafe_rate
from .rewards import score_completions


class SafetyConstraint:
    def __init__(self, cost_funcs: list, args, cost_critic=None):
        self.cost_funcs, self.args, self.cost_critic = cost_funcs, args, cost_critic
        self.log_lambda = math.log(args.lambda_init)
        self.window: deque[float] = deque(maxlen=args.episode_cost_window_size)

    @property
    def lagrange_lambda(self) -> float:
        return math.exp(self.log_lambda)

    def costs(self, prompts, completions, completion_ids, columns) -> tuple[torch.Tensor, dict[str, float]]:
        """(costs (B,): the sum of the cost functions, 0 where none judged a response; metrics). A cost function
        that raises always stops training (reward_on_error does not apply): a failed check must not read as safe."""
        result = score_completions(self.cost_funcs, None, prompts=prompts, completions=completions,
                                   completion_ids=completion_ids, columns=columns, on_error="raise",
                                   require_scored=False)
        costs = torch.nan_to_num(result.rewards, nan=0.0)
        metrics = {"cost/mean": costs.mean().item(), "cost/unsafe_rate": unsafe_rate(costs)}
        metrics.update({k.replace("reward/", "cost/", 1): v for k, v in result.metrics().items()
                        if k.count("/") == 2})  # per-function means and error counts
        return costs, metrics

    def observe(self, episode_costs: list[float]) -> None:
        """Costs of this round from every process, in rank order."""
        self.window.extend(episode_costs)

    def update_lambda(self, step: int) -> dict[str, float]:
        """One multiplier step on the windowed mean episode cost (after `lambda_update_delay_steps`)."""
        episode_cost = sum(self.window) / max(len(self.window), 1)
        if step >= self.args.lambda_update_delay_steps and self.window:
            self.log_lambda = lagrange_multiplier_step(self.log_lambda, episode_cost, self.args.cost_limit,
                                                       self.args.lambda_lr, self.args.lambda_max)
        return {"safety/lambda": self.lagrange_lambda, "safety/episode_cost": episode_cost}

    def state_dict(self) -> dict:
        return {"log_lambda": self.log_lambda, "window": list(self.window)}

    def load_state_dict(self, state: dict) -> None:
        self.log_lambda = state["log_lambda"]
        self.window = deque(state["window"], maxlen=self.args.episode_cost_window_size)
