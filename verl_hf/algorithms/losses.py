"""Loss aggregation and policy-gradient losses (PPO clip with clip-higher and dual-clip, REINFORCE).

``agg_loss`` takes optional whole-step normalisers (``num_tokens``, ``num_seqs``)
so that the sum of micro-batch losses equals the full-batch loss: gradient
accumulation then gives exactly the full-batch gradient.

See it work: tests/test_algorithms.py
"""

from typing import Dict, Optional, Tuple

import torch

from .registry import register_policy_loss
from .utils import masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    num_tokens=None,
    num_seqs=None,
    norm_constant: Optional[float] = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.  loss_mat, loss_mask (B, T) -> ().

    token-mean: sum(l m)/N_tok; seq-mean-token-sum: sum_i sum_t l m / N_seq; seq-mean-token-mean:
    sum_i mean_t(l | m) / N_seq; seq-mean-token-sum-norm: sum(l m)/(N_seq L), L = norm_constant or T
    (Dr.GRPO, Liu et al. 2025).  N_tok/N_seq default to this batch; pass whole-step values for micro-batches.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")

    def _denom(n, default):
        n = default if n is None else n
        # clamp(min=1): an empty batch (all-zero mask) yields loss 0, never 0/0.
        return torch.as_tensor(n, dtype=loss_mat.dtype, device=loss_mat.device).clamp(min=1)

    n_seqs = _denom(num_seqs, loss_mat.shape[0])
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, loss_mask) / _denom(num_tokens, loss_mask.bool().sum())
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, loss_mask) / n_seqs
    if loss_agg_mode == "seq-mean-token-mean":
        # A sequence with no valid token contributes 0 (masked_mean of an empty row) but still
        # counts in N_seq, so micro-batch sums stay exact.
        return masked_mean(loss_mat, loss_mask, dim=-1).sum() / n_seqs
    # seq-mean-token-sum-norm.  Deviation from verl, which divides by L only: we also divide by N_seq,
    # i.e. Dr.GRPO's sum / (B * L), so the scale does not grow with the batch size.
    length = norm_constant if norm_constant is not None else loss_mat.shape[-1]
    return masked_sum(loss_mat, loss_mask) / (n_seqs * _denom(length, 1))


@register_policy_loss("vanilla")
def ppo_clip_loss(
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    num_tokens=None,
    num_seqs=None,
    norm_constant: Optional[float] = None,
    **unused,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """PPO clipped surrogate with clip-higher and dual-clip.  all inputs (B, T) -> (scalar loss, metrics).

    Formula: l = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), then l = min(l, -A c) where A < 0;
    r = exp(logp - old_logp).  Schulman et al. 2017 (PPO); Yu et al. 2025 (DAPO clip-higher);
    Ye et al. 2020 (dual-clip).
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual-clip lower bound), got {clip_ratio_c}")
    # Clamp the log-ratio: exp(+-100) overflows/underflows and would put inf/nan into loss and grads.
    # Tokens beyond +-20 are far outside the trust region anyway, so their clipped value is what matters.
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_max = torch.maximum(pg_unclipped, pg_clipped)
    # Dual-clip only for A < 0: there a huge ratio makes -A r unbounded above.
    pg_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    loss_mat = torch.where(negative, torch.minimum(pg_max, pg_dual), pg_max)
    loss = agg_loss(loss_mat, response_mask, loss_agg_mode,
                    num_tokens=num_tokens, num_seqs=num_seqs, norm_constant=norm_constant)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((pg_clipped > pg_unclipped).float(), response_mask).item(),
            "clip_frac_lower": masked_mean((negative & (pg_max > pg_dual)).float(), response_mask).item(),
            "ppo_kl": masked_mean(0.5 * log_ratio.square(), response_mask).item(),
            "ratio_mean": masked_mean(ratio, response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("reinforce")
def reinforce_loss(
    old_logprobs: Optional[torch.Tensor],
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    num_tokens=None,
    num_seqs=None,
    norm_constant: Optional[float] = None,
    **unused,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Plain on-policy policy gradient (Williams 1992, REINFORCE).  (B, T) inputs -> (scalar loss, {}).

    Formula: l_t = -A_t * logp_t, aggregated by ``agg_loss``; ``old_logprobs`` is ignored (may be None).
    """
    # torch.where, not a product with the mask: padding may hold -inf log-probs, and 0 * inf is NaN.
    loss_mat = torch.where(response_mask.bool(), -advantages * logprobs, torch.zeros_like(logprobs))
    loss = agg_loss(loss_mat, response_mask, loss_agg_mode,
                    num_tokens=num_tokens, num_seqs=num_seqs, norm_constant=norm_constant)
    return loss, {}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float = 0.2,
    loss_agg_mode: str = "token-mean",
    num_tokens=None,
    num_seqs=None,
    norm_constant: Optional[float] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Clipped value loss (PPO2 baselines; Ouyang et al. 2022).  (B, T) x4 -> (scalar loss, metrics).

    Formula: l_t = 0.5 max((V_t - R_t)^2, (clip(V_t, V_old - c, V_old + c) - R_t)^2).
    """
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss, clipped_loss = (values - returns).square(), (clipped - returns).square()
    loss_mat = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
    loss = agg_loss(loss_mat, response_mask, loss_agg_mode,
                    num_tokens=num_tokens, num_seqs=num_seqs, norm_constant=norm_constant)
    with torch.no_grad():
        metrics = {"vf_clip_frac": masked_mean((clipped_loss > unclipped_loss).float(), response_mask).item(),
                   "vpred_mean": masked_mean(values, response_mask).item()}
    return loss, metrics
