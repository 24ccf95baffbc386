"""The policy losses: PPO clip (``vanilla``), REINFORCE, GSPO, SAPO, CISPO, GPG, Clip-Cov, KL-Cov, GMPO (``geo_mean``).

Importing this module registers each loss under its name in ``POLICY_LOSSES``, with its hyper-parameters
and their defaults.  All share one signature: (old_logprobs, logprobs, advantages, response_mask,
norm: LossNorm, *, <own hyper-parameters>) -> (loss, metrics), inputs (B, T), loss a scalar, metrics
python floats.  ``clipped_surrogate`` is PPO's clipped objective, shared by every loss that clips a ratio.  Token losses go through ``agg_loss`` with the whole-step ``LossNorm`` so gradient
accumulation stays exact.  Definitions follow the papers and verl 0.9.1's ``verl/trainer/ppo/core_algos.py``;
deviations are marked in the code.

See it work: tests/test_policy_losses.py
"""

from __future__ import annotations

import dataclasses
from typing import Dict, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from .losses import _DEFAULT_NORM, LossNorm, agg_loss
from .registry import register_policy_loss
from .utils import masked_mean

Norm = Union[LossNorm, str]
LossAndMetrics = Tuple[Tensor, Dict[str, float]]

# exp(+-20) is ~4.9e8 / 2.1e-9: finite in fp32 and bf16, and far outside any trust region.
_MAX_LOG_RATIO = 20.0


def _where_valid(x: Tensor, mask: Tensor) -> Tensor:
    """x where mask is set, else 0.  (B, T) -> (B, T).

    torch.where (not x * mask) so a nan/inf in padding reaches neither the value nor the gradient.
    """
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Clamped per-token log importance ratio, 0 on padding.  (B, T) -> (B, T)."""
    return _where_valid(logprobs - old_logprobs, mask).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _ppo_kl(log_ratio: Tensor, mask: Tensor) -> float:
    """Masked mean of the k2 estimate 0.5 (logp - old)^2, the ``ppo_kl`` metric of ``ppo_clip_loss``."""
    return masked_mean(0.5 * log_ratio.detach().square(), mask).item()


def _frac(flags: Tensor, mask: Tensor) -> float:
    """Fraction of valid tokens where ``flags`` holds (0 for an empty mask)."""
    return masked_mean(flags.float(), mask).item()


def _clip_sides(clipped: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, float]:
    """Where the ratio clip binds, by side: below 1 - eps_low (A < 0) and above 1 + eps_high (A > 0), as fractions of
    the valid tokens (TRL's clip_ratio/low_mean and clip_ratio/high_mean; clip_frac is their sum, its region_mean)."""
    advantages = advantages.expand_as(clipped)
    return {"clip_frac_below": _frac(clipped & (advantages < 0), mask),
            "clip_frac_above": _frac(clipped & (advantages > 0), mask)}


def _check_nonneg(**values: float) -> None:
    for name, v in values.items():
        if not v >= 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


def _check_fraction(name: str, v: float) -> None:
    if not 0 < v <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {v}")


def _check_dual_clip(clip_ratio_c: float) -> None:
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual-clip lower bound), got {clip_ratio_c}")


class ClippedSurrogate(NamedTuple):
    """PPO's clipped objective per token, all (B, T): the loss, where the ratio clip binds, where dual-clip binds."""

    loss: Tensor
    clipped: Tensor
    dual_clipped: Tensor


