"""GSM8K as prompts for `verl-hf train`: each question becomes a one-turn chat prompt that asks for the final
answer after "####" (verl's instruction, so that the strict `gsm8k` reward and the published figures apply),
and the `answer` column (the reference solution ending in "#### <number>") is kept as the ground truth.

    python examples/recipes/gsm8k/prepare.py                                # openai/gsm8k from the Hub
    python examples/recipes/gsm8k/prepare.py --source path/to/dir --out data/gsm8k   # local train/test files

`--source` is a Hub dataset id (config "main") or a local folder with `train.*` and `test.*` files (jsonl,
json or parquet) holding the same `question` and `answer` columns: the tests run this very script on such a
folder (tests/test_recipes.py). Writes a `datasets.DatasetDict` with `save_to_disk`, which `dataset_name`
then names.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prompt_data import arguments, load_source, save  # noqa: E402  (what every recipe's prepare.py shares)

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
COLUMNS = ("question", "answer")


def to_prompts(raw):
    """question -> `prompt` (chat messages with the instruction); `answer` kept; other columns dropped."""
    return raw.map(lambda row: {"prompt": [{"role": "user", "content": f"{row['question']} {INSTRUCTION}"}]},
                   remove_columns=[c for c in raw["train"].column_names if c != "answer"])


def main(argv=None) -> None:
    args = arguments(__doc__, "openai/gsm8k", "data/gsm8k", argv, num_test=False)
    save(to_prompts(load_source(args.source, "main", COLUMNS)), args.out)


if __name__ == "__main__":
    main()
