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


def datasets_with_images(datasets: dict, column: str) -> list[str]:
    """The names of the datasets (name -> dataset or None) whose `column` holds images."""
    return [name for name, ds in datasets.items() if ds is not None and has_images(ds, column)]


def check_vision_inputs(model, processor, args, with_images: list[str], multi_turn: bool, teacher: bool) -> bool:
    """True when a dataset has images (`with_images`: their names), or when a multi-turn run (`multi_turn`) has a
    vision-language processor and policy (its environments and tools may answer with images). Refuses, before
    any model loads, what would give a model images it cannot see or lose them on the way: image rows without a
    processor or with a text-only model, and the setups that do not carry images yet. A processor with
    single-turn text rows trains as text."""
    column = args.image_column
    if not with_images and not (multi_turn and processor is not None):
        return False
    if processor is None:
        raise ValueError(f"the {with_images[0]} dataset has images (column {column!r}) but processing_class is a "
                         f"tokenizer: pass the model's processor, processing_class=AutoProcessor.from_pretrained"
                         f"(...), or drop the column (a text model cannot see images).")
    config = policy_config(model)
    if not with_images:
        if config is not None and not has_vision(config):
            return False  # a text model: an environment's image is refused when it comes (agent/loop.py)
        source = "multi-turn rollouts with a vision-language processor (environments and tools may answer with images)"
    elif config is not None and not has_vision(config):
        raise ValueError(f"the {with_images[0]} dataset has images but the policy ({type(config).__name__}) is a "
                         f"text-only model with no vision encoder: pass a vision-language model (e.g. Qwen2-VL, "
                         f"Qwen2.5-VL), or drop the column {column!r}.")
    else:
        source = f"the {with_images[0]} dataset has images (column {column!r})"
    not_yet = [
        (args.rollout_engine in ("vllm", "vllm_server") and not vllm_takes_images(config),
         f"rollout_engine={args.rollout_engine!r} with a {getattr(config, 'model_type', None)} model (vLLM takes "
         f"image prompts here for the Qwen2-VL family)", "set rollout_engine='hf'"),
        (teacher or bool(args.teacher_model_path), "a distillation teacher", "train without teacher="),
        (args.gkd_lambda < 1.0, f"gkd_lambda={args.gkd_lambda} (the dataset's answers)", "set gkd_lambda=1.0"),
        (advantage_needs_values(args), f"adv_estimator={args.adv_estimator!r} or Safe-RLHF costs (a critic, which "
                                       f"reads text only)", "use a critic-free estimator such as 'grpo'"),
        (args.training_is_sharded, "DeepSpeed ZeRO-3 / FSDP (a process whose rows have no image would skip the "
                                   "vision tower's collectives)", "train on one process or with DDP"),
        (args.world_size > 1 and not args.freeze_vision_tower, "several processes with freeze_vision_tower=False "
                                                               "(DDP would find the tower unused on text rows)",
         "keep freeze_vision_tower=True"),
    ]
    for applies, what, fix in not_yet:
        if applies:
            text_run = "" if with_images else (" (or pass processing_class=processor.tokenizer for a text run, whose "
                                               "environments answer in text)")
            raise ValueError(f"{source}, which {what} does not carry yet: {fix}{text_run}.")
    return True


def vllm_takes_images(config) -> bool:
    from ..rollout.vllm_vision import IMAGE_MODEL_TYPES

    return config is None or getattr(config, "model_type", None) in IMAGE_MODEL_TYPES


def advantage_needs_values(args) -> bool:
    from ..algorithms import advantage_spec

    return advantage_spec(args.adv_estimator).needs_values or args.safe_rl


def has_images(dataset, column: str, rows: int = 64) -> bool:
    """True when `column` holds an image in one of the first `rows` rows (a dict: in any of its datasets; a
    streaming dataset: when it has the column)."""
    if isinstance(dataset, dict):
        return any(has_images(ds, column, rows) for ds in dataset.values())
    if column not in (getattr(dataset, "column_names", None) or []):
        return False
    if not hasattr(dataset, "select"):
        return True
    head = dataset.select(range(min(rows, len(dataset))))
    return any(value not in (None, [], "", b"") for value in head[column])


def model_class_for(config, vision: bool):
    """The transformers auto class that loads this config's model with its LM head: the image-text-to-text one
    for a vision-language run (or a model the causal-LM class does not know), else the causal-LM one (also for
    checkpoints such as Gemma-3 4B trained here on text only)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    known = getattr(config, "model_type", None) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return AutoModelForImageTextToText if has_vision(config) and (vision or not known) else AutoModelForCausalLM


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


def load_processor(processing_class, model, with_images: bool):
    """A vision-language run's processor: the one given as processing_class, or, given none, the policy's own
    (`AutoProcessor` from its path) when a dataset has images; None for a tokenizer given or a text run."""
    if processing_class is not None:
        return processing_class if is_processor(processing_class) else None
    if not with_images:
        return None
    try:
        config = policy_config(model)
    except (OSError, ValueError):  # no config to read: loading the policy says why, after the cheaper checks
        return None
    path = model if isinstance(model, str) else getattr(config, "_name_or_path", None)
    if config is None or not has_vision(config) or not path:
        return None
    from .without_torchvision import load_processor as load_saved_processor

    return load_saved_processor(path, getattr(config, "model_type", None))


def share_chat_template(processor, tokenizer) -> None:
    """The processor renders image prompts with the template the run set on its tokenizer (chat_template,
    chat_template_kwargs), the processor's own where the tokenizer has none."""
    if getattr(tokenizer, "chat_template", None) is None:
        tokenizer.chat_template = processor.chat_template
    processor.chat_template = tokenizer.chat_template