def clipped_surrogate(advantages: Tensor, ratio: Tensor, clip_ratio_low: float, clip_ratio_high: float,
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


@register_policy_loss("vanilla", hyperparameters={"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0})
def ppo_clip_loss(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                  norm: Norm = _DEFAULT_NORM, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                  clip_ratio_c: float = 3.0) -> LossAndMetrics:
    """PPO clipped surrogate with clip-higher and dual-clip.  all inputs (B, T) -> (scalar loss, metrics).

    Formula: l = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), then l = min(l, -A c) where A < 0;
    r = exp(logp - old_logp).  Schulman et al. 2017 (PPO); Yu et al. 2025 (DAPO clip-higher);
    Ye et al. 2020 (dual-clip).
    Metrics: clip_frac (clip_frac_below + clip_frac_above: the ratio clipped on either side), clip_frac_lower
    (dual-clip, verl's pg_clipfrac_lower), ppo_kl, ratio_mean.
    """
    _check_dual_clip(clip_ratio_c)
    log_ratio = _log_ratio(logprobs, old_logprobs, response_mask)
    ratio = log_ratio.exp()
    pg = clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    loss = agg_loss(pg.loss, response_mask, norm)
    with torch.no_grad():
        metrics = {
            "clip_frac": _frac(pg.clipped, response_mask),
            **_clip_sides(pg.clipped, advantages, response_mask),
            "clip_frac_lower": _frac(pg.dual_clipped, response_mask),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "ratio_mean": masked_mean(ratio, response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("reinforce", hyperparameters={}, uses_old_logprobs=False)
def reinforce_loss(old_logprobs: Optional[Tensor], logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                   norm: Norm = _DEFAULT_NORM) -> LossAndMetrics:
    """Plain on-policy policy gradient (Williams 1992, REINFORCE).  (B, T) inputs -> (scalar loss, {}).

    Formula: l_t = -A_t * logp_t, aggregated by ``agg_loss``; ``old_logprobs`` is ignored (may be None).
    """
    # _where_valid, not a product with the mask: padding may hold -inf log-probs, and 0 * inf is NaN.
    return agg_loss(_where_valid(-advantages * logprobs, response_mask), response_mask, norm), {}


@register_policy_loss("gspo", hyperparameters={"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4})
def gspo_loss(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
              norm: Norm = _DEFAULT_NORM, *, clip_ratio_low: float = 3e-4,
              clip_ratio_high: float = 4e-4) -> LossAndMetrics:
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).  (B, T) x4 -> (loss, metrics).

    Formula: l_t = max(-A s_t, -A clip(s_t, 1-eps_low, 1+eps_high)), s_t = sg[exp(mean_t(logp - old))] exp(logp_t - sg[logp_t]).

    s_t equals the sequence ratio s_i in value, but its gradient is s_i * grad logp_t (the paper's
    GSPO-token form), so clipping acts on whole sequences.  Defaults 3e-4 / 4e-4 are the paper's
    clipping ranges.  The paper aggregates with seq-mean-token-mean; like verl 0.9.1 we honour
    ``norm.mode`` (default token-mean), so pass "seq-mean-token-mean" to match the paper.
    Metrics: clip_frac (tokens in clipped sequences; below/above by side), ppo_kl, seq_ratio_mean.
    """
    _check_nonneg(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    mask = response_mask.bool()
    log_ratio = _where_valid(logprobs - old_logprobs, response_mask)
    # Mean first, clamp after (verl clamps the sum at +10 only): clamping the mean keeps s_i exact
    # for every sequence with |mean log-ratio| <= 20; the clamp is on a detached value, so it never
    # zeroes a gradient.
    seq_log_ratio = masked_mean(log_ratio, response_mask, dim=-1).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    # logp - sg[logp] is exactly 0 in value (on padding forced to 0: inf - inf would be nan).
    token_term = _where_valid(logprobs - logprobs.detach(), response_mask)
    ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + token_term)
    pg = clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high)
    loss = agg_loss(pg.loss, response_mask, norm)
    with torch.no_grad():
        nonempty = mask.any(-1)
        metrics = {
            "clip_frac": _frac(pg.clipped, response_mask),
            **_clip_sides(pg.clipped, advantages, response_mask),
            "ppo_kl": _ppo_kl(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO), response_mask),
            "seq_ratio_mean": masked_mean(seq_log_ratio.exp(), nonempty).item(),
        }
    return loss, metrics


@register_policy_loss("sapo", hyperparameters={"tau_pos": 1.0, "tau_neg": 1.05, "follow_loss_agg_mode": False})
def sapo_loss(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
              norm: Norm = _DEFAULT_NORM, *, tau_pos: float = 1.0, tau_neg: float = 1.05,
              follow_loss_agg_mode: bool = False) -> LossAndMetrics:
    """Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv:2511.20347).  (B, T) x4 -> (loss, metrics).

    Formula: l_t = -A_t (4/tau) sigmoid(tau (r_t - 1)), tau = tau_pos if A_t > 0 else tau_neg, r_t = exp(logp - old).

    A smooth gate instead of a hard clip: d l / d logp = -A r 4 sigma (1 - sigma), which is exactly
    the policy gradient -A grad logp at r = 1 and decays smoothly as r leaves 1 (faster for A < 0,
    since tau_neg > tau_pos).  Defaults 1.0 / 1.05 are the paper's and verl's.  As in verl, A = 0
    takes tau_neg (its loss is 0 either way).  As the paper and verl 0.9.1, the loss is aggregated with
    seq-mean-token-mean whatever ``norm.mode`` says (the norm's counts are kept);
    ``follow_loss_agg_mode=True`` honours ``norm.mode`` instead.
    Metrics: ppo_kl, ratio_mean, gate_grad_mean (mean of 4 sigma (1 - sigma), 1 when on-policy).
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    log_ratio = _log_ratio(logprobs, old_logprobs, response_mask)
    ratio = log_ratio.exp()
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    sig = torch.sigmoid(tau * (ratio - 1.0))
    loss_mat = -advantages * sig * (4.0 / tau)
    norm = LossNorm.of(norm)
    if not follow_loss_agg_mode:
        norm = dataclasses.replace(norm, mode="seq-mean-token-mean")
    loss = agg_loss(loss_mat, response_mask, norm)
    with torch.no_grad():
        metrics = {
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "ratio_mean": masked_mean(ratio, response_mask).item(),
            "gate_grad_mean": masked_mean(4.0 * sig * (1.0 - sig), response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("cispo", hyperparameters={"clip_ratio_low": 0.2, "clip_ratio_high": 0.2})
def cispo_loss(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
               norm: Norm = _DEFAULT_NORM, *, clip_ratio_low: float = 0.2,
               clip_ratio_high: float = 0.2) -> LossAndMetrics:
    """Clipped IS-weight Policy Optimization (MiniMax-M1, MiniMax 2025, arXiv:2506.13585).  (B, T) x4 -> (loss, metrics).

    Formula: l_t = -sg[clip(r_t, 1-eps_low, 1+eps_high)] A_t logp_t, r_t = exp(logp - old).

    Unlike PPO no token loses its gradient: only the weight is clipped.  Defaults 0.2 / 0.2 are
    verl's (its shared actor clip_ratio_low/high); the paper sets no lower bound and tunes only
    eps_high -- verl's CISPO recipe passes clip_ratio_low=10 for that, and so can you.
    Metrics: clip_frac (weight clipped at either bound), ppo_kl, ratio_mean.
    """
    _check_nonneg(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    log_ratio = _log_ratio(logprobs, old_logprobs, response_mask)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high).detach()
    loss_mat = -weight * advantages * _where_valid(logprobs, response_mask)
    loss = agg_loss(loss_mat, response_mask, norm)
    with torch.no_grad():
        clipped = (ratio < 1.0 - clip_ratio_low) | (ratio > 1.0 + clip_ratio_high)
        metrics = {
            "clip_frac": _frac(clipped, response_mask),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "ratio_mean": masked_mean(ratio, response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("gpg", hyperparameters={}, uses_old_logprobs=False)
def gpg_loss(old_logprobs: Optional[Tensor], logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
             norm: Norm = _DEFAULT_NORM) -> LossAndMetrics:
    """Group Policy Gradient loss (Chu et al. 2025, arXiv:2504.02546).  (B, T) inputs -> (loss, metrics).

    Formula: l_t = -A_t logp_t (no ratio, no clip), aggregated by ``agg_loss``.

    The same loss as ``reinforce``: GPG's differences (group baseline, correction for all-equal
    groups) live in its advantage estimator, not here.  ``old_logprobs`` may be None; when given,
    ``ppo_kl`` is reported (verl returns no metrics).
    """
    loss, metrics = reinforce_loss(old_logprobs, logprobs, advantages, response_mask, norm)
    if old_logprobs is not None:
        with torch.no_grad():
            metrics["ppo_kl"] = _ppo_kl(_log_ratio(logprobs, old_logprobs, response_mask), response_mask)
    return loss, metrics


def _centered_cov(advantages: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token covariance term of Cui et al. 2025, 0 on padding (detached).  (B, T) -> (B, T).

    Formula: cov_t = (A_t - mean A) (logp_t - mean logp), means over the valid tokens of this call.
    """
    adv, logp = advantages.detach(), logprobs.detach()
    cov = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))
    return _where_valid(cov, mask)


def _random_subset(candidates: Tensor, n: int, generator: Optional[torch.Generator]) -> Tensor:
    """min(n, #candidates) of the candidate positions, drawn uniformly.  (B, T) bool -> (B, T) bool."""
    flat_idx = candidates.flatten().nonzero().squeeze(-1)
    gen_device = generator.device if generator is not None else "cpu"
    perm = torch.randperm(flat_idx.numel(), generator=generator, device=gen_device).to(flat_idx.device)
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    chosen[flat_idx[perm[:n]]] = True
    return chosen.view_as(candidates)


@register_policy_loss("clip_cov", hyperparameters={
    "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0,
    "clip_cov_ub": 5.0, "generator": None})
def clip_cov_loss(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                  norm: Norm = _DEFAULT_NORM, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                  clip_ratio_c: float = 3.0, clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0,
                  clip_cov_ub: float = 5.0, generator: Optional[torch.Generator] = None) -> LossAndMetrics:
    """Clip-Cov (Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs).  (B, T) x4 -> (loss, metrics).

    Formula: l_t = 0 on max(1, floor(ratio N)) random tokens with lb < cov_t < ub, else vanilla; cov_t = (A - mean A)(logp - mean logp).

    arXiv:2505.22617.  Zeroing a token's loss removes its gradient; it still counts in the
    token-mean denominator (as in verl).  Like verl we select at least one token even when
    clip_cov_ratio * N < 1 (N = valid tokens of this call), so a small micro-batch detaches one
    token rather than none; selection and the covariance means are per call (per micro-batch), also
    as in verl.  ``generator`` makes the random subset reproducible.  As in verl, tokens already clipped
    by either ratio bound are not candidates (they carry no gradient to detach).  Deviation from verl
    0.9.1: the base loss is this package's ``vanilla``, with dual-clip ``clip_ratio_c`` for A < 0 (verl's
    clip_cov has none), and dual-clipped tokens are not candidates either.
    Metrics: clip_frac (below/above by side), clip_frac_lower (dual-clip), cov_clip_frac (detached share),
    ppo_kl, ratio_mean.
    """
    _check_nonneg(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    _check_fraction("clip_cov_ratio", clip_cov_ratio)
    _check_dual_clip(clip_ratio_c)
    mask = response_mask.bool()
    log_ratio = _log_ratio(logprobs, old_logprobs, response_mask)
    ratio = log_ratio.exp()
    vanilla, clipped, dual_active = clipped_surrogate(advantages, ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c)

    with torch.no_grad():
        cov = _centered_cov(advantages, logprobs, response_mask)
        candidates = mask & ~clipped & ~dual_active & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        detach = _random_subset(candidates, max(int(clip_cov_ratio * int(mask.sum().item())), 1), generator)

    loss_mat = _where_valid(vanilla, ~detach)
    loss = agg_loss(loss_mat, response_mask, norm)
    with torch.no_grad():
        metrics = {
            "clip_frac": _frac(clipped, response_mask),
            **_clip_sides(clipped, advantages, response_mask),
            "clip_frac_lower": _frac(dual_active, response_mask),
            "cov_clip_frac": _frac(detach, response_mask),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "ratio_mean": masked_mean(ratio, response_mask).item(),
        }
    return loss, metrics


@register_policy_loss("kl_cov", hyperparameters={"kl_cov_ratio": 2e-4, "kl_cov_coef": 1.0})
def kl_cov_loss(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                norm: Norm = _DEFAULT_NORM, *, kl_cov_ratio: float = 2e-4,
                kl_cov_coef: float = 1.0) -> LossAndMetrics:
    """KL-Cov (Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs).  (B, T) x4 -> (loss, metrics).

    Formula: l_t = -A_t r_t + coef |logp_t - old_t| on the top k = max(1, floor(ratio N)) tokens by cov_t, else -A_t r_t.

    arXiv:2505.22617.  As in the paper and verl, KL-Cov replaces clipping: the surrogate -A r is unclipped and the
    KL penalty on the highest-covariance tokens is the only trust region.  Like verl we penalise at
    least one token when kl_cov_ratio * N < 1 (N = valid tokens of this call); covariance means and
    the top-k are per call (per micro-batch).  ``kl_cov_coef`` is verl's ``ppo_kl_coef``; its
    function fallback is 1.0 (our default) while its config file ships 0.1.  Selection is
    deterministic (top-k), so no generator is needed.
    Metrics: kl_cov_frac (penalised share), ppo_kl, ppo_kl_abs (mean |logp - old|), ratio_mean.
    """
    _check_fraction("kl_cov_ratio", kl_cov_ratio)
    _check_nonneg(kl_cov_coef=kl_cov_coef)
    mask = response_mask.bool()
    log_ratio = _log_ratio(logprobs, old_logprobs, response_mask)
    ratio = log_ratio.exp()
    pg = -advantages * ratio
    with torch.no_grad():
        cov = _centered_cov(advantages, logprobs, response_mask)
        n_valid = int(mask.sum().item())
        k = min(max(int(kl_cov_ratio * n_valid), 1), n_valid)
        # Padding scores -inf so it is never picked while a valid token remains (k <= N).
        scores = torch.where(mask, cov, torch.full_like(cov, -float("inf"))).flatten()
        penalise = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
        penalise[torch.topk(scores, k).indices] = True
        penalise = penalise.view_as(mask)
    loss_mat = torch.where(penalise, pg + kl_cov_coef * log_ratio.abs(), pg)
    loss = agg_loss(loss_mat, response_mask, norm)
    with torch.no_grad():
        metrics = {
            "kl_cov_frac": _frac(penalise, response_mask),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "ppo_kl_abs": masked_mean(log_ratio.abs(), response_mask).item(),
            "ratio_mean": masked_mean(ratio, response_mask).item(),
        }
    return loss, metrics


GEO_MEAN_CLIP_DIRECTIONS = ("token", "sequence")


@register_policy_loss("geo_mean", hyperparameters={"clip_ratio_low": 0.4, "clip_ratio_high": 0.4,
                                                   "clip_direction": "token"})
def geo_mean_loss(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                  norm: Norm = _DEFAULT_NORM, *, clip_ratio_low: float = 0.4, clip_ratio_high: float = 0.4,
                  clip_direction: str = "token") -> LossAndMetrics:
    """Geometric-Mean Policy Optimization, GMPO (Zhao et al. 2025, arXiv:2507.20673).  (B, T) x4 -> (loss, metrics).

    Formula: l_i = -A_i exp(mean_t c_t), c_t = sgn(A_t) min(sgn(A_t) lr_t, sgn(A_t) clip(lr_t, -eps_low, eps_high)), lr_t = logp_t - old_t.

    A_i = masked mean of A_t (GMPO uses sequence-level advantages).  The per-sequence geometric
    mean of token ratios, clipped token-wise in log space (the paper's range (e^-0.4, e^0.4) gives
    the defaults) and pessimistically: a bound only binds in the direction that would raise the
    objective -- min for A > 0, max for A < 0.  ``clip_direction="token"`` (verl 0.9.1) takes that sign
    from each token's A_t, so a token with A_t = 0 has c_t = 0; ``"sequence"`` takes it from A_i (min if
    A_i > 0, else max).  The two agree for outcome advantages such as GRPO's.  Aggregation: loss = sum_i
    l_i / N_seq, N_seq = ``norm.num_seqs`` or the rows with a valid token (all rows with
    ``norm.count_empty_rows``; rows without one give l_i = 0) -- a plain mean over sequences as in the
    paper and verl, exact under gradient accumulation; ``norm.mode`` is validated but ignored (there are
    no token losses to reduce).
    Metrics: clip_frac (a log-ratio bound was active), ppo_kl, seq_ratio_mean.
    """
    if clip_direction not in GEO_MEAN_CLIP_DIRECTIONS:
        raise ValueError(f"clip_direction={clip_direction!r} is unknown; valid: {', '.join(GEO_MEAN_CLIP_DIRECTIONS)}")
    norm = LossNorm.of(norm)
    _check_nonneg(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    mask = response_mask.bool()
    log_ratio = _log_ratio(logprobs, old_logprobs, response_mask)
    seq_adv = masked_mean(advantages, response_mask, dim=-1)  # (B,) sequence-level advantage
    bounded = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    if clip_direction == "token":
        sign = _where_valid(torch.sign(advantages), response_mask).to(log_ratio.dtype)
    else:
        sign = torch.where(seq_adv > 0, 1.0, -1.0).to(log_ratio.dtype).unsqueeze(-1).expand_as(log_ratio)
    clipped_log = sign * torch.minimum(sign * log_ratio, sign * bounded)
    seq_log_ratio = masked_mean(clipped_log, response_mask, dim=-1)  # (B,), 0 for empty rows
    seq_ratio = seq_log_ratio.exp()
    seq_loss = -seq_adv * seq_ratio
    # agg_loss on a (B, 1) matrix: seq-mean-token-sum is sum_i l_i / N_seq with the shared normaliser.
    seq_norm = LossNorm("seq-mean-token-sum", num_seqs=norm.num_seqs, count_empty_rows=norm.count_empty_rows)
    loss = agg_loss(seq_loss.unsqueeze(-1), mask.any(-1, keepdim=True), seq_norm)
    with torch.no_grad():
        metrics = {
            "clip_frac": _frac((clipped_log != log_ratio) & (sign != 0), response_mask),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "seq_ratio_mean": masked_mean(seq_ratio, mask.any(-1)).item(),
        }
    return loss, metrics
