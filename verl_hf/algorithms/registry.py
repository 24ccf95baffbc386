"""Name registries for advantage estimators and policy losses, each entry describing itself.

Built-ins register themselves on import of ``verl_hf.algorithms``; users add their own with
``@register_advantage("name", ...)`` / ``@register_policy_loss("name", hyperparameters={...})`` and select
them by name from a config string.  ``ADVANTAGE_ESTIMATORS`` / ``POLICY_LOSSES`` stay plain name -> function
dicts; ``advantage_spec(name)`` / ``policy_loss_spec(name)`` add what each entry needs (values, groups, a
greedy baseline, per-turn rewards; its hyper-parameters and their defaults), so the config checks, the round builder and the
model card ask the registry instead of comparing names.

See it work: tests/test_registry.py
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional

ADVANTAGE_ESTIMATORS: Dict[str, Callable] = {}
POLICY_LOSSES: Dict[str, Callable] = {}
_ADVANTAGE_SPECS: Dict[str, "AdvantageSpec"] = {}
_POLICY_LOSS_SPECS: Dict[str, "PolicyLossSpec"] = {}

# Keywords of the pre-LossNorm loss signature; the legacy adapter fills them from the LossNorm.
_LEGACY_NORM_KEYWORDS = {"loss_agg_mode": "mode", "num_tokens": "num_tokens", "num_seqs": "num_seqs",
                         "norm_constant": "constant"}
# Loss hyper-parameters that are VerlConfig fields of the same name (bound to the losses that declare them).
# The trainer passed them to every pre-LossNorm loss (clip_ratio_c always, the ratios when set): a legacy loss
# that names them, or takes **kwargs, keeps getting them.
CLIP_FIELDS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")


@dataclass(frozen=True)
class AdvantageSpec:
    """An advantage estimator and what it needs from the round.

    needs_values: a critic's values (B, T) (GAE); needs_groups: several samples per prompt, its baseline comes
    from the other samples (num_generations >= 2); needs_greedy_baseline: the reward of each prompt's greedy
    response as ``reward_baselines`` (ReMax); one_sample_per_prompt: works with one sample per prompt;
    needs_turn_rewards: an environment's per-turn rewards as ``turn_rewards`` (MT-GRPO), so an ``environment=``.
    """

    name: str
    fn: Callable
    display_name: str
    needs_values: bool = False
    needs_groups: bool = False
    needs_greedy_baseline: bool = False
    one_sample_per_prompt: bool = False
    needs_turn_rewards: bool = False
    display_name_no_std: Optional[str] = None  # the name when the group std is not divided out (Dr.GRPO)

    def __call__(self, *args, **inputs):
        """fn(**inputs), passing only the inputs fn takes: the round offers every input to every estimator, and
        an estimator written before an input existed (e.g. ``singleton_advantage``) must not break."""
        try:
            accepted = _accepted_keywords(self.fn)
        except TypeError:  # an unhashable callable (e.g. a dataclass instance): look it up uncached
            accepted = _accepted_keywords.__wrapped__(self.fn)
        if accepted is not None:
            inputs = {k: v for k, v in inputs.items() if k in accepted}
        return self.fn(*args, **inputs)

    def display_name_for(self, *, norm_by_std: bool = True) -> str:
        """The algorithm's name on a model card: ``display_name``, or ``display_name_no_std`` without std."""
        return self.display_name_no_std if (not norm_by_std and self.display_name_no_std) else self.display_name


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss, its hyper-parameters (name -> default) and whether it reads old log-probs.

    ``fn(old_logprobs, logprobs, advantages, response_mask, norm, **hyperparameters) -> (loss, metrics)``;
    ``bind(**hyper)`` fixes the hyper-parameters once and checks their names.
    """

    name: str
    fn: Callable
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    uses_old_logprobs: bool = True
    legacy_norm_keywords: Optional[tuple] = None  # set for a pre-LossNorm fn: the norm keywords it takes

    def bind(self, **hyper) -> Callable:
        """callable(old_logprobs, logprobs, advantages, response_mask, norm) -> (loss, metrics).

        A value of None means the loss's default; a name the loss does not declare raises ValueError.
        """
        unknown = sorted(set(hyper) - set(self.hyperparameters))
        if unknown:
            raise ValueError(f"policy loss '{self.name}' has no hyper-parameter {unknown}; valid: "
                             f"{sorted(self.hyperparameters)}.")
        values = {**self.hyperparameters, **{k: v for k, v in hyper.items() if v is not None}}
        values = {k: v for k, v in values.items() if v is not None}  # None default: the function's own
        if self.legacy_norm_keywords is not None:
            return functools.partial(_call_legacy, self.fn, self.legacy_norm_keywords, values)
        return functools.partial(self.fn, **values)


@functools.lru_cache(maxsize=None)
def _accepted_keywords(fn: Callable) -> Optional[frozenset]:
    """The keyword names fn takes, or None when it takes any (**kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def _accepting_legacy_norm_keywords(fn: Callable) -> Callable:
    """A built-in loss that also takes the pre-LossNorm keywords (loss_agg_mode=, num_tokens=, num_seqs=,
    norm_constant=), so calls written against the earlier public contract keep working."""

    @functools.wraps(fn)
    def call(*args, loss_agg_mode=None, num_tokens=None, num_seqs=None, norm_constant=None, **kwargs):
        legacy = (loss_agg_mode, num_tokens, num_seqs, norm_constant)
        if any(v is not None for v in legacy):
            from .losses import _as_norm

            norm = args[4] if len(args) > 4 else kwargs.pop("norm", None)
            args, kwargs["norm"] = args[:4], _as_norm(norm, *legacy)
        return fn(*args, **kwargs)

    return call


def _call_legacy(fn, norm_keywords, values, old_logprobs, logprobs, advantages, response_mask, norm="token-mean"):
    """The adapter for a loss with today's signature: the LossNorm's fields become its four keywords."""
    from .losses import LossNorm

    norm = LossNorm.of(norm)
    norms = {key: getattr(norm, _LEGACY_NORM_KEYWORDS[key]) for key in norm_keywords}
    return fn(old_logprobs, logprobs, advantages, response_mask, **norms, **values)


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")


def _check_free(table: Dict[str, Callable], what: str, name: str, override: bool) -> None:
    if name in table and not override:
        # Silent replacement of a built-in is a classic source of "why did my run change" bugs.
        raise ValueError(f"{what} '{name}' is already registered ({table[name].__qualname__}); "
                         f"pass override=True to replace it.")


def register_advantage(name: str, *, display_name: Optional[str] = None, needs_values: Optional[bool] = None,
                       needs_groups: Optional[bool] = None, needs_greedy_baseline: Optional[bool] = None,
                       one_sample_per_prompt: Optional[bool] = None, display_name_no_std: Optional[str] = None,
                       needs_turn_rewards: Optional[bool] = None, override: bool = False):
    """Decorator: register ``fn(token_level_rewards, response_mask, group_ids, **kw) -> (advantages, returns)``.

    Formula: ADVANTAGE_ESTIMATORS[name] = fn, with an AdvantageSpec of the flags (False by default,
    display_name = name); an existing name raises ValueError unless ``override=True``, and an override keeps
    the flags and names of the entry it replaces unless given (replacing "gae" still needs its critic).
    """
    _check_name("advantage estimator", name)

    def deco(fn: Callable) -> Callable:
        _check_free(ADVANTAGE_ESTIMATORS, "advantage estimator", name, override)
        given = {"needs_values": needs_values, "needs_groups": needs_groups,
                 "needs_greedy_baseline": needs_greedy_baseline, "one_sample_per_prompt": one_sample_per_prompt,
                 "needs_turn_rewards": needs_turn_rewards}
        previous = _ADVANTAGE_SPECS.get(name)
        flags = {k: (v if v is not None else bool(previous and getattr(previous, k))) for k, v in given.items()}
        ADVANTAGE_ESTIMATORS[name] = fn
        _ADVANTAGE_SPECS[name] = AdvantageSpec(
            name, fn, display_name or (previous.display_name if previous else name), **flags,
            display_name_no_std=display_name_no_std or (previous.display_name_no_std if previous else None))
        return fn

    return deco


def register_policy_loss(name: str, *, hyperparameters: Optional[Mapping[str, Any]] = None,
                         uses_old_logprobs: bool = True, override: bool = False):
    """Decorator: register ``fn(old_logprobs, logprobs, advantages, response_mask, norm, **hyper) -> (loss, metrics)``.

    Formula: POLICY_LOSSES[name] = fn; an existing name raises ValueError unless ``override=True``.
    ``hyperparameters`` (name -> default) are the keywords ``bind`` accepts; each must be a keyword parameter
    of fn with that default.  Without it fn has today's signature (``*, loss_agg_mode, num_tokens, num_seqs,
    norm_constant, <own scalars>, **unused``) and is called through an adapter that fills the four keywords
    from the LossNorm; its keyword-only scalars, read once here, are its hyper-parameters (so are those of a
    fn that takes ``norm`` but was registered without ``hyperparameters``).
    """
    _check_name("policy loss", name)

    def deco(fn: Callable) -> Callable:
        _check_free(POLICY_LOSSES, "policy loss", name, override)
        spec = _policy_loss_spec_of(name, fn, hyperparameters, uses_old_logprobs)
        if spec.legacy_norm_keywords is None:
            fn = _accepting_legacy_norm_keywords(fn)
            spec = PolicyLossSpec(name, fn, spec.hyperparameters, uses_old_logprobs)
        POLICY_LOSSES[name] = fn
        _POLICY_LOSS_SPECS[name] = spec
        return fn

    return deco


def _policy_loss_spec_of(name, fn, hyperparameters, uses_old_logprobs) -> PolicyLossSpec:
    """The spec of a new-style loss (hyperparameters given, checked against fn) or of a legacy one."""
    params = inspect.signature(fn).parameters
    if hyperparameters is None:
        own = {n: (None if p.default is p.empty else p.default) for n, p in params.items()
               if p.kind == p.KEYWORD_ONLY and n not in _LEGACY_NORM_KEYWORDS}
        if "norm" in params:  # a LossNorm-style loss without hyperparameters=: its keyword-only parameters
            return PolicyLossSpec(name, fn, MappingProxyType(own), uses_old_logprobs)
        takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
        # Clip fields named in any form (or swallowed by **kwargs) keep arriving from VerlConfig; None: the
        # function's own default unless the config sets one.
        own.update({k: own.get(k) for k in CLIP_FIELDS if takes_all or k in params})
        norm_keys = tuple(k for k in _LEGACY_NORM_KEYWORDS if takes_all or k in params)
        return PolicyLossSpec(name, fn, MappingProxyType(own), uses_old_logprobs, legacy_norm_keywords=norm_keys)
    if "norm" not in params:
        raise ValueError(f"policy loss '{name}' is registered with hyperparameters= but {fn.__qualname__} takes no "
                         f"`norm`: with hyperparameters= a loss is (old_logprobs, logprobs, advantages, response_mask, "
                         f"norm, *, <hyper-parameters>); register one with the earlier keyword signature without "
                         f"hyperparameters=.")
    for key, default in hyperparameters.items():
        p = params.get(key)
        if p is None or p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise ValueError(f"policy loss '{name}' declares hyper-parameter '{key}' but {fn.__qualname__} has no "
                             f"keyword parameter of that name.")
        if p.default is not p.empty and p.default != default:
            raise ValueError(f"policy loss '{name}': hyper-parameter '{key}' defaults to {default!r} but "
                             f"{fn.__qualname__} defaults it to {p.default!r}; make them agree.")
    return PolicyLossSpec(name, fn, MappingProxyType(dict(hyperparameters)), uses_old_logprobs)


def _lookup(table: Dict[str, Callable], what: str, decorator: str, name: str) -> Callable:
    """table[name], or a ValueError that lists the sorted valid names and how to register one."""
    if name not in table:
        valid = ", ".join(sorted(table)) or "(none)"
        raise ValueError(
            f"unknown {what} '{name}'; valid: {valid}. "
            f"Register your own with @{decorator}('{name}')."
        )
    return table[name]


def get_advantage_estimator(name: str) -> Callable:
    """Return the advantage estimator registered as ``name``; ValueError listing valid names otherwise."""
    return _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", "register_advantage", name)


def get_policy_loss(name: str) -> Callable:
    """Return the policy loss registered as ``name``; ValueError listing valid names otherwise."""
    return _lookup(POLICY_LOSSES, "policy loss", "register_policy_loss", name)


def advantage_spec(name: str) -> AdvantageSpec:
    """The AdvantageSpec of ``name``; ValueError listing valid names otherwise.

    A function put into ADVANTAGE_ESTIMATORS by hand gets a spec with every flag False.
    """
    fn = get_advantage_estimator(name)
    spec = _ADVANTAGE_SPECS.get(name)
    return spec if spec is not None and spec.fn is fn else AdvantageSpec(name, fn, name)


def policy_loss_spec(name: str) -> PolicyLossSpec:
    """The PolicyLossSpec of ``name``; ValueError listing valid names otherwise.

    A function put into POLICY_LOSSES by hand is taken to have today's (legacy) signature.
    """
    fn = get_policy_loss(name)
    spec = _POLICY_LOSS_SPECS.get(name)
    return spec if spec is not None and spec.fn is fn else _policy_loss_spec_of(name, fn, None, True)
