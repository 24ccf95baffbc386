"""What every recipe's prepare.py shares: its command line (`--source`, `--out`, `--num_test`), loading the
raw train/test splits from the Hub or from a local folder of files with the same columns (what the tests
use), the column check, and saving the prompts where `dataset_name` names them."""

from __future__ import annotations

import argparse
from pathlib import Path


def arguments(doc: str, source: str, out: str, argv=None, num_test: bool = True):
    """The parsed command line of a prepare.py whose module docstring is `doc`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--source", default=source, help="Hub id, or a folder with train.* and test.*")
    parser.add_argument("--out", default=out, help="where to save the prompt dataset")
    if num_test:
        parser.add_argument("--num_test", type=int, default=500, help="test prompts kept for evaluation (0: all)")
    return parser.parse_args(argv)


def load_source(source: str, config: str | None = None, columns: tuple[str, ...] = ()):
    """The raw train/test splits, from a local folder of files or from the Hub (dataset config `config`),
    each required to hold `columns`."""
    from datasets import load_dataset

    folder = Path(source)
    if folder.is_dir():
        files = {}
        for split in ("train", "test"):
            found = sorted(p for p in folder.glob(f"{split}.*") if p.suffix in (".jsonl", ".json", ".parquet"))
            if not found:
                raise SystemExit(f"--source {source}: no {split}.jsonl, {split}.json or {split}.parquet in it.")
            files[split] = str(found[0])
        raw = load_dataset("parquet" if files["train"].endswith(".parquet") else "json", data_files=files)
    else:
        raw = load_dataset(source, config)
    for split, data in raw.items():
        missing = [c for c in columns if c not in data.column_names]
        if missing:
            raise SystemExit(f"--source {source}: split {split!r} lacks the column(s) {missing} (has "
                             f"{data.column_names}); the recipe needs {list(columns)}.")
    return raw


def save(prompts, out: str) -> None:
    prompts.save_to_disk(out)
    print(f"{out}: " + ", ".join(f"{split} {len(data)} prompts" for split, data in prompts.items()))
