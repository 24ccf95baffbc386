"""Name -> function registries for advantage estimators and policy losses.

Built-ins register themselves on import of ``verl_hf.algorithms``; users add
their own with ``@register_advantage("name")`` / ``@register_policy_loss("name")``
and then select them by name from a config string.

See it work: tests/test_algorithms.py
"""

from typing import Callable, Dict

ADVANTAGE_ESTIMATORS: Dict[str, Callable] = {}
POLICY_LOSSES: Dict[str, Callable] = {}


def _register(table: Dict[str, Callable], what: str, name: str, override: bool):
    """Decorator factory shared by both registries; returns the function unchanged."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string, got {name!r}")

    def deco(fn: Callable) -> Callable:
        if name in table and not override:
            # Silent replacement of a built-in is a classic source of "why did my run change" bugs.
            raise ValueError(
                f"{what} '{name}' is already registered ({table[name].__qualname__}); "
                f"pass override=True to replace it."
            )
        table[name] = fn
        return fn

    return deco


def register_advantage(name: str, *, override: bool = False):
    """Decorator: register ``fn(token_level_rewards, response_mask, group_ids, **kw) -> (advantages, returns)``.

    Formula: ADVANTAGE_ESTIMATORS[name] = fn; an existing name raises ValueError unless ``override=True``.
    """
    return _register(ADVANTAGE_ESTIMATORS, "advantage estimator", name, override)


def register_policy_loss(name: str, *, override: bool = False):
    """Decorator: register ``fn(old_logprobs, logprobs, advantages, response_mask, **kw) -> (loss, metrics)``.

    Formula: POLICY_LOSSES[name] = fn; an existing name raises ValueError unless ``override=True``.
    """
    return _register(POLICY_LOSSES, "policy loss", name, override)


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
