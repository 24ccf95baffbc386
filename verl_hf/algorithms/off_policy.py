"""Off-policy (asynchronous) training: how stale each sampled token is, and the proximal policy's log-probs.

When generation runs ahead of the update, a token may have been sampled by a policy some optimizer steps older
than the one it trains. Every token carries the version of the policy that sampled it (the number of optimizer
steps its weights had seen). The PPO ratio is then taken against a *proximal* policy, the trainer's weights at
the start of the step (version v), and the behaviour policy (the engine's log-probs) is corrected by the
importance weight pi_prox / pi_behave: AReaL's decoupled objective (Fu et al. 2025, arXiv:2505.24298,
eq. 5). That is what `rollout_is_weights(prox, behave)` times the PPO loss against `old_logprobs = prox`
computes, so the decoupled loss needs no loss of its own; what asynchrony adds is where the proximal
log-probs come from:

- ``"recompute"``: the trainer's forward at the start of the step (exact; one forward per round, as today);
- ``"loglinear"``: AReaL's interpolation per token between the behaviour log-probs and the current policy's,
  weighted by how many versions separate them (no extra forward; `loglinear_proximal_logprobs`).

See it work: tests/test_off_policy.py
"""

from __future__ import annotations

import torch
from torch import Tensor

from .utils import masked_mean

def token_staleness(token_versions: Tensor, response_mask: Tensor, trainer_version: int) -> Tensor:
    """Optimizer steps between the policy that sampled each response token and the trainer's.  (B, T) -> (B, T).

    Formula: s = v - v_b on response tokens, 0 elsewhere; v_b > v (a token from a future policy) is an error.
    token_versions: (B, T) integer versions; response_mask: (B, T).
    """
    mask = response_mask.bool()
    staleness = torch.where(mask, trainer_version - token_versions.long(), torch.zeros_like(token_versions.long()))
    if bool((staleness < 0).any()):
        newest = int(token_versions.long()[mask].max())
        raise ValueError(f"a response token carries policy version {newest}, newer than the trainer's version "
                         f"{trainer_version}: versions must count the optimizer steps the sampling weights had seen.")
    return staleness


def staleness_metrics(token_versions: Tensor, response_mask: Tensor, trainer_version: int) -> dict[str, float]:
    """`async/staleness_mean` and `async/staleness_max` over response tokens (0 for an empty mask), and
    `async/partial_frac`: the share of responses sampled by more than one version (a weight load mid-sequence)."""
    staleness = token_staleness(token_versions, response_mask, trainer_version).float()
    return {"async/staleness_mean": masked_mean(staleness, response_mask).item(),
            "async/staleness_max": float(staleness.max()) if staleness.numel() else 0.0,
            "async/partial_frac": partial_fraction(token_versions, response_mask)}


def partial_fraction(token_versions: Tensor, response_mask: Tensor) -> float:
    """Share of the rows with a response token whose tokens carry more than one version.  (B, T) x2 -> float.

    Formula: mean over rows with sum(mask) > 0 of [max_t v_b != min_t v_b] (t over response tokens); 0 if none.
    """
    mask = response_mask.bool()
    rows = mask.any(dim=1)
    if not bool(rows.any()):
        return 0.0
    versions = token_versions.long()
    newest = versions.masked_fill(~mask, torch.iinfo(torch.long).min).max(dim=1).values
    oldest = versions.masked_fill(~mask, torch.iinfo(torch.long).max).min(dim=1).values
    return float((newest != oldest)[rows].float().mean())


def loglinear_proximal_logprobs(behaviour_logprobs: Tensor, current_logprobs: Tensor, token_versions: Tensor,
                                trainer_version: int, response_mask: Tensor) -> Tensor:
    """AReaL's log-linear approximation of the proximal policy's log-probs, detached.  (B, T) x3 -> (B, T).

    Formula: log pi_prox = log pi_behave + a (log pi_theta - log pi_behave), a = (v - v_b) / (v + 1 - v_b),
    with v the trainer's version (the proximal policy), v + 1 the policy being optimised (pi_theta) and v_b the
    version that sampled the token: a fresh token (v_b = v) keeps its behaviour log-prob, an older one moves
    towards the current policy in proportion to the steps since. 0 on padding.
    """
    staleness = token_staleness(token_versions, response_mask, trainer_version).to(behaviour_logprobs.dtype)
    alpha = staleness / (staleness + 1)
    behaviour, current = behaviour_logprobs.detach(), current_logprobs.detach()
    proximal = behaviour + alpha * (current - behaviour)
    return torch.where(response_mask.bool(), proximal, torch.zeros((), dtype=proximal.dtype, device=proximal.device))
