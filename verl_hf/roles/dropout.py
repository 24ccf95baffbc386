"""Dropout off in every role's model: samples, behaviour log-probs and the loss must come from one policy, or
the PPO ratio is noise before any update (TRL and verl turn off `nn.Dropout` modules; that is not enough).

transformers models apply dropout in three ways, and `disable_dropout(model)` zeroes all three:
- `nn.Dropout`-family modules (GPT-2's `resid_pdrop`, LoRA's `lora_dropout`, classifier heads): `p = 0`;
- functional calls whose rate a module cached from its config when it was built (`self.attention_dropout`
  in Llama, `self.residual_dropout` in Seed-OSS): every numeric attribute of every module whose name says it
  is a dropout rate (`RATE_NAME`: dropout, pdrop, drop_prob, drop_path, layerdrop, and MoE router jitter);
- functional calls that read the config at every forward (Falcon, GPT-J, GPT-Neo, Persimmon): the same
  names on every config the model's modules hold (sub-configs included).
A rate that cannot be set (a read-only property, a value of another kind) is an error that names it.

Configs are shared with saving: their original rates are kept here and written back into every saved
config (`original_rates_restored`), so a checkpoint says what the model was built with, not what RL ran.

See it work: tests/test_dropout.py.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import numbers
import re
import weakref

import torch

logger = logging.getLogger(__name__)

RATE_NAME = re.compile(r"dropout|pdrop|drop_prob|drop_path|droppath|layerdrop|jitter", re.IGNORECASE)

# id(config) -> (weak reference to it, {attribute: original value}), for the configs disable_dropout changed.
_ORIGINAL_RATES: dict[int, tuple[weakref.ref, dict]] = {}


def disable_dropout(model) -> list[str]:
    """Zero every dropout rate `model` applies (see the module docstring); returns what it changed, as
    'where.name=old'. Raises ValueError naming any rate that stays non-zero."""
    if model is None:
        return []
    changed, refused = [], []
    root = type(model).__name__  # names below are attribute paths from the model, e.g. model.layers.0.mlp
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p:
            changed.append(f"{path or root}.p={module.p}")
            module.p = 0.0
        _zero_rates(module, path or root, changed, refused)
    for path, config in _configs(model):
        _remember(config, _zero_rates(config, path, changed, refused))
    if refused:
        raise ValueError(
            f"dropout cannot be turned off in this {type(model).__name__}: {', '.join(refused)}. Samples, behaviour "
            f"log-probs and the loss would each see a different random policy (the PPO ratio would be noise). "
            f"Load the model with these rates at 0 (e.g. from_pretrained(path, attention_dropout=0.0)) or make "
            f"them settable.")
    if changed:
        logger.info("Dropout off for RL (%d rates): %s", len(changed), ", ".join(changed[:8]) +
                    (", ..." if len(changed) > 8 else ""))
    return changed


def _zero_rates(owner, path: str, changed: list[str], refused: list[str]) -> dict:
    """Set each non-zero rate attribute of `owner` (instance attributes and properties of its class) to 0;
    returns {name: old value} of those set, appends to `changed` and `refused`."""
    before = {}
    for name in _rate_names(owner):
        try:
            value = getattr(owner, name)
        except Exception:  # noqa: BLE001 - a property that cannot be read here is not a rate we can judge
            continue
        zero = _zero_like(value)
        if zero is None or value == zero:
            continue
        try:
            setattr(owner, name, zero)
            settled = getattr(owner, name) == zero
        except Exception as e:  # noqa: BLE001 - read-only properties, strict config fields: reported below
            settled, why = False, f"{type(e).__name__}: {e}"
        else:
            why = "setting it had no effect"
        if settled:
            before[name] = value
            changed.append(f"{path}.{name}={value}")
        else:
            refused.append(f"{path}.{name}={value} ({why})")
    return before


def _rate_names(owner) -> list[str]:
    own = [name for name in vars(owner) if RATE_NAME.search(name) and not name.startswith("_")]
    return list(dict.fromkeys(own + _rate_properties(type(owner))))


@functools.cache
def _rate_properties(cls) -> list[str]:
    return [name for klass in cls.__mro__ for name, value in vars(klass).items()
            if isinstance(value, property) and RATE_NAME.search(name)]


def _remember(config, before: dict) -> None:
    """Keep the first-seen original of each rate zeroed on `config` (a later call finds zeros)."""
    if not before:
        return
    entry = _ORIGINAL_RATES.get(id(config))
    if entry is None or entry[0]() is not config:  # new, or an id reused after the old config was freed
        entry = _ORIGINAL_RATES[id(config)] = (weakref.ref(config), {})
    for name, value in before.items():
        entry[1].setdefault(name, value)


def _zero_like(value):
    """The zero of a rate's kind (a number, or a list/tuple of numbers); None for anything else (modules,
    flags, names, None)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, numbers.Real):
        return type(value)(0)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                                                        for v in value):
        return type(value)(type(v)(0) for v in value)
    return None


def _configs(model):
    """(path, config) of every distinct transformers config the model's modules hold, sub-configs included."""
    from transformers import PretrainedConfig

    seen, found = set(), []

    def visit(config, path):
        if id(config) in seen:
            return
        seen.add(id(config))
        found.append((path, config))
        for key, value in vars(config).items():
            if isinstance(value, PretrainedConfig):
                visit(value, f"{path}.{key}")

    for module_path, module in model.named_modules():
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig):
            visit(config, f"{module_path or type(model).__name__}.config")
    return found


@contextlib.contextmanager
def original_rates_restored(model):
    """Inside: the configs of `model` hold their original dropout rates again (for saving); zero after."""
    restored = []
    for _, config in _configs(model) if model is not None else []:
        ref, rates = _ORIGINAL_RATES.get(id(config), (None, None))
        if ref is not None and ref() is config:
            restored.append((config, {name: getattr(config, name) for name in rates}))
            for name, value in rates.items():
                setattr(config, name, value)
    try:
        yield
    finally:
        for config, values in restored:
            for name, value in values.items():
                setattr(config, name, value)
