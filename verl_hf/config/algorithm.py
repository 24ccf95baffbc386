"""The algorithm: advantage estimator, policy loss and its clipping, loss aggregation, the update's sizes,
rollout importance sampling, discounting, and what a non-finite step does."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Annotated

from ..algorithms import ADVANTAGE_ESTIMATORS, IS_LEVELS, IS_MODES, LOSS_AGG_MODES, POLICY_LOSSES
from ..algorithms import SINGLETON_ADVANTAGES, advantage_spec, policy_loss_spec
from ..algorithms.registry import CLIP_FIELDS
from ..nonfinite import ON_NONFINITE
from .applies import ROLLOUT_IS, ROLLOUT_IS_MASK, UNSHARDED, USES_LAM, _help, one_of, parse_json_dict
from .applies import raise_first_failed
from .machine import wants_deepspeed

logger = logging.getLogger("verl_hf.config")

PIECES_UNCOUNTED = ("it runs several backward passes per micro-step, which the gradient accumulation of DeepSpeed "
                    "and FSDP does not count yet; size per_device_train_batch_size instead")


@dataclass
class AlgorithmFields:
    adv_estimator: str = field(default="grpo", metadata=_help("Advantage estimator, by registered name."))
    norm_adv_by_std_in_grpo: bool = field(
        default=True, metadata=_help("GRPO divides by the group's reward std; False gives Dr.GRPO.")
    )
    singleton_group_advantage: str = field(
        default="score",
        metadata=_help(f"Advantage of a prompt group with one sample (group estimators such as grpo, rloo, opo, "
                       f"gpg, reinforce_plus_plus_baseline; grpo_passk always gives 0), {SINGLETON_ADVANTAGES}: "
                       f"'score' = baseline 0 and std 1, so the advantage is the score (verl 0.9.1); 'zero' = no "
                       f"baseline, no learning signal. Singletons arise e.g. when a group's other rows are unscored."),
    )
    policy_loss: str = field(default="vanilla", metadata=_help("Policy loss, by registered name."))
    clip_ratio_low: float | None = field(
        default=None, metadata=_help("Lower clip: ratio >= 1 - clip_ratio_low. Default: the loss's own (0.2 for "
                                     "vanilla, 3e-4 for gspo, 0.4 in log space for geo_mean)."))
    clip_ratio_high: float | None = field(
        default=None, metadata=_help("Upper clip: ratio <= 1 + clip_ratio_high (DAPO 'clip-higher' uses 0.28). "
                                     "Default: the loss's own (0.2 vanilla, 4e-4 gspo, 0.4 geo_mean)."))
    clip_ratio_c: float = field(default=3.0, metadata=_help("Dual-clip bound for negative advantages (> 1)."))
    loss_agg_mode: str = field(default="token-mean", metadata=_help(f"How token losses are averaged: {LOSS_AGG_MODES}."))
    seq_mean_count_empty_rows: bool = field(
        default=False,
        metadata=_help("seq-mean-* modes: False = the step's sequence count leaves out responses with no token "
                       "left in the loss (e.g. unscored rows), as verl 0.9.1; True = count every row."),
    )
    ppo_epochs: int = field(default=1, metadata=_help("Passes of policy updates over one rollout round."))
    logits_chunk_size: int | None = field(
        default=None,
        metadata=_help("Tokens per chunk through the LM head for log-probs and entropy (actor, reference and "
                       "behaviour log-probs): the (batch, length, vocab) logits are never held whole. None: "
                       "about 64 MiB of fp32 logits per chunk; 0: the full-logits path."),
    )
    max_tokens_per_micro_batch: Annotated[int | None, UNSHARDED.because(PIECES_UNCOUNTED)] = field(
        default=None,
        metadata=_help("Token budget of one forward/backward of the update (verl's dynamic batch size): each "
                       "micro-batch of per_device_train_batch_size rows, ordered by length, is cut into pieces of "
                       "at most this many tokens, each padded only to its own longest row. Same gradient; memory "
                       "bounded by the budget. None: one piece per micro-batch. At least max_prompt_length + "
                       "max_response_length. Single process and DDP (not yet under DeepSpeed)."),
    )
    entropy_coef: float = field(default=0.0, metadata=_help("Entropy bonus coefficient in the loss."))
    policy_loss_kwargs: dict | str | None = field(
        default=None,
        metadata=_help("Extra scalars for the chosen policy loss, e.g. {\"tau_pos\": 1.0} for sapo (JSON on the "
                       "command line); see each loss's docstring in verl_hf.algorithms."),
    )
    rollout_is: str | None = field(
        default=None,
        metadata=_help("Importance-sampling correction of the rollout/training mismatch: 'token' or 'sequence' "
                       "weights pi_old / pi_rollout on the advantages (any policy loss); None: off."),
    )
    rollout_is_mode: Annotated[str, ROLLOUT_IS] = field(
        default="truncate", metadata=_help("'truncate' caps weights at rollout_is_threshold (TIS); 'mask' drops "
                                           "tokens/sequences outside [rollout_is_threshold_low, rollout_is_threshold].")
    )
    rollout_is_threshold: Annotated[float, ROLLOUT_IS] = field(default=2.0, metadata=_help("Upper bound of the IS weight (> 1)."))
    rollout_is_threshold_low: Annotated[float | None, ROLLOUT_IS_MASK] = field(
        default=None, metadata=_help("Lower bound of the IS weight in 'mask' mode; default 1 / rollout_is_threshold.")
    )
    gamma: float = field(default=1.0, metadata=_help("Discount for GAE and REINFORCE++ returns."))
    lam: Annotated[float, USES_LAM] = field(default=0.95, metadata=_help("GAE lambda (PPO)."))
    on_nonfinite: str = field(
        default="raise",
        metadata=_help("A step whose gradient norm is NaN/inf: 'raise' stops before the optimizer step (the weights "
                       "stay those of the last good step); 'skip' drops its gradients, counts it "
                       "(train/skipped_steps) and goes on (5 in a row stop the run). Not 'skip' under DeepSpeed, "
                       "whose engine steps inside the backward: there each loss is checked before it."),
    )


def resolve_algorithm(cfg) -> None:
    """JSON given on the command line becomes a dict; rollout_is 'none' becomes None."""
    if isinstance(cfg.policy_loss_kwargs, str):
        cfg.policy_loss_kwargs = parse_json_dict("policy_loss_kwargs", cfg.policy_loss_kwargs)
    cfg.policy_loss_kwargs = dict(cfg.policy_loss_kwargs or {})
    if cfg.rollout_is in ("none", "None", ""):
        cfg.rollout_is = None


def check_algorithm(cfg) -> None:
    one_of("adv_estimator", cfg.adv_estimator, ADVANTAGE_ESTIMATORS)
    one_of("policy_loss", cfg.policy_loss, POLICY_LOSSES)
    one_of("loss_agg_mode", cfg.loss_agg_mode, LOSS_AGG_MODES)
    one_of("singleton_group_advantage", cfg.singleton_group_advantage, SINGLETON_ADVANTAGES)
    if cfg.rollout_is is not None:
        one_of("rollout_is", cfg.rollout_is, IS_LEVELS)
    one_of("rollout_is_mode", cfg.rollout_is_mode, IS_MODES)
    one_of("on_nonfinite", cfg.on_nonfinite, ON_NONFINITE)
    if advantage_spec(cfg.adv_estimator).needs_groups and cfg.num_generations < 2:
        raise ValueError(
            f"adv_estimator={cfg.adv_estimator!r} compares the responses of one prompt, so it needs "
            f"num_generations >= 2 (got {cfg.num_generations}); set num_generations to 2 or more (8 is common)."
        )
    _check_policy_loss_kwargs(cfg)
    whole_row = cfg.max_prompt_length + cfg.max_response_length
    raise_first_failed(cfg, [
        ("ppo_epochs", cfg.ppo_epochs >= 1, "must be >= 1"),
        ("clip_ratio_low", cfg.clip_ratio_low is None or cfg.clip_ratio_low >= 0, "must be >= 0"),
        ("clip_ratio_high", cfg.clip_ratio_high is None or cfg.clip_ratio_high >= 0, "must be >= 0"),
        ("clip_ratio_c", cfg.clip_ratio_c > 1, "must be > 1 (dual-clip bound)"),
        ("entropy_coef", cfg.entropy_coef >= 0, "must be >= 0"),
        ("gamma", 0 <= cfg.gamma <= 1, "must be in [0, 1]"),
        ("lam", 0 <= cfg.lam <= 1, "must be in [0, 1]"),
        ("rollout_is_threshold", cfg.rollout_is_threshold > 1, "must be > 1 (weights above it are capped or masked)"),
        ("rollout_is_threshold_low", cfg.rollout_is_threshold_low is None
         or 0 <= cfg.rollout_is_threshold_low < 1, "must be in [0, 1)"),
        ("logits_chunk_size", cfg.logits_chunk_size is None or cfg.logits_chunk_size >= 0,
         "must be >= 0 (0: full logits) or None (automatic)"),
        ("max_tokens_per_micro_batch", cfg.max_tokens_per_micro_batch is None
         or cfg.max_tokens_per_micro_batch >= whole_row,
         f"must be >= max_prompt_length + max_response_length = {whole_row} (one whole row must fit), or None"),
    ])
    if cfg.max_tokens_per_micro_batch is not None and cfg.policy_loss in ("clip_cov", "kl_cov"):
        raise ValueError(f"max_tokens_per_micro_batch with policy_loss={cfg.policy_loss!r}: that loss picks its "
                         f"tokens by covariance within each forward, so pieces would change which it picks; leave "
                         f"max_tokens_per_micro_batch None for it.")
    if cfg.on_nonfinite == "skip" and wants_deepspeed(cfg):
        raise ValueError("on_nonfinite='skip' cannot take effect under DeepSpeed: its engine takes the optimizer step "
                         "inside the backward, before a gradient norm can be checked; use on_nonfinite='raise' (each "
                         "micro-batch's loss is then checked before its backward).")


def _check_policy_loss_kwargs(cfg) -> None:
    """Every key of policy_loss_kwargs must be a hyper-parameter the chosen loss declares (a typo would be ignored)."""
    spec = policy_loss_spec(cfg.policy_loss)
    unknown = sorted(set(cfg.policy_loss_kwargs) - set(spec.hyperparameters))
    if unknown:
        raise ValueError(f"policy_loss_kwargs {unknown} are not keywords of policy_loss={cfg.policy_loss!r}; "
                         f"it takes {sorted(spec.hyperparameters)}.")
    clash = sorted(k for k in CLIP_FIELDS if k in cfg.policy_loss_kwargs)
    if clash:
        raise ValueError(f"set {clash} as VerlConfig fields, not in policy_loss_kwargs.")
    if cfg.ppo_epochs > 1 and not spec.uses_old_logprobs:
        logger.warning(f"policy_loss={cfg.policy_loss!r} ignores old log-probs: ppo_epochs={cfg.ppo_epochs} makes "
                       f"later epochs off-policy without correction.")
