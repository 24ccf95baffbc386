"""Per-token estimators of KL(pi || pi_ref) from sampled-token log-probs.

Estimators k1/k2/k3 follow J. Schulman, "Approximating KL Divergence" (2020),
http://joschu.net/blog/kl-approx.html.  Names follow verl: ``kl``=k1,
``mse``=k2, ``low_var_kl``=k3, and a trailing ``+`` (e.g. ``k3+``) gives the
straight-through variant: forward value of the kind, gradient of k2.

See it work: tests/test_algorithms.py
"""

import torch

KL_KINDS = ("k1", "k2", "k3", "abs")
_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


def _canonical(kind: str) -> str:
    """Resolve an alias to its canonical kind; ValueError listing the valid kinds otherwise."""
    name = _ALIASES.get(kind, kind)
    if name not in KL_KINDS:
        aliases = ", ".join(f"{a}->{c}" for a, c in sorted(_ALIASES.items()))
        raise ValueError(
            f"unknown KL kind {kind!r}; valid: {', '.join(KL_KINDS)} "
            f"(aliases: {aliases}; append '+' for the straight-through k2 gradient, e.g. 'k3+')."
        )
    return name


def _kl_value(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Plain (no straight-through) estimate for a canonical kind.  (B, T), (B, T) -> (B, T)."""
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "abs":
        return diff.abs()
    # k3: clamp like verl's 'low_var_kl' -- exp of an unclamped log ratio overflows (exp(100) = inf
    # in fp32) and single outlier tokens would dominate the penalty.  Deviation from the pure estimator.
    log_ratio = (-diff).clamp(-20.0, 20.0)  # log(pi_ref / pi)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate.  logprobs, ref_logprobs (B, T) -> (B, T).

    Formulas with d = logp - ref_logp: k1 = d; k2 = d^2 / 2; k3 = exp(-d) + d - 1; abs = |d|
    (Schulman 2020, "Approximating KL Divergence").  ``kind + '+'``: value of kind, gradient of k2.
    """
    straight_through = kind.endswith("+")
    name = _canonical(kind[:-1] if straight_through else kind)
    value = _kl_value(logprobs, ref_logprobs, name)
    if not straight_through or name == "k2":
        return value
    # verl's '+' suffix: k1/k3 are (near-)unbiased as values but k2's gradient is the unbiased
    # gradient of KL for on-policy samples, so use k2 for backward and `kind` for the forward value.
    k2 = _kl_value(logprobs, ref_logprobs, "k2")
    return k2 + (value - k2).detach()
