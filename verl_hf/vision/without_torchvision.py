"""Qwen2-VL- and Qwen3-VL-family processors on machines without torchvision (e.g. CPU torch builds without a
matching torchvision).

Transformers 5 needs torchvision for two parts of the Qwen2-VL family's processing, neither of which an image
prompt uses:
- the video processor, which `Qwen2VLProcessor.from_pretrained` always loads: `ImageOnlyQwen2VLProcessor` is
  the same processor without it (it renders, expands and processes images exactly as `Qwen2VLProcessor`), and
  `ImageOnlyQwen3VLProcessor` for Qwen3-VL (HF generate only: vLLM's Qwen3-VL is not registered here);
- the module `image_processing_qwen2_vl`, which vLLM's Qwen2-VL model code imports for `smart_resize`:
  `allow_qwen2_vl_without_torchvision` puts the PIL module (the same `smart_resize`) under its name, which is
  what transformers' own lazy import already falls back to for `Qwen2VLImageProcessor` without torchvision.

Where torchvision is installed nothing here is used.

See it work: tests/test_vision_vllm.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from transformers.models.qwen2_vl import Qwen2VLProcessor
from transformers.models.qwen3_vl import Qwen3VLProcessor

TORCHVISION_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def _vision_tokens(processor, tokenizer) -> None:
    """The family's image, video and (Qwen3-VL) vision start/end tokens and their ids, as its processor sets them."""
    for name, token in [("image", "<|image_pad|>"), ("video", "<|video_pad|>"), ("vision_start", "<|vision_start|>"),
                        ("vision_end", "<|vision_end|>")]:
        setattr(processor, f"{name}_token", token)
        setattr(processor, f"{name}_token_id", tokenizer.convert_tokens_to_ids(token))


class _WithoutVideo:
    """A family's processor without its video processor: `family` is the processor it stands for (whose own
    __init__ would load the video processor), and the name it is saved under, so that where torchvision is
    installed AutoProcessor loads it whole."""

    family: type

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super(self.family, self).__init__(image_processor, tokenizer, chat_template=chat_template)
        _vision_tokens(self, tokenizer)

    def to_dict(self):
        return {**super().to_dict(), "processor_class": self.family.__name__}


class ImageOnlyQwen2VLProcessor(_WithoutVideo, Qwen2VLProcessor):
    """Qwen2-VL's processor (also Qwen2.5-VL's: the same tokens and image processing) without the video processor."""

    family = Qwen2VLProcessor


class ImageOnlyQwen3VLProcessor(_WithoutVideo, Qwen3VLProcessor):
    """Qwen3-VL's processor (also Qwen3-VL-MoE's: 16-pixel patches, the same tokens) without the video processor."""

    family = Qwen3VLProcessor


QWEN2_VL_FAMILY = ("qwen2_vl", "qwen2_5_vl")
QWEN3_VL_FAMILY = ("qwen3_vl", "qwen3_vl_moe")


def load_processor(path: str, model_type: str | None):
    """The processor saved at `path` (AutoProcessor); without torchvision, for the Qwen2-VL family, the same one
    without its video processor."""
    from transformers import AutoProcessor

    if model_type in QWEN2_VL_FAMILY and not has_torchvision():
        return ImageOnlyQwen2VLProcessor.from_pretrained(path)
    if model_type in QWEN3_VL_FAMILY and not has_torchvision():
        return ImageOnlyQwen3VLProcessor.from_pretrained(path)
    return AutoProcessor.from_pretrained(path)


def allow_qwen2_vl_without_torchvision() -> None:
    """Let modules that import `image_processing_qwen2_vl` (vLLM's Qwen2-VL family) load without torchvision: the
    PIL module, with `Qwen2VLImageProcessor` naming its PIL class, stands in for it. A no-op with torchvision."""
    if has_torchvision() or TORCHVISION_MODULE in sys.modules:
        return
    pil = importlib.import_module(PIL_MODULE)
    stand_in = types.ModuleType(TORCHVISION_MODULE, "The PIL Qwen2-VL image processing (torchvision is missing).")
    stand_in.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
    stand_in.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
    sys.modules[TORCHVISION_MODULE] = stand_in
