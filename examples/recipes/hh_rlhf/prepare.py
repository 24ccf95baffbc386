"""Anthropic HH-RLHF prompts (the `Dahoas/full-hh-rlhf` release that verl's HybridFlow examples use) as chat
prompts for `verl-hf train`: each `prompt` ("\\n\\nHuman: ...\\n\\nAssistant: ...\\n\\nHuman: ...\\n\\nAssistant:")
becomes the list of its turns, ending with the last human turn, so that the policy's own chat template
frames the conversation; the other columns are dropped (the reward comes from a reward model), and so are
duplicate prompts and rows in another format (counted).

    python examples/recipes/hh_rlhf/prepare.py                                  # from the Hub
    python examples/recipes/hh_rlhf/prepare.py --source path/to/dir --out data/hh_rlhf   # local train/test

`--source` is a Hub dataset id or a local folder with `train.*` and `test.*` files (jsonl, json or parquet)
with a `prompt` column in that format; the tests run this script on such a folder (tests/test_recipes.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prompt_data import arguments, load_source, save  # noqa: E402  (what every recipe's prepare.py shares)

TURN = re.compile(r"\n\n(Human|Assistant):")
ROLES = {"Human": "user", "Assistant": "assistant"}


def turns(prompt: str) -> list[dict]:
    """'\\n\\nHuman: a\\n\\nAssistant: b\\n\\nHuman: c\\n\\nAssistant:' -> user a, assistant b, user c."""
    parts = TURN.split("\n\n" + prompt.lstrip("\n"))
    messages = [{"role": ROLES[speaker], "content": text.strip()} for speaker, text in zip(parts[1::2], parts[2::2])]
    if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages.pop()  # the open "Assistant:" the policy answers
    if not messages or messages[-1]["role"] != "user":
        raise ValueError(f"an HH-RLHF prompt must end with a human turn and 'Assistant:', got: {prompt[-200:]!r}")
    return messages


def conversations(data):
    """The split's distinct prompts as chat turns; rows not in the Human/Assistant format are dropped and
    counted (printed), not fatal."""
    from datasets import Dataset

    kept, dropped = {}, 0
    for text in data["prompt"]:
        try:
            kept.setdefault((text or "").strip(), turns(text or ""))
        except ValueError:
            dropped += 1
    if dropped:
        print(f"dropped {dropped} of {len(data)} prompts not in the Human/Assistant format")
    return Dataset.from_dict({"prompt": list(kept.values())})


def main(argv=None) -> None:
    args = arguments(__doc__, "Dahoas/full-hh-rlhf", "data/hh_rlhf", argv)
    from datasets import DatasetDict

    raw = load_source(args.source, columns=("prompt",))
    if args.num_test and len(raw["test"]) > args.num_test:
        raw["test"] = raw["test"].select(range(args.num_test))
    save(DatasetDict({split: conversations(data) for split, data in raw.items()}), args.out)


if __name__ == "__main__":
    main()
