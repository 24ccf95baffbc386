"""Outcome-reward advantage estimators with group baselines (GRPO, Dr.GRPO, RLOO).

Each estimator maps ``token_level_rewards (B, T)``, ``response_mask (B, T)`` and
``group_ids (B,)`` (samples sharing an id answer the same prompt; any integers,
in any order) to ``(advantages (B, T), returns (B, T))``.  Group statistics are
vectorised with ``torch.unique(return_inverse=True)`` + ``index_add_``; there is
no Python loop over samples.

See it work: tests/test_algorithms.py
"""

from typing import Tuple

import torch

from .registry import register_advantage


def _group_index(group_ids: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """Dense group index per sample.  group_ids (B,) any ints -> (inverse (B,) in [0, G), G)."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, uniq.numel()


def _group_sum(values: torch.Tensor, inverse: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Sum of values over each sample's group, gathered back per sample.  (B,) -> (B,)."""
    return values.new_zeros(num_groups).index_add(0, inverse, values)[inverse]


def _group_all_equal(scores: torch.Tensor, inverse: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Whether every score in the sample's group is identical.  (B,) -> (B,) bool."""
    # Tested as max == min rather than (score - mean) == 0: the mean of equal floats is not always
    # bit-exact (0.1 + 0.1 + 0.1) / 3 != 0.1, which would leak tiny nonzero advantages.
    zeros = scores.new_zeros(num_groups)
    gmax = zeros.scatter_reduce(0, inverse, scores, "amax", include_self=False)
    gmin = zeros.scatter_reduce(0, inverse, scores, "amin", include_self=False)
    return (gmax == gmin)[inverse]


def _scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """Sequence score s_i = sum_t r_it.  (B, T) -> (B,) in at least fp32."""
    # Not masked: like verl, the reward of an empty response may sit on a padded position and must
    # still count towards its group's baseline.  Computed in fp32 at least, for stable statistics.
    return token_level_rewards.sum(-1).to(torch.promote_types(token_level_rewards.dtype, torch.float32))


def _broadcast(adv: torch.Tensor, token_level_rewards: torch.Tensor, response_mask: torch.Tensor):
    """Spread per-sequence advantages over valid tokens.  (B,) -> (advantages (B, T), returns (B, T))."""
    out_dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    advantages = torch.where(response_mask.bool(), adv.unsqueeze(-1), 0.0).to(out_dtype)
    return advantages, advantages.clone()


@register_advantage("grpo")
def grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GRPO group-normalised outcome advantage.  (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).

    Formula: A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon), s_i = sum_t r_it, std unbiased (Shao et al. 2024,
    DeepSeekMath); norm_by_std=False: A_i = s_i - mean_g(s) (Dr.GRPO, Liu et al. 2025).
    """
    scores = _scores(token_level_rewards)
    inverse, num_groups = _group_index(group_ids)
    count = _group_sum(torch.ones_like(scores), inverse, num_groups)
    dev = scores - _group_sum(scores, inverse, num_groups) / count
    if norm_by_std:
        # Unbiased (n - 1) std, as torch.std in verl / TRL; clamp keeps singletons finite (masked below).
        std = (_group_sum(dev.square(), inverse, num_groups) / (count - 1).clamp(min=1)).sqrt()
        dev = dev / (std + epsilon)
    # Deviation from verl: a singleton group has no baseline; verl uses mean 0 / std 1 and so feeds the
    # raw score as advantage.  We give it 0 (no learning signal) -- use group size > 1 to learn.
    no_signal = (count < 2) | _group_all_equal(scores, inverse, num_groups)
    adv = torch.where(no_signal, torch.zeros_like(dev), dev)
    return _broadcast(adv, token_level_rewards, response_mask)


@register_advantage("rloo")
def rloo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RLOO leave-one-out baseline.  (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).

    Formula: A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1), s_i = sum_t r_it (Ahmadian et al. 2024).
    """
    scores = _scores(token_level_rewards)
    inverse, num_groups = _group_index(group_ids)
    count = _group_sum(torch.ones_like(scores), inverse, num_groups)
    total = _group_sum(scores, inverse, num_groups)
    adv = scores - (total - scores) / (count - 1).clamp(min=1)
    # A singleton group has no other sample to form a baseline: advantage 0.
    no_signal = (count < 2) | _group_all_equal(scores, inverse, num_groups)
    adv = torch.where(no_signal, torch.zeros_like(adv), adv)
    return _broadcast(adv, token_level_rewards, response_mask)


def _reverse_cumsum(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Return-to-go G_t = sum_{t' >= t} r_t' m_t' (gamma = 1).  (B, T) -> (B, T)."""
    masked = token_level_rewards * response_mask
    return masked.flip(-1).cumsum(-1).flip(-1)


@register_advantage("gae")
def gae_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016).  (B, T) x3 -> (advantages (B, T), returns (B, T)).

    Formula: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, returns R_t = A_t + V_t;
    the value after the last response token is 0. Advantages are whitened over the batch's valid tokens
    (as in PPO implementations: Ouyang et al. 2022, verl); returns are not.
    """
    from .utils import masked_whiten

    mask = response_mask.to(values.dtype)
    rewards = token_level_rewards.to(values.dtype)
    next_value = values.new_zeros(values.shape[0])
    next_advantage = values.new_zeros(values.shape[0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        # Padding keeps carrying "after the end" (value 0, advantage 0) back to the last valid token.
        next_value = torch.where(mask[:, t] > 0, values[:, t], next_value)
        next_advantage = torch.where(mask[:, t] > 0, advantage, next_advantage)
        advantages[:, t] = advantage * mask[:, t]
    returns = (advantages + values) * mask
    if whiten:
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


@register_advantage("remax")
def remax_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """ReMax: REINFORCE with the greedy response's reward as baseline (Li et al. 2024).

    Shapes: (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).
    Formula: A_t = G_t - b, G_t = sum_{t' >= t} r_t' (return-to-go), b = reward of the greedy response.
    """
    returns = _reverse_cumsum(token_level_rewards, response_mask)
    advantages = (returns - reward_baselines.to(returns.dtype).unsqueeze(-1)) * response_mask
    return advantages, returns
