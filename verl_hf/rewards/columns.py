"""Reading the ground truth that a reward function compares against, from the batch's dataset columns.

See it work: tests/test_rewards.py.
"""

from __future__ import annotations

from .contract import completion_text

_TRUTH_COLUMNS = ("answer", "ground_truth")


def ground_truths(reward_name: str, columns: dict) -> list:
    """The ground-truth column: `answer`, else `ground_truth`."""
    for key in _TRUTH_COLUMNS:
        if key in columns:
            return columns[key]
    raise ValueError(
        f"reward {reward_name!r} needs a ground-truth column but the batch "
        f"has only columns {sorted(columns)}; add a column named 'answer' or "
        f"'ground_truth' to the dataset (or map one with data_key_map)")


def score_each(scorer, completions, truths, **kwargs) -> list[float | None]:
    """`scorer(text, truth)` of each completion (text, or messages: the last assistant message's text)."""
    # A row without a ground truth cannot be judged: exclude it (None)
    # rather than punish the completion with 0.
    return [None if truth is None else scorer(completion_text(c), truth, **kwargs)
            for c, truth in zip(completions, truths)]
