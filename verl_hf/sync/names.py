"""Layer 1 of the weight sync: training names -> the rollout engine's (plain HF) names.

Training wraps models in layers that rename parameters: DDP and DeepSpeed (`module.`), `torch.compile`
(`_orig_mod.`), FSDP (`_fsdp_wrapped_module.`), activation checkpointing (`_checkpoint_wrapped_module.`),
PEFT (`base_model.model.`, `.base_layer.`, `.modules_to_save.<adapter>.`). The engine knows the checkpoint's
own names, so every one of those is removed. (vLLM also gets the checkpoint's layout: rollout/vllm_compat.py,
`checkpoint_form`.)

See it work: tests/test_sync.py.
"""

from __future__ import annotations

import re

LEADING = ("module.", "_orig_mod.", "base_model.model.")
INNER = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "base_layer.")
MODULES_TO_SAVE = re.compile(r"modules_to_save\.[^.]+\.")


def engine_name(name: str) -> str:
    """The engine's name for a training parameter name, e.g.
    'module.base_model.model.model.layers.0.q_proj.base_layer.weight' -> 'model.layers.0.q_proj.weight'."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in LEADING:
            if name.startswith(prefix):
                name, stripped = name[len(prefix):], True
    for inner in INNER:
        name = name.replace(inner, "")
    return MODULES_TO_SAVE.sub("", name)


def check_names(pushed: list[str], engine_names: set[str]) -> None:
    """Fail before the first push when the two sides do not match, naming the first offenders."""
    unknown = [n for n in pushed if n not in engine_names]
    if unknown:
        sample = sorted(engine_names)[:3]
        raise ValueError(f"the rollout engine has no weight named {unknown[0]!r} ({len(unknown)} of {len(pushed)} "
                         f"training weights unmatched; the engine's names look like {sample}). Is the engine built "
                         f"from the same architecture as the policy?")
    missing = sorted(engine_names - set(pushed))
    if missing:
        raise ValueError(f"the sync never sets the engine weight {missing[0]!r} ({len(missing)} engine weights "
                         f"without a training counterpart): the engine would sample from stale values.")
