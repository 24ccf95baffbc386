"""Importance-sampling correction of the rollout/training mismatch.

The rollout engine (vLLM, or HF generate in another dtype) samples from pi_rollout, which differs slightly
from the training model's pi_old even at equal weights (kernels, precision). Weighting each token's policy
gradient by w = pi_old / pi_rollout makes it unbiased again. Large weights come from a few unlucky tokens, so
they are truncated (TIS, Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training") or the offending tokens/sequences are masked out (MIS, as verl's rollout_is "mask" mode).

Deviation, documented: the weight multiplies the advantages rather than the per-token loss. For every
registered policy loss the token loss is linear in its advantage (clip branches included, since w > 0), so
this is the same gradient, and it works with any loss without touching it.

See it work: tests/test_rollout_correction.py
"""

from __future__ import annotations

import torch

from .utils import masked_mean

IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")


def rollout_is_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, response_mask: torch.Tensor,
                       level: str = "token", mode: str = "truncate", threshold: float = 2.0,
                       threshold_low: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weights (B, T), detached, 0 outside the mask, and metrics.

    w = exp(old - rollout) per token ('token') or exp(sum_t (old - rollout)) per sequence ('sequence');
    'truncate': min(w, threshold); 'mask': w if threshold_low <= w <= threshold else 0 (threshold_low
    defaults to 1 / threshold).
    old_logprobs, rollout_logprobs, response_mask: (B, T).
    """
    if level not in IS_LEVELS or mode not in IS_MODES:
        raise ValueError(f"rollout IS: level must be one of {IS_LEVELS} and mode one of {IS_MODES}, got "
                         f"{level!r}, {mode!r}.")
    mask = response_mask.float()
    log_ratio = (old_logprobs.detach() - rollout_logprobs.detach()).float() * mask
    largest_gap = log_ratio.abs().max().item() if log_ratio.numel() else 0.0  # per token, before any summing
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    raw = torch.exp(log_ratio.clamp(max=20.0))  # exp(20) ~ 5e8 already saturates any threshold
    low = 1.0 / threshold if threshold_low is None else threshold_low
    if mode == "truncate":
        weights, rejected = raw.clamp(max=threshold), raw > threshold
    else:
        rejected = (raw > threshold) | (raw < low)
        weights = raw * ~rejected
    metrics = {"rollout_is/mean": masked_mean(raw, mask).item(), "rollout_is/max": (raw * mask).max().item(),
               "rollout_is/rejected_frac": masked_mean(rejected.float(), mask).item(),
               "rollout_is/logprob_gap_max": largest_gap,
               "rollout_is/mismatch_k1": masked_mean(-log_ratio if level == "token" else
                                                     (rollout_logprobs - old_logprobs).float(), mask).item()}
    return weights * mask, metrics
