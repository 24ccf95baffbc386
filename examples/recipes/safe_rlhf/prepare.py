"""PKU-SafeRLHF prompts for `verl-hf train`, in the conversation format the Safe-RLHF models were trained on:
`BEGINNING OF CONVERSATION: USER: <prompt> ASSISTANT:` as plain text. The policy (Alpaca-7B reproduced) and
the Beaver reward and cost models all read that format, and a text prompt is scored as prompt + response,
so no chat template is involved. Duplicate and empty prompts are dropped (the dataset holds several
response pairs per prompt; only the prompt is used); `--num_test` test prompts are drawn at random (seed 0),
and no test prompt is kept for training.

    python examples/recipes/safe_rlhf/prepare.py                                   # from the Hub
    python examples/recipes/safe_rlhf/prepare.py --source path/to/dir --out data/safe_rlhf   # local files

`--source` is a Hub dataset id or a local folder with `train.*` and `test.*` files (jsonl, json or parquet)
with a `prompt` column; the tests run this script on such a folder (tests/test_recipes.py).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prompt_data import arguments, load_source, save  # noqa: E402  (what every recipe's prepare.py shares)

TEMPLATE = "BEGINNING OF CONVERSATION: USER: {prompt} ASSISTANT:"


def unique_prompts(data, exclude=frozenset()) -> list[str]:
    """The split's distinct non-empty prompts, first occurrence order, without those in `exclude`."""
    seen = dict.fromkeys(text.strip() for text in data["prompt"] if text and text.strip())
    return [text for text in seen if text not in exclude]


def main(argv=None) -> None:
    args = arguments(__doc__, "PKU-Alignment/PKU-SafeRLHF", "data/safe_rlhf", argv)
    from datasets import Dataset, DatasetDict

    raw = load_source(args.source, columns=("prompt",))
    test = unique_prompts(raw["test"])
    if args.num_test and len(test) > args.num_test:
        test = random.Random(0).sample(test, args.num_test)
    train = unique_prompts(raw["train"], exclude=set(test))  # no evaluation prompt is trained on
    save(DatasetDict({split: Dataset.from_dict({"prompt": [TEMPLATE.format(prompt=p) for p in texts]})
                      for split, texts in (("train", train), ("test", test))}), args.out)


if __name__ == "__main__":
    main()
