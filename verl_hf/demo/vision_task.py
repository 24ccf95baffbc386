"""The vision demo's task: "What color is the shape?" about a drawn picture, answered with one word.

Each picture (56x56 pixels, 4 image tokens for the tiny Qwen2-VL) is a square or a disc of one of six colors, of a
random size and place, on a random gray background, with a little pixel noise:

    user:      <image> What color is the shape?
    assistant: purple

The answer is checked exactly (`names_the_color`: the response is the color's name). The warm start
(`sft.py --task vision`) is stopped once its sampled answers name 30% of the dev pictures right (a quarter of the
test pictures); GRPO does the rest.

See it work: tests/test_demo_vision.py.
"""

from __future__ import annotations

import numpy as np
from datasets import Dataset

COLORS = {"red": (215, 40, 40), "green": (40, 170, 60), "blue": (45, 75, 215), "yellow": (225, 205, 35),
          "purple": (140, 55, 180), "orange": (235, 135, 25)}
QUESTION = "What color is the shape?"
SIZE = 56  # pixels a side: 4x4 patches of 14, merged 2x2 into 4 image tokens


def draw(color: str, rng: np.random.Generator):
    """One picture: a square or a disc of `color` on a gray background, both placed and sized at random."""
    from PIL import Image

    gray = int(rng.integers(60, 200))
    pixels = np.full((SIZE, SIZE, 3), gray, dtype=np.float32)
    side = int(rng.integers(18, 40))
    top, left = (int(rng.integers(0, SIZE - side + 1)) for _ in range(2))
    ys, xs = np.mgrid[0:SIZE, 0:SIZE]
    if rng.random() < 0.5:
        inside = (ys >= top) & (ys < top + side) & (xs >= left) & (xs < left + side)
    else:
        radius = side / 2
        inside = (ys - top - radius) ** 2 + (xs - left - radius) ** 2 <= radius**2
    pixels[inside] = COLORS[color]
    pixels += rng.normal(0, 8, pixels.shape)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def make_color_dataset(n: int, seed: int) -> Dataset:
    """`n` rows: prompt (chat messages with one image part), images (one picture), answer (its color's name)."""
    rng = np.random.default_rng(seed)
    names = list(COLORS)
    rows = []
    for _ in range(n):
        color = names[int(rng.integers(len(names)))]
        rows.append({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
                     "images": [draw(color, rng)], "answer": color})
    return Dataset.from_list(rows)


def vision_splits(seed: int = 0, num_train: int = 4000, num_dev: int = 200, num_test: int = 200):
    """(train, dev, test): pictures drawn from disjoint random streams."""
    return (make_color_dataset(num_train, seed), make_color_dataset(num_dev, seed + 10_000),
            make_color_dataset(num_test, seed + 20_000))


def names_the_color(completions, answer, **kwargs) -> list[float]:
    """1.0 where the response is the picture's color's name (case and a final period aside), else 0.0. The prompts
    are chat messages, so each completion is [{"role": "assistant", "content": ...}] (TRL's contract); the
    demo's own evaluation passes plain text: both are read."""
    from verl_hf.rewards.contract import completion_text

    return [1.0 if completion_text(c).strip().rstrip(".").lower() == a else 0.0 for c, a in zip(completions, answer)]


def vision_corpus() -> list[str]:
    """The text the demo's tokenizer is trained on: the question and every answer."""
    return [QUESTION, " ".join(COLORS), *COLORS]
