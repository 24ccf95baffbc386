"""vLLM with image prompts: the engine processes every image as the trainer's processor does, and each prompt goes
with its images.

- Files: the engine's model directory holds the policy's config and the trainer's own processor (its tokenizer,
  and its image processor with the run's min/max pixels), so vLLM resizes and patches each image, and expands
  its placeholder, exactly as the trainer's forward will see it.
- Settings: `mm_device_do_normalize=False`. vLLM otherwise normalises pixels on the device with constants it
  keeps as buffers, which `load_format="dummy"` fills with random values and no weight reload ever sets
  (measured on a tiny Qwen2-VL: 0.55 nats off the trainer's log-probs; with host-side normalisation, 5e-7).
- Prompts: each image's placeholders collapsed back to one (vLLM expands them itself, and would expand the
  trainer's already-expanded ids again, silently), the row's PIL images beside them; the expanded ids vLLM
  returns are checked against the trainer's, so a processor that resizes otherwise (another min_pixels or
  max_pixels) is an error. (That check sees token counts, not pixel values: a processor that resizes to the same
  grid with another resampling would pass it; give the engine the trainer's own processor.)
- Without torchvision (CPU torch builds): our vLLM plugin registers the Qwen2-VL family again, under its own
  names, with `ImageOnlyQwen2VLProcessor` as its processor (vision/without_torchvision.py); vLLM's own classes do
  the rest. (Without it vLLM cannot even import its Qwen2-VL model code there.)

After every weight sync the engine also drops its encoder cache (image embeddings of the old tower).

See it work: tests/test_vision_vllm.py.
"""

from __future__ import annotations

import base64
import copy
import importlib
import io
import warnings

from ..vision.inputs import collapse_placeholders
from ..vision.without_torchvision import (QWEN2_VL_FAMILY, ImageOnlyQwen2VLProcessor,
                                           allow_qwen2_vl_without_torchvision, has_torchvision)
from .vllm_version import guarded_plugin

# The HF architectures whose image prompts vLLM takes here: (vLLM module, the prefix of its processing classes).
IMAGE_ARCHITECTURES = {
    "Qwen2VLForConditionalGeneration": ("vllm.model_executor.models.qwen2_vl", "Qwen2VL"),
    "Qwen2_5_VLForConditionalGeneration": ("vllm.model_executor.models.qwen2_5_vl", "Qwen2_5_VL"),
}


IMAGE_MODEL_TYPES = QWEN2_VL_FAMILY  # their configs' model_type


def check_image_architecture(architecture: str) -> None:
    if architecture not in IMAGE_ARCHITECTURES:
        raise ValueError(f"image prompts on vLLM are supported for {sorted(IMAGE_ARCHITECTURES)}, not "
                         f"{architecture}; use rollout_engine='hf' for this model's image prompts.")


def write_engine_files(config, processor, architecture: str, directory: str) -> None:
    """The engine's model directory: the policy's config, naming the architecture vLLM should build, and the
    trainer's processor."""
    check_image_architecture(architecture)
    vllm_plugin()  # also where the plugin's entry point is not installed (a source checkout on the path)
    config = copy.deepcopy(config)  # the policy's own config is left as it was
    config.architectures = [architecture]
    config.save_pretrained(directory)
    processor.save_pretrained(directory)


def image_settings(max_images_per_prompt: int) -> dict:
    """vLLM's settings for image prompts (see the module's docstring)."""
    return dict(skip_tokenizer_init=False, mm_device_do_normalize=False,
                limit_mm_per_prompt={"image": max_images_per_prompt})


def image_prompt(ids: list[int], images, image_token_id: int):
    """vLLM's prompt for one row: its ids with each image's placeholders collapsed to one, and its PIL images
    (None for a row without images)."""
    from vllm.inputs import TokensPrompt

    if images is None:
        return TokensPrompt(prompt_token_ids=ids)
    return TokensPrompt(prompt_token_ids=collapse_placeholders(ids, image_token_id),
                        multi_modal_data={"image": list(images)})


def check_image_count(images: list, limit: int) -> None:
    """Before any request: no prompt has more images than the engine was built to take."""
    for row, row_images in enumerate(images):
        if row_images is not None and len(row_images) > limit:
            raise ValueError(f"prompt {row} has {len(row_images)} images; this vLLM engine takes at most {limit} per "
                             f"prompt: build it with VLLMEngine(..., max_images_per_prompt={len(row_images)}).")


def image_request(ids: list[int], images, image_token_id: int) -> dict:
    """The fields of a server request (the token route, `/inference/v1/generate`) that give one row its PIL images:
    its ids with each image's placeholders collapsed to one, and the images as base64 PNG data URLs."""
    return {"token_ids": collapse_placeholders(ids, image_token_id), "return_token_ids": True,  # to check_expanded
            "content_parts": [{"type": "image_url", "url": png_data_url(image)} for image in images]}


def png_data_url(image) -> str:
    """A PIL image as a lossless data URL: the server decodes the very pixels the trainer's processor saw."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def check_expanded(ours: list[int], vllm_ids: list[int], row: int | None) -> None:
    """The expanded prompt vLLM sampled from must be the trainer's: the same image tokens in the same places."""
    if list(vllm_ids) != list(ours):
        which = "an image prompt" if row is None else f"prompt {row}"
        raise RuntimeError(f"{which}: vLLM expanded its images to {len(vllm_ids)} prompt tokens, the trainer's "
                           f"processor to {len(ours)}; vLLM must process images as the trainer does (the same "
                           f"processor, min_pixels and max_pixels: a server serves the processor saved with its "
                           f"model).")


@guarded_plugin
def vllm_plugin() -> None:
    """vLLM's general plugin (setup.cfg), run in each of its processes (a server's too): without torchvision, the
    Qwen2-VL family is registered again, under its own names, with processors that have no video part. With
    torchvision: nothing. Idempotent."""
    global _REGISTERED
    if _REGISTERED or has_torchvision():
        return
    try:
        allow_qwen2_vl_without_torchvision()
        from vllm import ModelRegistry

        for architecture in IMAGE_ARCHITECTURES:
            ModelRegistry.register_model(architecture, _image_only_model(architecture))
    except Exception as error:  # noqa: BLE001 - vLLM runs its plugins unguarded: text runs must still start
        warnings.warn(f"verl_hf could not register the Qwen2-VL family's image-only processor with vLLM ({error!r}); "
                      f"image prompts on vLLM need torchvision here.", stacklevel=2)
        return
    _REGISTERED = True


_REGISTERED = False


def _image_only_model(architecture: str):
    """vLLM's model class for `architecture`, registered with a processing info whose processor has no video part."""
    from vllm.multimodal import MULTIMODAL_REGISTRY

    module_name, prefix = IMAGE_ARCHITECTURES[architecture]
    module = importlib.import_module(module_name)
    info = getattr(module, f"{prefix}ProcessingInfo")

    class ImageOnlyInfo(info):
        def get_hf_processor(self, **kwargs):
            return self.ctx.get_hf_processor(ImageOnlyQwen2VLProcessor, **kwargs)

        def get_supported_mm_limits(self):
            return {"image": None}

    register = MULTIMODAL_REGISTRY.register_processor(getattr(module, f"{prefix}MultiModalProcessor"),
                                                      info=ImageOnlyInfo,
                                                      dummy_inputs=getattr(module, f"{prefix}DummyInputsBuilder"))
    return register(type(architecture, (getattr(module, architecture),), {"__doc__": "Image prompts only."}))
