"""Position ids for the training forward, the model's own where it has multimodal rotary positions.

A text model's positions count the attended tokens: cumsum(mask) - 1. Qwen2-VL, Qwen2.5-VL and Qwen3-VL rotate
by 3-D (t, h, w) positions that their `get_rope_index` computes from the image grids; given 1-D positions they
silently compute wrong log-probs (7.9e-3 off on a tiny Qwen2-VL), and left to compute them itself the model
needs the processor's `mm_token_type_ids`. So they are computed here, per row from its own tokens and mask
(padding anywhere is skipped, so removing pad columns afterwards changes nothing), as (4, B, L): the text
positions, then the three rotary rows, the layout the model takes.

See it work: tests/test_vision_inputs.py.
"""

from __future__ import annotations

import torch

from .inputs import image_token_types, join_rows


def rope_index_owner(model):
    """The module that computes the model's multimodal rotary index (Qwen2-VL family), or None; looks through
    PEFT and DDP wrappers."""
    for _ in range(4):
        if hasattr(model, "get_rope_index"):
            return model
        inner = getattr(model, "model", None) or getattr(model, "module", None)
        if inner is None and hasattr(model, "get_base_model"):
            inner = model.get_base_model()
        if inner is None or inner is model:
            return None
        model = inner
    return None


def position_ids(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 image_grid_thw: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L) text positions, or (4, B, L) for a model with multimodal rotary positions: the text positions and
    its 3-D positions (`image_grid_thw`: (I, 3), the micro-batch's images in row order)."""
    text = (attention_mask.cumsum(1) - 1).clamp(min=0)
    owner = rope_index_owner(model)
    if owner is None:
        return text
    image_token_id = owner.config.image_token_id
    rope, _ = owner.get_rope_index(input_ids, image_token_types(input_ids, image_token_id), image_grid_thw,
                                   attention_mask=attention_mask)
    return torch.cat([text[None], rope.to(text.device)])


def pixel_inputs(model, input_ids: torch.Tensor, rows: list, device=None) -> dict:
    """What `model` takes beside the ids of these rows (`RowPixels` or None each, in row order) for their images
    in `generate`: the joined pixel inputs; for a model with its own rotary index the image placeholders' token
    types it reads when it numbers positions itself; for one that attends over each image both ways, the token
    types that say so (`bidirectional_image_inputs`). {} when no row has an image."""
    inputs = join_rows(rows, device or input_ids.device)
    owner = rope_index_owner(model)
    if inputs and owner is not None:
        inputs["mm_token_type_ids"] = image_token_types(input_ids, owner.config.image_token_id)
    if inputs:
        inputs.update(bidirectional_image_inputs(model, input_ids))
    return inputs


# Models whose image tokens attend to each other both ways (Gemma-3): they read it from `token_type_ids` (1 on image
# tokens) in every forward. Without them the training forward would be causal over each image while generate's
# first step, given them by the processor, is not: other log-probs. (PaliGemma reads token_type_ids the other way
# round, 0 on its bidirectional prefix: not here until it is tested.)
BIDIRECTIONAL_IMAGES = ("gemma3",)


def bidirectional_image_inputs(model, input_ids: torch.Tensor) -> dict:
    """{"token_type_ids": (B, L)} for a model of BIDIRECTIONAL_IMAGES, else {}."""
    config = _config(model)
    if getattr(config, "model_type", None) not in BIDIRECTIONAL_IMAGES:
        return {}
    return {"token_type_ids": image_token_types(input_ids, config.image_token_id).long()}


def _config(model):
    """The model's config through DDP and PEFT wrappers."""
    for _ in range(3):
        if hasattr(model, "config"):
            return model.config
        model = getattr(model, "module", None)
    return None
