"""Local stand-ins with the columns and format of the recipes' real datasets (openai/gsm8k,
Dahoas/full-hh-rlhf), for tests/test_recipes.py (no Hub)."""

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


def safe_rlhf_like(n: int, seed: int) -> list[dict]:
    """Rows with PKU-SafeRLHF's columns: a prompt (each twice, as the dataset repeats prompts over response
    pairs), two responses and their labels."""
    rows = []
    for i in range(n):
        prompt = f"How do I {'bake bread' if i % 4 < 2 else 'fix a bike'} number {i // 2 + seed}?"
        rows.append({"prompt": prompt, "response_0": "Carefully.", "response_1": "Dangerously.",
                     "is_response_0_safe": True, "is_response_1_safe": False, "better_response_id": 0,
                     "safer_response_id": 0})
    return rows


def save_score_model(path, tokenizer, score_type: str, seed: int = 0, **config_fields) -> None:
    """A tiny Llama score model in safe-rlhf's format (`LlamaForScore`: `model.*` + `score_head.weight`, the
    score fields in config.json), as the Beaver reward and cost models are saved."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    state = {f"model.{k}": v for k, v in LlamaModel(config).state_dict().items()}
    state["score_head.weight"] = torch.randn(1, config.hidden_size) * 0.1
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, path / "model.safetensors")
    fields = {**config.to_dict(), "architectures": ["LlamaForScore"], "score_dim": 1, "bias": False,
              "score_type": score_type, "do_normalize": False, **config_fields}
    (path / "config.json").write_text(json.dumps(fields))
    tokenizer.save_pretrained(path)


def geometry3k_like(n: int, seed: int) -> list[dict]:
    """Rows with hiyouga/geometry3k's columns: `images` (one figure, PNG bytes as datasets stores them), a
    `problem` whose `<image>` marks the figure, and the `answer`."""
    import io

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        angle = rng.choice([30, 45, 60, 90])
        figure = Image.new("RGB", (rng.choice([56, 84]), 56), "white")
        ImageDraw.Draw(figure).line([(4, 50), (50, 50), (4 + angle // 3, 8)], fill="black", width=2)
        png = io.BytesIO()
        figure.save(png, format="PNG")
        rows.append({"images": [{"bytes": png.getvalue(), "path": None}],
                     "problem": "<image>Find the measure of angle A.", "answer": str(angle)})
    return rows
