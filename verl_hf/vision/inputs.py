"""Pixel inputs that travel with their rows: each row keeps its own, and a micro-batch joins its rows' in order.

A processor packs a batch's pixels in ways that differ by family: Qwen2-VL flattens every image of every row
into one (patches, features) tensor that only the grids (`image_grid_thw`) can cut again, Gemma-3 stacks one
(C, H, W) per image. Cutting such a tensor by a micro-batch's row indices is the bug TRL #6274 reports (pixels
of the wrong rows, or of the wrong turn). So nothing here is ever indexed by row: the processor runs once per
row, its pixel tensors stay with that row (`RowPixels`, a list entry of `RolloutBatch`), and a micro-batch
concatenates its rows' tensors in row order, which is the order the model reads the image tokens in.

See it work: tests/test_vision_inputs.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# What a processor returns beside the pixels: per-token tensors the trainer rebuilds from the ids itself.
TOKEN_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")


@dataclass(frozen=True)
class RowPixels:
    """One row's pixel inputs as its processor made them; every tensor's dim 0 runs over the row's images, or
    over their patches, in the order their placeholders appear in the row's tokens:
    - Qwen2-VL / Qwen2.5-VL: pixel_values (P, F), the patches of all the row's images, and image_grid_thw
      (I, 3), each image's (t, h, w) patch grid, P = sum of t*h*w;
    - Gemma-3: pixel_values (I, C, H, W).
    `num_images` = I. `images`: the row's RGB PIL images themselves, in the same order, for engines that process
    images on their own (vLLM)."""

    tensors: dict[str, torch.Tensor]
    num_images: int
    images: tuple = ()

    def to(self, device) -> "RowPixels":
        return RowPixels({k: v.to(device) for k, v in self.tensors.items()}, self.num_images, self.images)

    def __getstate__(self) -> dict:
        """Pickled (a checkpoint's round in progress) without the PIL images: only sampling reads them, and a
        saved round resumes with its updates."""
        return {"tensors": self.tensors, "num_images": self.num_images, "images": ()}


def process_row(processor, text: str, images: list) -> tuple[list[int], RowPixels | None]:
    """The row's token ids, each image placeholder expanded to its image's tokens, and its pixel inputs (None
    without images), from the model's processor; `text` is the rendered chat template."""
    if not images:
        return processor.tokenizer(text, add_special_tokens=False).input_ids, None
    out = processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
    pixels = {k: v for k, v in out.items() if k not in TOKEN_KEYS and isinstance(v, torch.Tensor)}
    return out["input_ids"][0].tolist(), RowPixels(pixels, len(images), tuple(images))


def extend_row(pixels: RowPixels | None, more: RowPixels | None) -> RowPixels | None:
    """A row's pixel inputs with those of images that come after its own (a later turn's): every tensor
    concatenated along dim 0, images in order."""
    if pixels is None or more is None:
        return more if pixels is None else pixels
    return RowPixels({k: torch.cat([v, more.tensors[k]]) for k, v in pixels.tensors.items()},
                     pixels.num_images + more.num_images, pixels.images + more.images)


def image_runs(ids: list[int], image_token_id: int) -> int:
    """How many images' placeholder runs the (expanded) ids hold."""
    return sum(1 for i, t in enumerate(ids) if t == image_token_id and (i == 0 or ids[i - 1] != image_token_id))


def join_rows(rows: list[RowPixels | None], device=None) -> dict[str, torch.Tensor]:
    """The model's pixel keyword arguments for a micro-batch: each tensor of its rows concatenated in row order,
    on `device` (None: where they are); {} when no row has an image."""
    present = [r for r in rows if r is not None]
    if not present:
        return {}
    keys = present[0].tensors.keys()
    return {k: torch.cat([r.tensors[k] for r in present]).to(device) for k in keys}


def image_token_types(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """(B, L) int: 1 where the token is an image placeholder, 0 elsewhere (Qwen2-VL's `mm_token_type_ids`,
    Gemma-3's `token_type_ids`)."""
    return (input_ids == image_token_id).int()


def collapse_placeholders(ids: list[int], image_token_id: int) -> list[int]:
    """The ids with each image's run of placeholders (as the processor expanded it) back to one placeholder: the
    prompt form engines that expand images themselves take (vLLM's Qwen2-VL family expands each
    `<|vision_start|><|image_pad|><|vision_end|>`, and silently expands already expanded ids again)."""
    return [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]


def image_token_of(processor) -> int | None:
    """The id each image's run of placeholders is made of once expanded (Qwen2-VL: `<|image_pad|>`; Gemma-3: its
    soft image token, which the tokenizer names)."""
    for owner in (processor.tokenizer, processor):  # Gemma-3's processor names the start-of-image marker instead
        token = getattr(owner, "image_token_id", None)
        if isinstance(token, int):
            return token
    return None


def cut_at_placeholders(rollout, placeholder_ids: list[int], pad_token_id: int):
    """The rollout with each response cut before the first image placeholder it sampled (marked truncated).

    A sampled `<|image_pad|>` is a plain token while the engine decodes, but the training forward would take it
    for an image without pixels and refuse the row (Qwen2-VL: "image features and image tokens do not match"),
    or number its positions as an image. Trained VLMs essentially never sample one; a tiny or untrained one
    does. Cutting keeps every score of the tokens before it exact; the response ends there and its reward
    is that of its text up to there."""
    ids = rollout.response_ids
    hit = torch.isin(ids, torch.tensor(placeholder_ids, device=ids.device)) & rollout.response_mask.bool()
    if not hit.any():
        return rollout
    after = hit.int().cumsum(dim=1) > 0
    rollout.response_ids = ids.masked_fill(after, pad_token_id)
    rollout.response_mask = rollout.response_mask.masked_fill(after, 0)
    rollout.truncated = rollout.truncated | hit.any(dim=1)
    if rollout.logprobs is not None:
        rollout.logprobs = rollout.logprobs.masked_fill(after, 0.0)
    return rollout
