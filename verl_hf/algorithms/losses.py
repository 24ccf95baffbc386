"""Loss aggregation and policy-gradient losses (PPO clip with clip-higher and dual-clip, REINFORCE).

``LossNorm`` is the loss normaliser of one optimizer step: the aggregation mode and the step's token count,
sequence count and constant.  ``agg_loss`` reduces a per-token loss with it, so that the sum of micro-batch
losses equals the full-batch loss: gradient accumulation then gives exactly the full-batch gradient.
``clipped_surrogate`` is PPO's clipped objective shared by every loss that clips a ratio.

See it work: tests/test_algorithms.py, tests/test_registry.py
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple, Union

import torch

from .registry import register_policy_loss
from .utils import masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class LossNorm:
    """How a per-token loss becomes a scalar, with the whole optimizer step's normalisers.

    mode: one of LOSS_AGG_MODES; num_tokens / num_seqs: the step's valid-token / sequence counts (None: this
    batch's); constant: L of seq-mean-token-sum-norm (None: the batch's T); count_empty_rows: when num_seqs is
    None, also count rows without a valid token (verl 0.9.1 leaves them out, our default).
    """

    mode: str = "token-mean"
    num_tokens: Optional[float] = None
    num_seqs: Optional[float] = None
    constant: Optional[float] = None
    count_empty_rows: bool = False

    def __post_init__(self):
        if self.mode not in LOSS_AGG_MODES:
            raise ValueError(f"unknown loss_agg_mode {self.mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")

    @classmethod
    def of(cls, norm: Union["LossNorm", str, None]) -> "LossNorm":
        """A LossNorm as is, a mode string as LossNorm(mode), None as LossNorm()."""
        if norm is None:
            return cls()
        return norm if isinstance(norm, LossNorm) else cls(norm)


def _as_norm(norm, loss_agg_mode=None, num_tokens=None, num_seqs=None, norm_constant=None) -> LossNorm:
    """LossNorm from the new argument and the pre-LossNorm keywords (those given override its fields)."""
    norm = LossNorm.of(norm)
    legacy = {"mode": loss_agg_mode, "num_tokens": num_tokens, "num_seqs": num_seqs, "constant": norm_constant}
    legacy = {k: v for k, v in legacy.items() if v is not None}
    return dataclasses.replace(norm, **legacy) if legacy else norm


def sequence_count(loss_mask: torch.Tensor, count_empty_rows: bool = False) -> torch.Tensor:
    """Sequences a seq-mean divides by when no step count is given.  (B, T) -> () float.

    Formula: #rows with at least one valid token (verl 0.9.1); B with ``count_empty_rows``.
    """
    if count_empty_rows:
        return torch.tensor(float(loss_mask.shape[0]), device=loss_mask.device)
    return loss_mask.bool().any(-1).sum().float()


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    norm: Union[LossNorm, str] = "token-mean",
    *,
    loss_agg_mode: Optional[str] = None,
    num_tokens=None,
    num_seqs=None,
    norm_constant: Optional[float] = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.  loss_mat, loss_mask (B, T), norm: LossNorm or mode -> ().

    token-mean: sum(l m)/N_tok; seq-mean-token-sum: sum_i sum_t l m / N_seq; seq-mean-token-mean:
    sum_i mean_t(l | m) / N_seq; seq-mean-token-sum-norm: sum(l m)/(N_seq L), L = norm.constant or T
    (Dr.GRPO, Liu et al. 2025).  N_tok/N_seq default to this batch (N_seq: rows with a valid token, see
    ``sequence_count``); pass whole-step values in the LossNorm for micro-batches.  The keywords
    loss_agg_mode / num_tokens / num_seqs / norm_constant are the pre-LossNorm spelling, kept working.
    """
    norm = _as_norm(norm, loss_agg_mode, num_tokens, num_seqs, norm_constant)

    def _denom(n):
        # An empty batch (count 0) yields loss 0, never 0/0. A positive count is kept as is, also below 1: under
        # data parallelism a step's count is its total over processes divided by their number.
        n = torch.as_tensor(n, dtype=loss_mat.dtype, device=loss_mat.device)
        return torch.where(n > 0, n, torch.ones_like(n))

    if norm.mode == "token-mean":
        n_tok = loss_mask.bool().sum() if norm.num_tokens is None else norm.num_tokens
        return masked_sum(loss_mat, loss_mask) / _denom(n_tok)
    n_seqs = _denom(sequence_count(loss_mask, norm.count_empty_rows) if norm.num_seqs is None else norm.num_seqs)
    if norm.mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, loss_mask) / n_seqs
    if norm.mode == "seq-mean-token-mean":
        # A sequence with no valid token contributes 0 (masked_mean of an empty row).
        return masked_mean(loss_mat, loss_mask, dim=-1).sum() / n_seqs
    # seq-mean-token-sum-norm: Dr.GRPO's sum / (N_seq * L), as verl 0.9.1 (global batch size, then / L).
    length = norm.constant if norm.constant is not None else loss_mat.shape[-1]
    return masked_sum(loss_mat, loss_mask) / (n_seqs * _denom(length))


