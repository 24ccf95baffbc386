"""VerlTrainer's vision-language setup: the processor told from a tokenizer, the inputs refused before any model
loads where images cannot reach the model, the model class to load, and the vision tower frozen.

See it work: tests/test_vision_trainer.py.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# Where vision-language models keep their vision encoder (Qwen2/2.5/3-VL: `visual`, with its patch merger;
# Gemma-3, LLaVA: `vision_tower`; Idefics3/SmolVLM: `vision_model`).
VISION_TOWERS = ("visual", "vision_tower", "vision_model")


def is_processor(processing_class) -> bool:
    """True for a multimodal processor (it holds an image processor and a tokenizer)."""
    return hasattr(processing_class, "image_processor") and hasattr(processing_class, "tokenizer")


def has_vision(config) -> bool:
    """True for a vision-language model's config (it has a vision encoder's)."""
    return getattr(config, "vision_config", None) is not None


def policy_config(model):
    """The policy's config, from the object or read from its id/path (no weights load)."""
    if isinstance(model, str):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model)
    return getattr(getattr(model, "get_base_model", lambda: model)(), "config", None)


def check_vision_inputs(model, processor, args, datasets: dict, multi_turn: bool) -> None:
    """Refuse, before any model loads, what would give a model images it cannot see or lose them on the way:
    image rows without a processor, a processor for a text-only model, and the setups that do not carry
    images yet (vLLM engines, multi-turn rollouts)."""
    column = args.image_column
    with_images = [name for name, ds in datasets.items() if ds is not None and _has_images(ds, column)]
    if processor is None:
        if with_images:
            raise ValueError(f"the {with_images[0]} dataset has images (column {column!r}) but processing_class is a "
                             f"tokenizer: pass the model's processor, processing_class=AutoProcessor.from_pretrained"
                             f"(...), or drop the column (a text model cannot see images).")
        return
    config = policy_config(model)
    if config is not None and not has_vision(config):
        raise ValueError(f"processing_class is a processor for images ({type(processor).__name__}) but the policy "
                         f"({type(config).__name__}) is a text-only model with no vision encoder: pass a "
                         f"vision-language model (e.g. Qwen2-VL, Qwen2.5-VL, Gemma-3), or its tokenizer.")
    if args.rollout_engine != "hf":
        raise ValueError(f"rollout_engine={args.rollout_engine!r} does not take images yet; use rollout_engine='hf' "
                         f"for a vision-language policy.")
    if multi_turn:
        raise ValueError("multi-turn rollouts (tools= / environment=) do not carry images yet; train the "
                         "vision-language policy on single-turn prompts.")


def _has_images(dataset, column: str) -> bool:
    if isinstance(dataset, dict):
        return any(_has_images(ds, column) for ds in dataset.values())
    return column in getattr(dataset, "column_names", [])


def vision_model_class(config):
    """The transformers auto class that loads this config's model with its LM head."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if has_vision(config) else AutoModelForCausalLM


def freeze_vision_tower(model) -> int:
    """Stop gradients into the vision encoder (the modules named VISION_TOWERS); returns how many parameters
    were frozen (0: the model has none of them)."""
    frozen = 0
    for name, module in model.named_modules():
        if name.split(".")[-1] in VISION_TOWERS:
            for param in module.parameters():
                frozen += param.numel() if param.requires_grad else 0
                param.requires_grad_(False)
    if frozen:
        logger.info("freeze_vision_tower: %d parameters of the vision encoder frozen", frozen)
    return frozen


def load_processor(processing_class, model):
    """A vision-language policy's processor: the one given as processing_class, or, given none, the policy's own
    (`AutoProcessor` from its path); None for a tokenizer given or a text-only policy."""
    if processing_class is not None:
        return processing_class if is_processor(processing_class) else None
    try:
        config = policy_config(model)
    except (OSError, ValueError):  # no config to read: loading the policy says why, after the cheaper checks
        return None
    path = model if isinstance(model, str) else getattr(config, "_name_or_path", None)
    if config is None or not has_vision(config) or not path:
        return None
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path)
