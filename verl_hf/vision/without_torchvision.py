"""Qwen2-VL-family processors on machines without torchvision (e.g. CPU torch builds with no matching torchvision).

Transformers 5 needs torchvision for two parts of the Qwen2-VL family's processing, neither of which an image
prompt uses:
- the video processor, which `Qwen2VLProcessor.from_pretrained` always loads: `ImageOnlyQwen2VLProcessor` is
  the same processor without it (it renders, expands and processes images exactly as `Qwen2VLProcessor`);
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

TORCHVISION_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2-VL's processor (also Qwen2.5-VL's: the same tokens and image processing) without the video processor."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super(Qwen2VLProcessor, self).__init__(image_processor, tokenizer, chat_template=chat_template)
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)

    def to_dict(self):
        """Saved as `Qwen2VLProcessor`: where torchvision is installed, AutoProcessor loads it whole."""
        return {**super().to_dict(), "processor_class": "Qwen2VLProcessor"}


QWEN2_VL_FAMILY = ("qwen2_vl", "qwen2_5_vl")


def load_processor(path: str, model_type: str | None):
    """The processor saved at `path` (AutoProcessor); without torchvision, for the Qwen2-VL family, the same one
    without its video processor."""
    from transformers import AutoProcessor

    if model_type in QWEN2_VL_FAMILY and not has_torchvision():
        return ImageOnlyQwen2VLProcessor.from_pretrained(path)
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