class ClippedSurrogate(NamedTuple):
    """PPO's clipped objective per token, all (B, T): the loss, where the ratio clip binds, where dual-clip binds."""

    loss: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor


def clipped_surrogate(advantages: torch.Tensor, ratio: torch.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                      clip_ratio_c: Optional[float] = None) -> ClippedSurrogate:
    """PPO clipped surrogate, optionally dual-clipped.  advantages, ratio (B, T) -> ClippedSurrogate of (B, T).

    Formula: l = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), then l = min(l, -A c) where A < 0 (with c).
    Schulman et al. 2017 (PPO); Yu et al. 2025 (DAPO clip-higher); Ye et al. 2020 (dual-clip).
    """
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_max = torch.maximum(pg_unclipped, pg_clipped)
    clipped = pg_clipped > pg_unclipped
    if clip_ratio_c is None:
        return ClippedSurrogate(pg_max, clipped, torch.zeros_like(clipped))
    # Dual-clip only for A < 0: there a huge ratio makes -A r unbounded above.
    pg_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(pg_max, pg_dual), pg_max)
    return ClippedSurrogate(loss, clipped, negative & (pg_max > pg_dual))


_DEFAULT_NORM = LossNorm()


@register_policy_loss("vanilla", hyperparameters={"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0})
def ppo_clip_loss(
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    norm: Union[LossNorm, str] = _DEFAULT_NORM,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
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
    pg = clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    loss = agg_loss(pg.loss, response_mask, norm)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean(pg.clipped.float(), response_mask).item(),
            "clip_frac_lower": masked_mean(pg.dual_clipped.float(), response_mask).item(),
            "ppo_kl": masked_mean(0.5 * log_ratio.square(), response_mask).item(),
            "ratio_mean": masked_mean(ratio, response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("reinforce", hyperparameters={}, uses_old_logprobs=False)
def reinforce_loss(
    old_logprobs: Optional[torch.Tensor],
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    norm: Union[LossNorm, str] = _DEFAULT_NORM,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Plain on-policy policy gradient (Williams 1992, REINFORCE).  (B, T) inputs -> (scalar loss, {}).

    Formula: l_t = -A_t * logp_t, aggregated by ``agg_loss``; ``old_logprobs`` is ignored (may be None).
    """
    # torch.where, not a product with the mask: padding may hold -inf log-probs, and 0 * inf is NaN.
    loss_mat = torch.where(response_mask.bool(), -advantages * logprobs, torch.zeros_like(logprobs))
    return agg_loss(loss_mat, response_mask, norm), {}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float = 0.2,
    norm: Union[LossNorm, str] = _DEFAULT_NORM,
    loss_agg_mode: Optional[str] = None,
    num_tokens=None,
    num_seqs=None,
    norm_constant: Optional[float] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Clipped value loss (PPO2 baselines; Ouyang et al. 2022).  (B, T) x4 -> (scalar loss, metrics).

    Formula: l_t = 0.5 max((V_t - R_t)^2, (clip(V_t, V_old - c, V_old + c) - R_t)^2), reduced by ``norm``
    (loss_agg_mode / num_tokens / num_seqs / norm_constant: the pre-LossNorm keywords, kept working).
    """
    norm = _as_norm(norm, loss_agg_mode, num_tokens, num_seqs, norm_constant)
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss, clipped_loss = (values - returns).square(), (clipped - returns).square()
    loss_mat = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
    loss = agg_loss(loss_mat, response_mask, norm)
    with torch.no_grad():
        metrics = {"vf_clip_frac": masked_mean((clipped_loss > unclipped_loss).float(), response_mask).item(),
                   "vpred_mean": masked_mean(values, response_mask).item()}
    return loss, metrics
