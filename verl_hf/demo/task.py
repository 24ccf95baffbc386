"""Synthetic task: "What is A plus B?" answered as `#### <A+B>`, scored like GSM8K.

Operands come from [10, 99]: with 0-99 (mixed one- and two-digit numbers) the warm start stalls on a
2-10% plateau for minutes (measured, see ../shared/design/CPU-STACK.md).

See it work: tests/test_demo_task.py.
"""

from __future__ import annotations

import random

from datasets import Dataset

ANSWER_PREFIX = "#### "


def make_addition_dataset(num_rows: int, seed: int, low: int = 10, high: int = 99, exclude=None) -> Dataset:
    """`num_rows` distinct problems with columns `prompt`, `answer` (the sum as text) and `completion` (SFT target).

    `exclude` is a set of (a, b) pairs that must not appear (keeps held-out problems out of training).
    """
    rng = random.Random(seed)
    exclude = set(exclude or ())
    space = (high - low + 1) ** 2 - len(exclude)
    if num_rows > space:
        raise ValueError(f"num_rows={num_rows} exceeds the {space} distinct problems in [{low}, {high}]")
    pairs: list[tuple[int, int]] = []
    seen = set(exclude)
    while len(pairs) < num_rows:
        pair = (rng.randint(low, high), rng.randint(low, high))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return Dataset.from_dict(
        {
            "prompt": [f"What is {a} plus {b}?\n" for a, b in pairs],
            "answer": [str(a + b) for a, b in pairs],
            "completion": [f"{ANSWER_PREFIX}{a + b}" for a, b in pairs],
            "operands": [list(p) for p in pairs],
        }
    )


def demo_splits(seed: int = 0, num_train: int = 4000, num_test: int = 200, num_dev: int = 200):
    """Train, dev (for stopping the warm start) and held-out test problems, pairwise disjoint."""
    test = make_addition_dataset(num_test, seed=10_000 + seed)
    dev = make_addition_dataset(num_dev, seed=20_000 + seed, exclude=_pairs(test))
    train = make_addition_dataset(num_train, seed=seed, exclude=_pairs(test) | _pairs(dev))
    return train, dev, test


def _pairs(ds: Dataset) -> set[tuple[int, int]]:
    return {tuple(p) for p in ds["operands"]}
