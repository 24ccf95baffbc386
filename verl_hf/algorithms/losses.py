"""Loss aggregation and the critic's value loss (the policy losses are in policy_losses.py).

``LossNorm`` is the loss normaliser of one optimizer step: the aggregation mode and the step's token count,
sequence count and constant.  ``agg_loss`` reduces a per-token loss with it, so that the sum of micro-batch
losses equals the full-batch loss: gradient accumulation then gives exactly the full-batch gradient.

See it work: tests/test_algorithms.py
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import torch

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


_DEFAULT_NORM = LossNorm()


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
