"""Thinking and answer apart. Reasoning models (Qwen3, QwQ, DeepSeek-R1) write their thinking in
<think>...</think> before the answer. With `reasoning_format='think'` (the model opens the block itself, as
Qwen3 does) or `'deepseek_r1'` (the prompt opens it: DeepSeek-R1's and QwQ's templates end the generation
prompt with '<think>\n') the reward functions get two more
columns, `reasoning` and `contents` (what an OpenAI-style chat message calls `reasoning_content` and
`content`), and the samples callback writes them apart; `completions` stays the whole text as sampled.

See it work: tests/test_rewards.py.
"""

from __future__ import annotations

REASONING_FORMATS = ("think", "deepseek_r1")
REASONING_COLUMNS = {"reasoning": "each completion's thinking", "contents": "each completion's answer after it"}


def split_think(text: str, opened_in_prompt: bool = False) -> tuple[str, str]:
    """(reasoning, content) of one completion, split as Qwen3's chat template splits an assistant turn: the
    thinking is what comes before the first </think> (after its <think>), the content what follows the last
    one, newlines around both trimmed. Without </think>: a completion that opens with <think>, or any
    completion when the prompt opened the block (`opened_in_prompt`: DeepSeek-R1's and QwQ's templates), is all
    thinking, cut off before its answer (content ""); any other is all answer."""
    if "</think>" in text:
        return (text.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n"),
                text.split("</think>")[-1].lstrip("\n"))
    if opened_in_prompt or text.lstrip().startswith("<think>"):
        return text.lstrip().removeprefix("<think>").lstrip("\n"), ""
    return "", text


def reasoning_columns(completions: list[str], reasoning_format: str | None) -> dict[str, list[str]]:
    """The `reasoning` and `contents` columns of `completions` ({} without a reasoning format)."""
    if reasoning_format is None:
        return {}
    split = [split_think(text, opened_in_prompt=reasoning_format == "deepseek_r1") for text in completions]
    return {"reasoning": [r for r, _ in split], "contents": [c for _, c in split]}
