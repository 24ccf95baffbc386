"""Geometry3K as image prompts for `verl-hf train`: each problem (its text marks where its figure goes with `<image>`)
becomes a one-turn chat prompt whose content holds an image part per figure, followed by verl's geo3k instruction
(think in <think></think>, the final answer in \\boxed{}); the `images` and `answer` columns are kept.

    python examples/recipes/geometry3k/prepare.py                          # hiyouga/geometry3k from the Hub
    python examples/recipes/geometry3k/prepare.py --source path/to/dir --out data/geometry3k   # local files

`--source` is a Hub dataset id or a local folder with `train.*` and `test.*` files (parquet, for the images)
holding the same `images`, `problem` and `answer` columns: the tests run this very script on such a folder
(tests/test_recipes.py). Writes a `datasets.DatasetDict` with `save_to_disk`, which `dataset_name` then names.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prompt_data import arguments, load_source, save  # noqa: E402  (what every recipe's prepare.py shares)

INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
               "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
               "BE put in \\boxed{}.")
COLUMNS = ("images", "problem", "answer")
MARKER = "<image>"


def content_parts(problem: str, num_images: int) -> list[dict]:
    """The problem as chat content: an image part where each `<image>` marker stands (all the images first when
    the markers do not match the images), the text parts between, and the instruction at the end."""
    pieces = problem.split(MARKER)
    if len(pieces) - 1 != num_images:
        pieces = [""] * num_images + [problem.replace(MARKER, "")]
    parts = []
    for i, piece in enumerate(pieces):
        if i:
            parts.append({"type": "image"})
        if piece.strip():
            parts.append({"type": "text", "text": piece.strip()})
    return parts + [{"type": "text", "text": INSTRUCTION}]


def to_prompts(raw):
    """problem -> `prompt` (chat messages with image parts and the instruction); `images` and `answer` kept."""
    return raw.map(lambda row: {"prompt": [{"role": "user", "content": content_parts(row["problem"],
                                                                                     len(row["images"]))}]},
                   remove_columns=[c for c in raw["train"].column_names if c not in ("images", "answer")])


def main(argv=None) -> None:
    args = arguments(__doc__, "hiyouga/geometry3k", "data/geometry3k", argv, num_test=False)
    save(to_prompts(load_source(args.source, None, COLUMNS)), args.out)


if __name__ == "__main__":
    main()
