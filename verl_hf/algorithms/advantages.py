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
