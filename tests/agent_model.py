"""A tiny Llama that ends its turns: a few seconds of supervised training on short chats (a question, a
number, a follow-up, a number), so that multi-turn tests run real conversations with a real model (random
weights ramble until the token limit and every sample ends after one turn). Used by tests/test_agent_loop.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from architectures import CHATML_TOOLS, build, build_tokenizer


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def tool_schemas() -> list[dict]:
    from verl_hf.agent import as_tools

    return [t.schema for t in as_tools([multiply]).values()]


def conversation(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": str(a + b)},
            {"role": "tool", "content": str(a + b)}, {"role": "assistant", "content": f"{a + b}."}]


def prompts(num: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    return [conversation(rng.randint(10, 99), rng.randint(10, 99))[:1] for _ in range(num)]


def _training_rows(tokenizer, num: int, seed: int):
    """(ids, loss mask) of whole conversations: the loss on the assistant's turns only."""
    rng, rows = random.Random(seed), []
    for _ in range(num):
        messages = conversation(rng.randint(10, 99), rng.randint(10, 99))
        ids, mask = [], []
        for end in range(1, len(messages) + 1):
            text = tokenizer.apply_chat_template(messages[:end], tokenize=False)
            new = tokenizer(text, add_special_tokens=False).input_ids[len(ids):]
            ids, mask = ids + new, mask + [int(messages[end - 1]["role"] == "assistant")] * len(new)
        rows.append((ids, mask))
    return rows


def build_tool_model(directory: Path, steps: int = 60) -> str:
    """Train and save the model and its tokenizer under directory/tool_llama; returns the path."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHATML_TOOLS
    path = Path(build("llama", directory, tokenizer))
    model = AutoModelForCausalLM.from_pretrained(path)
    rows = _training_rows(tokenizer, 256, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = random.Random(1)
    for _ in range(steps):
        batch = generator.sample(rows, 32)
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in batch])
        mask = torch.tensor([m + [0] * (width - len(m)) for _, m in batch])
        logits = model(input_ids=ids, attention_mask=(mask >= 0).long()).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                 reduction="none")
        loss = (loss * mask[:, 1:].reshape(-1)).sum() / mask[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
