"""Dropout off in every role's model: samples, behaviour log-probs and the loss must come from one policy, or
the PPO ratio is noise before any update (TRL and verl turn off `nn.Dropout` modules; that is not enough).

transformers models apply dropout in three ways, and `disable_dropout(model)` zeroes all three:
- `nn.Dropout`-family modules (GPT-2's `resid_pdrop`, LoRA's `lora_dropout`, classifier heads): `p = 0`;
- functional calls whose rate a module cached from its config when it was built (`self.attention_dropout`
  in Llama, `self.residual_dropout` in Seed-OSS): every numeric attribute of every module whose name says it
  is a rate of training-only randomness (`RATE_NAME`: dropout, pdrop, drop_prob/rate/path/connect, layerdrop;
  `TRAINING_NOISE`: MoE input jitter);
- functional calls that read the config at every forward (Falcon, GPT-J, GPT-Neo, Persimmon): the same
  names on every config the model's modules hold (sub-configs included).
Names that look like rates but change the model in eval mode too are left alone (`NOT_RATES`: PhiMoE's
`router_jitter_noise` is its router's fixed cutoff, and vLLM uses the same one). Training-mode randomness
that no rate turns off (`RANDOM_IN_TRAINING`: PhiMoE's router samples its experts) is refused. So is a rate
that cannot be set (a read-only property), by name; a role that only runs in eval mode (reference, reward
model) warns instead. Rates under other names, or held in tensors or closures, are not found.

The model's configs are changed in memory (modules like Falcon's read them at forward). Their original rates
are kept here and written back into the configs that verl_hf saves (VerlTrainer's checkpoints and final
model, the critic's checkpoints, `Role.save_pretrained`/`push_to_hub`, the merged LoRA model): wrap your own
`model.save_pretrained` in `original_rates_restored(model)` for the same. A deep copy of a model taken after
this (the KL reference) holds zeros only.

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

RATE_NAME = re.compile(r"dropout|pdrop|drop_(prob|rate|path|connect)|droppath|layer_?drop", re.IGNORECASE)
# Multiplicative input noise of MoE routers, applied only in training (Mixtral and Switch `jitter_noise`, PhiMoE
# `input_jitter_noise`, DBRX `moe_jitter_eps`; vision towers' `pos_embed_jitter`).
TRAINING_NOISE = frozenset({"jitter_noise", "input_jitter_noise", "moe_jitter_eps", "pos_embed_jitter"})
# Names that match but act in eval mode too: zeroing them would change the model (PhiMoE's sparsemixer cutoff;
# NLLB-MoE rescales by 1 - moe_token_dropout at inference).
NOT_RATES = frozenset({"router_jitter_noise", "moe_token_dropout"})
# Module classes whose training-mode forward samples at random with no rate to turn off: class name -> why.
RANDOM_IN_TRAINING = {
    "PhimoeTopKRouter": "PhiMoE's router (sparsemixer) samples its experts at random in training mode",
}

# id(config) -> (weak reference to it, {attribute: original value}), for the configs disable_dropout changed.
_ORIGINAL_RATES: dict[int, tuple[weakref.ref, dict]] = {}


def disable_dropout(model, strict: bool = True) -> list[str]:
    """Zero every dropout rate `model` applies (see the module docstring); returns what it changed, as
    'where.name=old'. What stays random in training mode raises ValueError naming it (`strict=False`, for roles
    that only run in eval mode: a warning)."""
    if model is None:
        return []
    changed, refused = [], []
    root = type(model).__name__  # names below are attribute paths from the model, e.g. model.layers.0.mlp
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p:
            changed.append(f"{path or root}.p={module.p}")
            module.p = 0.0
        if type(module).__name__ in RANDOM_IN_TRAINING:
            refused.append(f"{path or root} ({RANDOM_IN_TRAINING[type(module).__name__]})")
        _zero_rates(module, path or root, changed, refused)
    for path, config in _configs(model):
        _remember(config, _zero_rates(config, path, changed, refused))
    if refused:
        message = (f"training-mode randomness cannot be turned off in this {root}: {', '.join(refused)}. Samples, "
                   f"behaviour log-probs and the loss would each see a different random policy (the PPO ratio "
                   f"would be noise). Load the model with these rates at 0 (e.g. from_pretrained(path, "
                   f"attention_dropout=0.0)) or make them settable.")
        if strict:
            raise ValueError(message)
        logger.warning("%s (This role only runs in eval mode, where it does not matter.)", message)
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


def is_rate_name(name: str) -> bool:
    """True for an attribute name that holds a rate of training-only randomness (see the module docstring)."""
    return not name.startswith("_") and name not in NOT_RATES and (name in TRAINING_NOISE or bool(RATE_NAME.search(name)))


def _rate_names(owner) -> list[str]:
    own = [name for name in vars(owner) if is_rate_name(name)]
    return list(dict.fromkeys(own + _rate_properties(type(owner))))


@functools.cache
def _rate_properties(cls) -> list[str]:
    return [name for klass in cls.__mro__ for name, value in vars(klass).items()
            if isinstance(value, property) and is_rate_name(name)]


def _remember(config, before: dict) -> None:
    """Keep the original of each rate just zeroed on `config`. A rate found non-zero on a later call was set
    again since (by the user), so that value is the one to save."""
    if not before:
        return
    entry = _ORIGINAL_RATES.get(id(config))
    if entry is None or entry[0]() is not config:  # new, or an id reused after the old config was freed
        entry = _ORIGINAL_RATES[id(config)] = (weakref.ref(config), {})
        weakref.finalize(config, _ORIGINAL_RATES.pop, id(config), None)
    entry[1].update(before)


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
