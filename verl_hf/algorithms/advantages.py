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


def _float_dtype(token_level_rewards: torch.Tensor) -> torch.dtype:
    """Compute dtype for token-level statistics: the rewards' float dtype, at least fp32."""
    return torch.promote_types(token_level_rewards.dtype, torch.float32)


def _out_dtype(token_level_rewards: torch.Tensor) -> torch.dtype:
    """Output dtype, as in _broadcast: the rewards' dtype if floating, else fp32."""
    return token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32


def _discounted_return(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return-to-go G_t = sum_{t' >= t} gamma^(t' - t) r_t' m_t'.  (B, T) -> (B, T), fp32 at least."""
    masked = token_level_rewards.to(_float_dtype(token_level_rewards)) * response_mask
    if gamma == 1.0:
        return masked.flip(-1).cumsum(-1).flip(-1)
    # A loop over T, not over samples: the closed form gamma^-t * cumsum(gamma^t' r_t') overflows for long T.
    returns = torch.zeros_like(masked)
    running = masked.new_zeros(masked.shape[0])
    for t in reversed(range(masked.shape[1])):
        running = masked[:, t] + gamma * running
        returns[:, t] = running
    return returns


@register_advantage("reinforce_plus_plus")
def reinforce_plus_plus_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262).  (B, T), (B, T) -> (advantages (B, T), returns (B, T)).

    Formula: A_t = whiten_batch(G_t), G_t = sum_{t' >= t} gamma^(t' - t) r_t', whitened over the batch's valid tokens.
    """
    from .utils import masked_whiten

    # The paper's per-token KL penalty is not added here: the trainer folds it into token_level_rewards
    # (use_kl_in_reward).  Rewards at masked positions are dropped.  Deviation from verl: verl zeroes the
    # running return at every masked position ("reset after EOS"), the same for right-padded rows but, for
    # a masked hole inside a response (tool output), it cuts earlier tokens off the final reward; we carry
    # the return through the hole (as _reverse_cumsum does), discounting by position distance t' - t.
    mask = response_mask.to(_float_dtype(token_level_rewards))
    returns = _discounted_return(token_level_rewards, mask, gamma) * mask
    # Global batch normalisation, no group baseline; masked_whiten gives 0 for an empty mask.
    advantages = masked_whiten(returns, mask) * mask
    out = _out_dtype(token_level_rewards)
    return advantages.to(out), returns.to(out)


@register_advantage("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with group baseline (Hu 2025, arXiv:2501.03262; verl ``reinforce_plus_plus_baseline``).

    Shapes: (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).
    Formula: A_it = whiten_batch(s_i - mean_g(s)) over all valid tokens of the batch, s_i = sum_t r_it.
    """
    from .utils import masked_whiten

    scores = _scores(token_level_rewards)
    inverse, num_groups = _group_index(group_ids)
    count = _group_sum(torch.ones_like(scores), inverse, num_groups)
    dev = scores - _group_sum(scores, inverse, num_groups) / count
    # Deviation from verl: a singleton group has no baseline; verl uses mean 0 (raw score).  We give it 0
    # before whitening, as grpo/rloo do.  All-equal groups are forced to exactly 0 (see _group_all_equal).
    no_signal = (count < 2) | _group_all_equal(scores, inverse, num_groups)
    dev = torch.where(no_signal, torch.zeros_like(dev), dev)
    mask = response_mask.to(scores.dtype)
    # As in verl, whitening shifts the token-weighted mean to 0, so a zero-signal row becomes -mean/std.
    advantages = masked_whiten(dev.unsqueeze(-1) * mask, mask) * mask
    advantages = advantages.to(_out_dtype(token_level_rewards))
    return advantages, advantages.clone()


@register_advantage("grpo_passk")
def grpo_passk_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (Chen et al. 2025, "Pass@k Training"; verl ``grpo_passk``, which cites arXiv:2503.19595).

    Shapes: (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).
    Formula: A_i = [i = first argmax_g(s)] (max_g(s) - second_max_g(s)) / (std_g(s) + epsilon), std unbiased; else 0.
    """
    scores = _scores(token_level_rewards)
    inverse, num_groups = _group_index(group_ids)
    count = _group_sum(torch.ones_like(scores), inverse, num_groups)
    zeros = scores.new_zeros(num_groups)
    best = zeros.scatter_reduce(0, inverse, scores, "amax", include_self=False)[inverse]
    # Ties for the best: only the lowest index is "the best"; the tied copy is then the second best, so A = 0.
    position = torch.arange(scores.numel(), device=scores.device)
    candidate = torch.where(scores == best, position, scores.numel())
    first = position.new_full((num_groups,), scores.numel()).scatter_reduce(0, inverse, candidate, "amin")
    is_best = position == first[inverse]
    others = torch.where(is_best, torch.full_like(scores, float("-inf")), scores)
    second = zeros.scatter_reduce(0, inverse, others, "amax", include_self=False)[inverse]
    # A singleton has no second best (-inf): use best, so the gap is 0 and no inf is ever formed.
    # Deviation from verl: verl raises on a singleton group; we give it 0 (no learning signal).
    second = torch.where(count < 2, best, second)
    adv = best - second
    if norm_by_std:
        mean = _group_sum(scores, inverse, num_groups) / count
        std = (_group_sum((scores - mean).square(), inverse, num_groups) / (count - 1).clamp(min=1)).sqrt()
        # A zero gap (singleton, tie, all-equal group) may have std 0: divide by 1 there, no 0/0 at epsilon=0.
        adv = adv / torch.where(adv > 0, std + epsilon, torch.ones_like(std))
    adv = torch.where(is_best, adv, torch.zeros_like(adv))
    return _broadcast(adv, token_level_rewards, response_mask)


@register_advantage("opo")
def opo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """OPO: on-policy RL with the optimal (length-weighted) reward baseline (Hao et al. 2025, arXiv:2505.23585).

    Shapes: (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).
    Formula: A_i = s_i - b_g, b_g = sum_{j in g} |o_j| s_j / sum_{j in g} |o_j|, |o_j| = sum_t m_jt, s_i = sum_t r_it.
    """
    scores = _scores(token_level_rewards)
    inverse, num_groups = _group_index(group_ids)
    count = _group_sum(torch.ones_like(scores), inverse, num_groups)
    length = response_mask.to(scores.dtype).sum(-1)
    # clamp: a group of only empty responses has weight 0 (its rows are masked out anyway); avoid 0/0.
    baseline = _group_sum(length * scores, inverse, num_groups) / _group_sum(length, inverse, num_groups).clamp(min=1)
    adv = scores - baseline
    # Deviation from verl: verl uses baseline 0 for a singleton (advantage = raw score); we give it 0, as grpo.
    # All-equal groups are forced to exactly 0: the weighted mean of equal floats is not always bit-exact.
    no_signal = (count < 2) | _group_all_equal(scores, inverse, num_groups)
    adv = torch.where(no_signal, torch.zeros_like(adv), adv)
    return _broadcast(adv, token_level_rewards, response_mask)


@register_advantage("gpg")
def gpg_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GPG: group policy gradient (Chu et al. 2025, "GPG: A Simple and Strong RL Baseline", arXiv:2504.02546).

    Shapes: (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).
    Formula: A_i = alpha (s_i - mean_g(s)), alpha = B / (B - M), M = #samples in groups whose scores are all equal.
    """
    scores = _scores(token_level_rewards)
    inverse, num_groups = _group_index(group_ids)
    count = _group_sum(torch.ones_like(scores), inverse, num_groups)
    dev = scores - _group_sum(scores, inverse, num_groups) / count
    # A singleton (no baseline; verl gives it the raw score) and an all-equal group carry no gradient: they are
    # the paper's "invalid" samples M, and alpha scales the rest up so the batch mean gradient is not diluted.
    valid = (count >= 2) & ~_group_all_equal(scores, inverse, num_groups)
    # Deviation from verl: verl's alpha = B / count_nonzero(scores) counts non-zero rewards, which equals the
    # paper's B / (B - M) only in special cases; we follow the paper.  Paper's F_norm is 1 here (verl default
    # f_norm=1): norm_by_std is ignored on purpose, so the trainer's GRPO flag does not turn GPG into GRPO.
    num_valid = valid.sum().to(scores.dtype)
    alpha = scores.numel() / num_valid.clamp(min=1)  # no valid sample: every advantage is 0 below anyway
    adv = torch.where(valid, alpha * dev, torch.zeros_like(dev))
    return _broadcast(adv, token_level_rewards, response_mask)
