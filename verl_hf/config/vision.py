"""Vision-language policies (verl_hf/vision/): on when `processing_class` is the model's processor, with an image
processor. Whether they take effect depends on what VerlTrainer is given (applies.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from .applies import VISION, _help, raise_first_failed


@dataclass
class VisionFields:
    image_column: Annotated[str, VISION] = field(
        default="images",
        metadata=_help("Vision-language: the dataset column with each row's images (one, or a list in the order of "
                       "the prompt's {'type': 'image'} parts; PIL images, file paths or bytes). Reward functions "
                       "receive it like any other column."),
    )
    freeze_vision_tower: Annotated[bool, VISION] = field(
        default=True,
        metadata=_help("Vision-language: keep the vision tower (and its patch merger) fixed and train the language "
                       "model only, as verl and TRL do by default."),
    )


def check_vision(cfg) -> None:
    raise_first_failed(cfg, [
        ("image_column", isinstance(cfg.image_column, str) and bool(cfg.image_column), "must name a dataset column"),
    ])
