"""Safe-RLHF's PPO-Lagrangian (Dai et al., ICLR 2024): maximise reward subject to E[cost] <= d.

The constrained problem  max_theta J_R  s.t.  J_C <= d  becomes  min_theta max_{lambda >= 0} -J_R + lambda (J_C - d).
lambda is kept as log(lambda) (so it stays positive) and moved by one SGD step per round on
-(J_C - d) * lambda, as in the paper's released implementation; the policy follows the combined advantage.

See it work: tests/test_lagrangian.py.
"""

from __future__ import annotations

import math

import torch

LAMBDA_CEILING = 1e6


def lagrange_multiplier_step(log_lambda: float, episode_cost: float, cost_limit: float, lambda_lr: float,
                             lambda_max: float | None = None) -> float:
    """One SGD step on log(lambda) for the loss -(J_C - d) * lambda; scalars in, the new log(lambda) out.

    Formula: log_lambda' = min(log_lambda + lr * (J_C - d) * exp(log_lambda), log(lambda_max)).
    lambda grows while the mean episode cost J_C exceeds the limit d and shrinks once it is under it. Without
    lambda_max, lambda is capped at LAMBDA_CEILING: a limit that is never met would otherwise grow it past
    float range (the step is proportional to lambda).
    """
    updated = log_lambda + lambda_lr * (episode_cost - cost_limit) * math.exp(log_lambda)
    return min(updated, math.log(lambda_max if lambda_max is not None else LAMBDA_CEILING))


def lagrangian_advantages(reward_advantages: torch.Tensor, cost_advantages: torch.Tensor,
                          lagrange_lambda: float) -> torch.Tensor:
    """Combined advantage (B, Lr) from reward and cost advantages (B, Lr).

    Formula: A = (A_r - lambda * A_c) / (1 + lambda). Dividing by 1 + lambda keeps the step size of the
    policy update comparable while lambda moves (Safe-RLHF, section 3.3).
    """
    return (reward_advantages - lagrange_lambda * cost_advantages) / (1.0 + lagrange_lambda)


def unsafe_rate(costs: torch.Tensor) -> float:
    """Share of responses with cost > 0 (the paper's definition of a harmful response). costs (B,)."""
    return float((costs > 0).float().mean()) if costs.numel() else 0.0
