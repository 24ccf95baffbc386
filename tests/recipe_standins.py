"""Local stand-ins with the columns and format of the recipes' real datasets (openai/gsm8k,
Dahoas/full-hh-rlhf), for tests/test_recipes.py and scripts/gpu_check.sh (no Hub in either)."""

import random


def gsm8k_like(n: int, seed: int) -> list[dict]:
    """Rows with GSM8K's columns and format: a word problem, and a solution ending in '#### <number>'."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        rows.append({"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
                     "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"})
    return rows


def hh_like(n: int, seed: int) -> list[dict]:
    """Rows with Dahoas/full-hh-rlhf's columns; prompts of one or two human turns."""
    rows = []
    for i in range(n):
        prompt = f"\n\nHuman: What is {i} plus {seed}?\n\nAssistant:"
        if i % 2:
            prompt = f"\n\nHuman: Hi.\n\nAssistant: Hello, how can I help?{prompt}"
        rows.append({"prompt": prompt, "response": f" {i + seed}", "chosen": f" {i + seed}", "rejected": " no"})
    return rows
