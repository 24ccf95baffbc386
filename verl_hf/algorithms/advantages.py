"""Outcome-reward advantage estimators with group baselines (GRPO, Dr.GRPO, RLOO, OPO, GPG, ...), GAE, ReMax.

Each estimator maps ``token_level_rewards (B, T)``, ``response_mask (B, T)`` and
``group_ids (B,)`` (samples sharing an id answer the same prompt; any integers,
in any order) to ``(advantages (B, T), returns (B, T))``.  Group statistics come from
``groups.py`` (vectorised, no Python loop over samples).  Each registration says what the
estimator needs (values, groups, a greedy baseline) and its display name.

A group of one sample (``singleton_advantage``): as verl 0.9.1, the default ``"score"`` gives it
baseline 0 (and std 1), so its advantage is its score; ``"zero"`` gives it 0 (no baseline, no
learning signal).

See it work: tests/test_algorithms.py, tests/test_advantages_more.py, tests/test_registry.py
"""

from typing import Tuple

import torch

from .groups import group_all_equal, group_index, group_stats, group_sum
from .registry import register_advantage

SINGLETON_ADVANTAGES = ("score", "zero")


def _singleton_rule(singleton_advantage: str) -> bool:
    """True when a one-sample group keeps its score as advantage ("score", verl), False for "zero"."""
    if singleton_advantage not in SINGLETON_ADVANTAGES:
        raise ValueError(f"singleton_advantage={singleton_advantage!r} is unknown; valid: "
                         f"{', '.join(SINGLETON_ADVANTAGES)}.")
    return singleton_advantage == "score"


def _no_signal(scores: torch.Tensor, group_ids: torch.Tensor, count: torch.Tensor, keep_singletons: bool):
    """Rows whose advantage is forced to exactly 0: all-equal groups, and singletons under "zero".  (B,) bool."""
    singleton = count < 2
    return torch.where(singleton, not keep_singletons, group_all_equal(scores, group_ids))


def _scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """Sequence score s_i = sum_t r_it.  (B, T) -> (B,) in fp64."""
    # Not masked: like verl, the reward of an empty response may sit on a padded position and must
    # still count towards its group's baseline.  In fp64 (verl: fp32), so that the group statistics of large
    # finite rewards do not overflow (the square of a 3e38 reward); the advantages are cast back at the end.
    return token_level_rewards.to(wide_float(token_level_rewards.device)).sum(-1)


def wide_float(device: torch.device) -> torch.dtype:
    """fp64 for group statistics, fp32 on MPS (which has no fp64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _broadcast(adv: torch.Tensor, token_level_rewards: torch.Tensor, response_mask: torch.Tensor):
    """Spread per-sequence advantages over valid tokens.  (B,) -> (advantages (B, T), returns (B, T))."""
    out_dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    advantages = torch.where(response_mask.bool(), adv.unsqueeze(-1), 0.0).to(out_dtype)
    return advantages, advantages.clone()


@register_advantage("grpo", display_name="GRPO", display_name_no_std="Dr.GRPO", needs_groups=True)
def grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    singleton_advantage: str = "score",
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GRPO group-normalised outcome advantage.  (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).

    Formula: A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon), s_i = sum_t r_it, std unbiased (Shao et al. 2024,
    DeepSeekMath); norm_by_std=False: A_i = s_i - mean_g(s) (Dr.GRPO, Liu et al. 2025).
    A singleton group uses mean 0 and std 1 (verl), so A_i = s_i / (1 + epsilon); ``singleton_advantage="zero"``: 0.
    """
    keep_singletons = _singleton_rule(singleton_advantage)
    scores = _scores(token_level_rewards)
    stats = group_stats(scores, group_ids)
    verl_singleton = (stats.count < 2) & keep_singletons
    dev = scores - torch.where(verl_singleton, 0.0, stats.mean)
    if norm_by_std:
        dev = dev / (torch.where(verl_singleton, 1.0, stats.std) + epsilon)
    adv = torch.where(_no_signal(scores, group_ids, stats.count, keep_singletons), torch.zeros_like(dev), dev)
    return _broadcast(adv, token_level_rewards, response_mask)


