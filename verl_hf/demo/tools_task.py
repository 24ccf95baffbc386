"""The multi-turn demo's task: "What is A times B?" for three-digit A and B, with a `multiply` tool.

The tiny model cannot multiply three-digit numbers (it answers a plausible six-digit guess), but it can copy
the operands into a Hermes tool call and the tool's result into its answer:

    user:      What is 123 times 456?
    assistant: <tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 456}}</tool_call>
    tool:      56088
    assistant: #### 56088

The warm start (`sft.py --task tools`) learns from conversations that call the tool only sometimes
(`tool_share`) and otherwise guess, so it uses the tool on some problems; GRPO makes it use it well.

See it work: tests/test_demo_tools.py.
"""

from __future__ import annotations

import json
import random

from datasets import Dataset

from .task import ANSWER_PREFIX


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def tool_call_text(a: int, b: int) -> str:
    """The Hermes call of `multiply(a, b)`, as the parser (verl_hf.agent.parse_hermes) reads it."""
    return f"<tool_call>{json.dumps({'name': 'multiply', 'arguments': {'a': a, 'b': b}})}</tool_call>"


def conversation(a: int, b: int, use_tool: bool) -> list[dict]:
    """A whole demo conversation: with the tool (call, result, answer), or answered directly (one turn)."""
    question = {"role": "user", "content": f"What is {a} times {b}?"}
    if not use_tool:
        return [question, {"role": "assistant", "content": f"{ANSWER_PREFIX}{a * b}"}]
    return [question, {"role": "assistant", "content": tool_call_text(a, b)},
            {"role": "tool", "name": "multiply", "content": str(a * b)},
            {"role": "assistant", "content": f"{ANSWER_PREFIX}{a * b}"}]


def make_multiplication_dataset(num_rows: int, seed: int, exclude=None, low: int = 100, high: int = 999) -> Dataset:
    """`num_rows` distinct problems: `prompt` (one user message), `answer` (the product as text), `operands`."""
    rng, seen, pairs = random.Random(seed), set(exclude or ()), []
    while len(pairs) < num_rows:
        pair = (rng.randint(low, high), rng.randint(low, high))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return Dataset.from_dict({"prompt": [conversation(a, b, use_tool=False)[:1] for a, b in pairs],
                              "answer": [str(a * b) for a, b in pairs], "operands": [list(p) for p in pairs]})


def tools_splits(seed: int = 0, num_train: int = 4000, num_test: int = 200, num_dev: int = 200):
    """Train, dev (for stopping the warm start) and held-out test problems, pairwise disjoint."""
    test = make_multiplication_dataset(num_test, seed=30_000 + seed)
    dev = make_multiplication_dataset(num_dev, seed=40_000 + seed, exclude=_pairs(test))
    train = make_multiplication_dataset(num_train, seed=50_000 + seed, exclude=_pairs(test) | _pairs(dev))
    return train, dev, test


def sft_conversations(dataset: Dataset, tool_share: float, seed: int, family=None) -> list[list[dict]]:
    """One conversation per row, in the format of `family` (families.py; None: the Llama demo's): with the tool
    for a `tool_share` of them, else answered directly with the true product, which the tiny model cannot
    learn to compute: it learns to guess."""
    rng, make = random.Random(seed), family.conversation if family is not None else conversation
    return [make(a, b, use_tool=rng.random() < tool_share) for a, b in dataset["operands"]]


def _pairs(ds: Dataset) -> set[tuple[int, int]]:
    return {tuple(p) for p in ds["operands"]}


def correct_tool_call(prompts, completions, completion_ids, messages, tool_statuses, operands, **columns):
    """1.0 for a conversation whose tool calls all ran (well-formed, known tool, in time) and include
    `multiply` of the problem's own operands, else 0.0: the share of correct, well-formed tool use (the demo
    logs it with weight 0; it is not part of the reward)."""
    scores = []
    for conversation_messages, statuses, (a, b) in zip(messages, tool_statuses, operands):
        calls = [call for m in conversation_messages if m["role"] == "assistant" for call in _calls(m)]
        right = any(name == "multiply" and args in ({"a": a, "b": b}, {"a": b, "b": a}) for name, args in calls)
        scores.append(float(right and bool(statuses) and all(s == "ok" for s in statuses)))
    return scores


def _calls(message: dict) -> list[tuple]:
    """(name, arguments) of an assistant message's calls: those the tool environment read (its `tool_calls`,
    whatever the family's format), else the Hermes calls in its text."""
    from ..agent import parse_hermes

    if message.get("tool_calls"):
        return [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    return [(c.name, c.arguments) for c in parse_hermes(message["content"])]
