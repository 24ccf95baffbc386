"""Masked reductions and logit helpers shared by the RL losses.

Masks are 0/1 (bool, int or float) tensors broadcastable to the values.
Masked-out positions are selected away with ``torch.where`` instead of
multiplied by 0, so a NaN/inf sitting in padding can never leak into a result
(``inf * 0 = nan``).

See it work: tests/test_algorithms.py
"""

from typing import Optional

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Sum of x over positions where mask is set.  x, mask: (...) -> scalar or (...) without ``dim``.

    Formula: sum_i x_i * [mask_i != 0].
    """
    x = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Mean of x over masked positions; 0 where the mask is empty.  (...) -> scalar or reduced over ``dim``.

    Formula: sum_i x_i m_i / max(sum_i m_i, 1).
    """
    count = mask.bool().to(x.dtype if x.is_floating_point() else torch.float32)
    count = count.sum() if dim is None else count.sum(dim)
    # clamp(min=1): an empty mask gives 0/1 = 0 instead of 0/0 = nan.
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over all masked positions -> scalar; 0 if fewer than 2 (unbiased) / 1 valid values.

    Formula: sum_i m_i (x_i - mean)^2 / (n - 1)  (or / n when ``unbiased=False``).
    """
    mean = masked_mean(x, mask)
    n = mask.bool().sum().to(mean.dtype)
    sq = masked_sum((x - mean) ** 2, mask)
    denom = (n - 1) if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, epsilon: float = 1e-8
) -> torch.Tensor:
    """Normalise x to unit variance (and zero mean) over masked positions.  (...) -> (...), 0 outside the mask.

    Formula: (x - mean) / sqrt(var + epsilon), mean/var over the mask (PPO advantage whitening).
    """
    mean = masked_mean(x, mask)
    out = (x - mean) * torch.rsqrt(masked_var(x, mask) + epsilon)
    if not shift_mean:
        out = out + mean
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position.  (B, T, V) -> (B, T).

    Formula: H = logsumexp(z) - sum_v softmax(z)_v z_v (stable form used by verl / OpenRLHF).
    """
    # No exp overflow; the absolute error is ~ eps * max|z| (1e-4 for fp32 logits near 1000), which we
    # accept to keep to two (B, T, V) temporaries instead of a third for a max-shifted copy.
    probs = torch.softmax(logits, dim=-1)
    # -inf logits (vocab masking) would give 0 * -inf = nan; map them to the most negative finite
    # value, whose probability is exactly 0.  nan_to_num also zeros their gradient.
    finite = logits.nan_to_num(nan=0.0, neginf=torch.finfo(logits.dtype).min)
    return torch.logsumexp(logits, dim=-1) - (probs * finite).sum(-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label.  logits (B, T, V), labels (B, T) int -> (B, T).

    Formula: log p(y_t) = log_softmax(z_t)[y_t].  Labels must lie in [0, V).
    """
    # One (B, T, V) temporary (the log_softmax) and a (B, T, 1) gather; no one-hot, no probs.
    # dtype is kept: upcast the logits yourself if bf16 log-probs are too coarse for your ratio.
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)


def place_outcome_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each sequence's scalar reward on its last response token.  (B,), (B, T) -> (B, T).

    Formula: r_t = R * [t = last valid token]; rows with no valid token get no reward.
    """
    mask = response_mask.float()
    last = (mask.cumsum(dim=-1) == mask.sum(dim=-1, keepdim=True)) & (mask > 0)
    return last.float() * rewards.float().unsqueeze(-1)