@register_advantage("rloo", display_name="RLOO", needs_groups=True)
def rloo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    singleton_advantage: str = "score",
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RLOO leave-one-out baseline.  (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).

    Formula: A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1), s_i = sum_t r_it (Ahmadian et al. 2024).
    A singleton has no other sample: A_i = s_i (verl's ``rloo``); ``singleton_advantage="zero"``: 0.
    """
    keep_singletons = _singleton_rule(singleton_advantage)
    scores = _scores(token_level_rewards)
    stats = group_stats(scores, group_ids)
    # For a singleton the leave-one-out sum is 0, so this is already s_i there.
    adv = scores - (stats.total - scores) / (stats.count - 1).clamp(min=1)
    adv = torch.where(_no_signal(scores, group_ids, stats.count, keep_singletons), torch.zeros_like(adv), adv)
    return _broadcast(adv, token_level_rewards, response_mask)


def _reverse_cumsum(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Return-to-go G_t = sum_{t' >= t} r_t' m_t' (gamma = 1).  (B, T) -> (B, T)."""
    masked = token_level_rewards * response_mask
    return masked.flip(-1).cumsum(-1).flip(-1)


@register_advantage("gae", display_name="PPO", needs_values=True)
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


@register_advantage("remax", display_name="ReMax", needs_greedy_baseline=True, one_sample_per_prompt=True)
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


@register_advantage("reinforce_plus_plus", display_name="REINFORCE++", one_sample_per_prompt=True)
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
    # (use_kl_in_reward).  Rewards at masked positions are dropped, and the return is carried through a
    # masked hole inside a response (tool output), as verl 0.9.1 does.  Deviation from verl: we discount by
    # position distance t' - t, verl by the number of valid tokens in between (it does not discount across
    # the hole); the same for gamma = 1 and for responses without holes.
    mask = response_mask.to(_float_dtype(token_level_rewards))
    returns = _discounted_return(token_level_rewards, mask, gamma) * mask
    # Global batch normalisation, no group baseline; masked_whiten gives 0 for an empty mask.
    advantages = masked_whiten(returns, mask) * mask
    out = _out_dtype(token_level_rewards)
    return advantages.to(out), returns.to(out)


@register_advantage("reinforce_plus_plus_baseline", display_name="REINFORCE++ (baseline)", needs_groups=True)
def reinforce_plus_plus_baseline_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    singleton_advantage: str = "score",
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with group baseline (Hu 2025, arXiv:2501.03262; verl ``reinforce_plus_plus_baseline``).

    Shapes: (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).
    Formula: A_it = whiten_batch(s_i - mean_g(s)) over all valid tokens of the batch, s_i = sum_t r_it.
    A singleton uses mean 0 (verl): s_i before whitening; ``singleton_advantage="zero"``: 0 before whitening.
    """
    from .utils import masked_whiten

    keep_singletons = _singleton_rule(singleton_advantage)
    scores = _scores(token_level_rewards)
    stats = group_stats(scores, group_ids)
    dev = scores - torch.where((stats.count < 2) & keep_singletons, 0.0, stats.mean)
    # All-equal groups are forced to exactly 0 before whitening (see group_all_equal).
    dev = torch.where(_no_signal(scores, group_ids, stats.count, keep_singletons), torch.zeros_like(dev), dev)
    mask = response_mask.to(scores.dtype)
    # As in verl, whitening shifts the token-weighted mean to 0, so a zero-signal row becomes -mean/std.
    advantages = masked_whiten(dev.unsqueeze(-1) * mask, mask) * mask
    advantages = advantages.to(_out_dtype(token_level_rewards))
    return advantages, advantages.clone()


@register_advantage("grpo_passk", display_name="GRPO (pass@k)", needs_groups=True)
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
    inverse, num_groups = group_index(group_ids)
    stats = group_stats(scores, group_ids)
    count = stats.count
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
    # Deviation from verl: verl raises on a singleton group; we give it 0 (no learning signal) whatever
    # singleton_advantage says -- pass@k has no "best of one" to reward.
    second = torch.where(count < 2, best, second)
    adv = best - second
    if norm_by_std:
        std = stats.std
        # A zero gap (singleton, tie, all-equal group) may have std 0: divide by 1 there, no 0/0 at epsilon=0.
        adv = adv / torch.where(adv > 0, std + epsilon, torch.ones_like(std))
    adv = torch.where(is_best, adv, torch.zeros_like(adv))
    return _broadcast(adv, token_level_rewards, response_mask)


@register_advantage("opo", display_name="OPO", needs_groups=True)
def opo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    singleton_advantage: str = "score",
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """OPO: on-policy RL with the optimal (length-weighted) reward baseline (Hao et al. 2025, arXiv:2505.23585).

    Shapes: (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).
    Formula: A_i = s_i - b_g, b_g = sum_{j in g} |o_j| s_j / sum_{j in g} |o_j|, |o_j| = sum_t m_jt, s_i = sum_t r_it.
    A singleton uses b = 0 (verl): A_i = s_i; ``singleton_advantage="zero"``: 0.
    """
    keep_singletons = _singleton_rule(singleton_advantage)
    scores = _scores(token_level_rewards)
    inverse, num_groups = group_index(group_ids)
    count = group_sum(torch.ones_like(scores), inverse, num_groups)
    length = response_mask.to(scores.dtype).sum(-1)
    # clamp: a group of only empty responses has weight 0 (its rows are masked out anyway); avoid 0/0.
    baseline = group_sum(length * scores, inverse, num_groups) / group_sum(length, inverse, num_groups).clamp(min=1)
    adv = scores - torch.where((count < 2) & keep_singletons, 0.0, baseline)
    # All-equal groups are forced to exactly 0: the weighted mean of equal floats is not always bit-exact.
    adv = torch.where(_no_signal(scores, group_ids, count, keep_singletons), torch.zeros_like(adv), adv)
    return _broadcast(adv, token_level_rewards, response_mask)


@register_advantage("gpg", display_name="GPG", needs_groups=True)
def gpg_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    singleton_advantage: str = "score",
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GPG: group policy gradient (Chu et al. 2025, "GPG: A Simple and Strong RL Baseline", arXiv:2504.02546).

    Shapes: (B, T), (B, T), (B,) -> (advantages (B, T), returns (B, T)).
    Formula: A_i = alpha (s_i - mean_g(s)), alpha = B / (B - M), M = #samples whose advantage carries no signal.
    A singleton uses mean 0 (verl): A_i = alpha s_i; ``singleton_advantage="zero"``: 0 (and it counts in M).
    """
    keep_singletons = _singleton_rule(singleton_advantage)
    scores = _scores(token_level_rewards)
    stats = group_stats(scores, group_ids)
    singleton = stats.count < 2
    dev = scores - torch.where(singleton & keep_singletons, 0.0, stats.mean)
    # All-equal groups carry no gradient: they are the paper's "invalid" samples M, and alpha scales the rest up
    # so the batch mean gradient is not diluted.  A singleton is valid under "score" when its score is nonzero
    # and it has a response token: a row the trainer masked out (unscored) must not change alpha.
    valid_singleton = keep_singletons & (scores != 0) & response_mask.bool().any(-1)
    valid = torch.where(singleton, valid_singleton, ~group_all_equal(scores, group_ids))
    # Deviation from verl: verl's alpha = B / count_nonzero(scores) counts non-zero rewards, which equals the
    # paper's B / (B - M) only in special cases; we follow the paper.  Paper's F_norm is 1 here (verl default
    # f_norm=1): norm_by_std is ignored on purpose, so the trainer's GRPO flag does not turn GPG into GRPO.
    num_valid = valid.sum().to(scores.dtype)
    alpha = scores.numel() / num_valid.clamp(min=1)  # no valid sample: every advantage is 0 below anyway
    adv = torch.where(valid, alpha * dev, torch.zeros_like(dev))
    return _broadcast(adv, token_level_rewards, response_mask)
