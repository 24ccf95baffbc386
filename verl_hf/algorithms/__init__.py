"""Algorithm core of verl_hf: pure tensor-in/tensor-out RL math, no model or trainer code.

Advantage estimators (GRPO, Dr.GRPO, RLOO, GAE, ReMax, MT-GRPO's turn-level credit, ...) turn per-token rewards and prompt
group ids into per-token advantages (group statistics in ``groups``); policy losses (PPO clip with DAPO
clip-higher and dual-clip, REINFORCE, GSPO, SAPO, CISPO, GPG, Clip-Cov, KL-Cov, GMPO) turn log-probs and advantages into a
scalar loss plus float metrics, reduced by ``agg_loss`` with a ``LossNorm`` whose whole-step
normalisers make micro-batch gradient accumulation exact; ``kl_penalty``
gives per-token KL(pi || pi_ref) estimates (k1/k2/k3/abs and straight-through
'+' variants); ``utils`` holds NaN-safe masked reductions and memory-light
logit helpers; ``off_policy`` the per-token staleness and proximal log-probs of asynchronous training.  Estimators and losses live in name registries so a config
string selects them and users add their own with ``@register_advantage`` /
``@register_policy_loss``; ``advantage_spec`` / ``policy_loss_spec`` say what each needs
(values, groups, a greedy baseline; hyper-parameters and their defaults).

See it work: tests/test_algorithms.py
"""

from .registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageSpec,
    PolicyLossSpec,
    advantage_spec,
    get_advantage_estimator,
    get_policy_loss,
    policy_loss_spec,
    register_advantage,
    register_policy_loss,
)
from .groups import GroupStats, group_all_equal, group_stats
from .linear_logprobs import linear_logprobs
from .utils import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    place_outcome_rewards,
)
from .kl import KL_KINDS, kl_penalty
from .losses import LOSS_AGG_MODES, LossNorm, agg_loss, sequence_count, value_loss
from .advantages import SINGLETON_ADVANTAGES, gae_advantages, grpo_advantages, remax_advantages, rloo_advantages
from .turn_credit import mt_grpo_advantages, turn_index, turn_rewards_differ  # registers mt_grpo
from .policy_losses import ClippedSurrogate, clipped_surrogate, ppo_clip_loss, reinforce_loss  # registers every loss
from .rollout_correction import IS_LEVELS, IS_MODES, rollout_is_weights
from .off_policy import loglinear_proximal_logprobs, partial_fraction, staleness_metrics, token_staleness
from .lagrangian import lagrange_multiplier_step, lagrangian_advantages, unsafe_rate
from .kl_control import KL_CONTROLLERS, AdaptiveKLController, FixedKLController, PIDKLController, make_kl_controller

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "register_advantage",
    "register_policy_loss",
    "get_advantage_estimator",
    "get_policy_loss",
    "AdvantageSpec",
    "PolicyLossSpec",
    "advantage_spec",
    "policy_loss_spec",
    "GroupStats",
    "group_stats",
    "linear_logprobs",
    "group_all_equal",
    "LossNorm",
    "sequence_count",
    "ClippedSurrogate",
    "clipped_surrogate",
    "SINGLETON_ADVANTAGES",
    "kl_penalty",
    "KL_KINDS",
    "agg_loss",
    "LOSS_AGG_MODES",
    "ppo_clip_loss",
    "reinforce_loss",
    "grpo_advantages",
    "mt_grpo_advantages",
    "turn_index",
    "turn_rewards_differ",
    "gae_advantages",
    "remax_advantages",
    "value_loss",
    "KL_CONTROLLERS",
    "AdaptiveKLController",
    "FixedKLController",
    "PIDKLController",
    "make_kl_controller",
    "rloo_advantages",
    "entropy_from_logits",
    "logprobs_from_logits",
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "place_outcome_rewards",
    "IS_LEVELS",
    "IS_MODES",
    "rollout_is_weights",
    "loglinear_proximal_logprobs",
    "partial_fraction",
    "staleness_metrics",
    "token_staleness",
    "lagrange_multiplier_step",
    "lagrangian_advantages",
    "unsafe_rate",
]
