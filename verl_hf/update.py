"""One micro-batch -> the actor's loss (policy loss, KL term, entropy bonus) and the critics' value losses.

The policy loss is the registry's entry bound once to its hyper-parameters (a misspelt `policy_loss_kwargs`
key fails when the config is built, see `algorithms.policy_loss_spec`); the loss gets only tensors and the
micro-batch's `LossNorm`, the normaliser of its whole optimizer step, so gradient accumulation is exact.

See it work: tests/test_round.py, tests/test_trainer_e2e.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .algorithms import (agg_loss, kl_penalty, loglinear_proximal_logprobs, masked_mean, policy_loss_spec,
                         rollout_is_weights, value_loss)
from .algorithms.distill import reverse_kl_advantages
from .algorithms.registry import CLIP_FIELDS
from .settings import Settings


@dataclass(frozen=True)
class ActorLoss:
    """The actor's loss of one micro-batch, its metrics, and the KL term's (kl_sum, tokens) for the KL meter
    (None when KL is not a loss term)."""

    loss: torch.Tensor
    metrics: dict
    kl_observed: tuple[float, float] | None = None


@dataclass(frozen=True)
class UpdateSettings(Settings):
    """What the update reads: the policy loss and its hyper-parameters, the KL term, the entropy bonus, the
    rollout correction, value clipping, and what a non-finite critic step does."""
    policy_loss: str
    policy_loss_kwargs: dict
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    kl_kind: str
    use_kl_in_reward: bool
    entropy_coef: float
    rollout_is: str | None
    rollout_is_mode: str
    rollout_is_threshold: float
    rollout_is_threshold_low: float | None
    cliprange_value: float
    on_nonfinite: str
    proximal_logprobs: str
    distill_loss: str | None
    distill_coef: float


def bind_policy_loss(settings: UpdateSettings):
    """The configured policy loss with its hyper-parameters fixed: the clip fields it declares (None: its own
    default) and `policy_loss_kwargs`."""
    spec = policy_loss_spec(settings.policy_loss)
    clips = {k: getattr(settings, k) for k in CLIP_FIELDS if k in spec.hyperparameters}
    return spec.bind(**clips, **settings.policy_loss_kwargs)


class PolicyUpdate:
    """Holds: its settings, the policy loss bound to them, and the KL controller."""

    def __init__(self, settings: UpdateSettings, kl_controller):
        self.settings, self.kl_controller = settings, kl_controller
        self.policy_loss = bind_policy_loss(settings)  # a wrong policy_loss_kwargs key fails here, early

    def actor_loss(self, mb, logprobs: torch.Tensor, entropy: torch.Tensor | None,
                   trainer_version: int = 0, divergence: torch.Tensor | None = None) -> ActorLoss:
        """`trainer_version`: the optimizer steps the trained weights have seen (asynchronous training);
        `divergence` (B, Lr): the per-token divergence from the teacher, with gradients (distill_loss 'gkd' or
        'topk_forward_kl')."""
        s, mask, norm = self.settings, mb.response_mask.float(), mb.loss_norm
        old = self.proximal_logprobs(mb, logprobs, trainer_version)
        advantages, metrics = self.distilled_advantages(mb, old)
        advantages, correction_metrics = self.corrected_advantages(mb, advantages, old)
        metrics.update(correction_metrics)
        loss, loss_metrics = self.policy_loss(old, logprobs, advantages, mask, norm)
        metrics.update({f"actor/{k}": v for k, v in loss_metrics.items()})
        if entropy is not None:
            metrics["actor/entropy"] = masked_mean(entropy.detach(), mask).item()
        kl_observed = None
        if mb.ref_logprobs is not None:
            kl = kl_penalty(logprobs, mb.ref_logprobs, s.kl_kind)
            metrics["kl"] = masked_mean(kl.detach(), mask).item()
            if not s.use_kl_in_reward:
                loss = loss + self.kl_controller.value * agg_loss(kl, mask, norm)
                metrics["kl/coef"] = self.kl_controller.value
                kl_observed = (float((kl.detach() * mask).sum()), float(mask.sum()))
        if s.entropy_coef:
            loss = loss - s.entropy_coef * agg_loss(entropy, mask, norm)
        if divergence is not None:  # GKD, top-k forward KL: the divergence itself is minimised, aggregated like the loss
            loss = loss + s.distill_coef * agg_loss(divergence, mask, norm)
            metrics[f"distill/{s.distill_loss}"] = masked_mean(divergence.detach(), mask).item()
        return ActorLoss(loss, metrics, kl_observed)

    def proximal_logprobs(self, mb, logprobs: torch.Tensor, trainer_version: int) -> torch.Tensor:
        """The ratio's denominator: the stored old log-probs, else the live ones detached (one update per round:
        the weights at the step's start); with proximal_logprobs='loglinear', AReaL's interpolation from each
        token's version instead."""
        if self.settings.proximal_logprobs == "loglinear":
            if mb.rollout_versions is None or mb.rollout_logprobs is None:
                raise RuntimeError("proximal_logprobs='loglinear' needs each token's version and sampling log-prob, "
                                   "which this round does not carry; please report this.")
            return loglinear_proximal_logprobs(mb.rollout_logprobs, logprobs, mb.rollout_versions, trainer_version,
                                               mb.response_mask)
        return mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()

    def distilled_advantages(self, mb, old_logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """On-policy distillation (a teacher scored the round): the task advantages plus each sampled token's
        -distill_coef * (log p_student - log p_teacher), the student's log-probs being the ratio's old ones (the
        policy at the step's start). Added here rather than when the round is planned: with one update per
        round those are the live log-probs, detached, so the signal costs no extra forward pass."""
        if mb.teacher_logprobs is None or self.settings.distill_loss == "gkd":  # GKD: its teacher scores in the
            return mb.advantages, {}  # update (a round resumed across a change of loss may still carry these)
        mask = mb.response_mask.float()
        distill = reverse_kl_advantages(old_logprobs, mb.teacher_logprobs, mask, self.settings.distill_coef)
        # log p_s - log p_t per token on the student's own samples: a one-sample estimate of KL(student || teacher)
        gap = {"distill/reverse_kl": masked_mean(-distill / self.settings.distill_coef, mask).item()}
        if self.settings.distill_loss == "topk_forward_kl":  # its divergence is the signal; the gap is only logged
            return mb.advantages, gap
        return mb.advantages + distill, gap

    def corrected_advantages(self, mb, advantages: torch.Tensor,
                             old_logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """With `rollout_is`: advantages x the truncated/masked weights pi_old / pi_rollout (see
        algorithms/rollout_correction.py for why weighting the advantages is the same gradient)."""
        s = self.settings
        if s.rollout_is is None:
            return advantages, {}
        weights, metrics = rollout_is_weights(old_logprobs, mb.rollout_logprobs, mb.response_mask, s.rollout_is,
                                              s.rollout_is_mode, s.rollout_is_threshold,
                                              s.rollout_is_threshold_low)
        return advantages * weights, dict(metrics)

    def critic_step(self, mb, critic, old_values_field: str, returns_field: str, prefix: str,
                    optimizer_step: bool) -> dict[str, float]:
        """Clipped value loss and backward on the same micro-batch; the critic steps with the actor's optimizer
        steps (`optimizer_step`), or every micro-step when its engine accumulates by itself."""
        values = critic.forward_values(mb)
        loss, metrics = value_loss(values, getattr(mb, old_values_field), getattr(mb, returns_field),
                                   mb.response_mask.float(), cliprange_value=self.settings.cliprange_value,
                                   norm=mb.loss_norm)
        critic.backward(loss)
        out = {f"{prefix}/value_loss": loss.item(), **{f"{prefix}/{k}": v for k, v in metrics.items()}}
        if critic.steps_every_micro_step or optimizer_step:
            norm = critic.step()  # a NaN/inf norm's step is not taken (TrainableRole.step)
            if norm is not None:
                # 1 for a step whose update was dropped: its mean over a logging window is the share skipped
                out[f"{prefix}/grad_norm"], out[f"{prefix}/skipped_step"] = norm, float(not math.isfinite(norm))
            if norm is not None and not math.isfinite(norm) and self.settings.on_nonfinite == "raise":
                raise FloatingPointError(f"the {prefix}'s gradient norm is {norm}; its optimizer step was not taken. "
                                         f"Lower critic_learning_rate, or set on_nonfinite='skip'.")
        return out


def entropy_needed(args, state) -> bool:
    """Entropy over the vocabulary is costly: only for an entropy bonus, or on steps that will be logged."""
    if args.entropy_coef > 0 or args.logging_strategy != "steps":
        return True
    every = state.logging_steps or 1
    return (state.global_step + 1) % every == 0 or state.global_step == 0
