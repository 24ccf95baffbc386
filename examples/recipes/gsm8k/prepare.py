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

import argparse
from pathlib import Path

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
COLUMNS = ("question", "answer")


def load_source(source: str, config: str | None = "main"):
    """The raw train/test splits, from a local folder of files or from the Hub (dataset config `config`)."""
    from datasets import load_dataset

    folder = Path(source)
    if not folder.is_dir():
        return load_dataset(source, config)
    files = {}
    for split in ("train", "test"):
        found = sorted(p for p in folder.glob(f"{split}.*") if p.suffix in (".jsonl", ".json", ".parquet"))
        if not found:
            raise SystemExit(f"--source {source}: no {split}.jsonl, {split}.json or {split}.parquet in it.")
        files[split] = str(found[0])
    kind = "parquet" if files["train"].endswith(".parquet") else "json"
    return load_dataset(kind, data_files=files)


def to_prompts(raw):
    """question -> `prompt` (chat messages with the instruction); `answer` kept; other columns dropped."""
    for split, data in raw.items():
        missing = [c for c in COLUMNS if c not in data.column_names]
        if missing:
            raise SystemExit(f"split {split!r} lacks the column(s) {missing}; GSM8K has {list(COLUMNS)}.")
    return raw.map(lambda row: {"prompt": [{"role": "user", "content": f"{row['question']} {INSTRUCTION}"}]},
                   remove_columns=[c for c in raw["train"].column_names if c != "answer"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="openai/gsm8k", help="Hub id, or a folder with train.* and test.*")
    parser.add_argument("--out", default="data/gsm8k", help="where to save the prompt dataset")
    args = parser.parse_args(argv)
    prompts = to_prompts(load_source(args.source))
    prompts.save_to_disk(args.out)
    print(f"{args.out}: " + ", ".join(f"{split} {len(data)} prompts" for split, data in prompts.items()))


if __name__ == "__main__":
    main()
