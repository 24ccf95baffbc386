"""How close our update and our generation come to this machine's own limits, measured in one run.

- Update: the trainer's `time/update` (forward, loss and backward of the policy) against the time the same
  matmuls take alone. The roofline is measured here, per dtype, on the model's own linear shapes at the
  update's row counts (B x T tokens; the LM head only B x (response + 1)), and the update's work is 6 x the
  matmul FLOPs of one forward's shapes (forward 2, backward 4). Attention scores are left out (a few percent
  here), and so is any backward recompute of LM-head chunks (none at this vocabulary: one chunk is kept).
- Generation: the trainer's generated tokens/s (`rollout/tokens_per_s`) against the same engine called alone
  on the same prompts and lengths (model.generate on a bf16 or fp32 copy with the same attention), so the
  ratio is what the trainer's rollout plumbing costs.

    .venv/bin/python benchmarks/roofline.py --row a --steps 4     # row a of vs_trl.py, bf16
    .venv/bin/python benchmarks/roofline.py --row a32             # the same row in fp32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # noqa: E402  (the same model, task and settings as the TRL comparison)


def matmul_seconds(shapes: list[tuple[int, int, int]], dtype: torch.dtype, reps: int = 10) -> float:
    """Best-of-`reps` seconds for one pass over every (m, k, n) matmul in `shapes`."""
    operands = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for m, k, n in shapes]
    for a, b in operands:  # warm-up: oneDNN picks its kernels on first use
        a @ b
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        for a, b in operands:
            a @ b
        best = min(best, time.perf_counter() - started)
    return best


def linear_shapes(model, tokens: int, head_rows: int) -> list[tuple[int, int, int]]:
    """(rows, in, out) of every nn.Linear of the model, one forward's matmuls: `tokens` rows each, except the
    LM head, which only sees the `head_rows` scored positions."""
    head = model.get_output_embeddings()
    return [(head_rows if m is head else tokens, m.in_features, m.out_features) for m in model.modules()
            if isinstance(m, torch.nn.Linear)]


def run_trainer(row: dict, steps: int) -> tuple[float, float, object]:
    """Median time/update and rollout/tokens_per_s of `steps` steps (after one warm-up) of VerlTrainer."""
    record = {}
    with tempfile.TemporaryDirectory() as out:
        trainer = vs_trl.verl_trainer(row, {}, steps + 1, out, record)
        trainer.train()
    logs = [h for h in trainer.state.log_history if "time/update" in h][1:]
    return (statistics.median(h["time/update"] for h in logs),
            statistics.median(h["rollout/tokens_per_s"] for h in logs), trainer)


def standalone_tokens_per_s(trainer, row: dict, reps: int = 3) -> float:
    """The trainer's own engine model generating alone: same prompts, lengths, sampling; best of `reps`."""
    from transformers import GenerationConfig

    engine_model = getattr(trainer.actor.engine, "model", None)
    if engine_model is None:
        return float("nan")  # vLLM: see benchmarks/rollout.py for the engine alone
    n = row["generations"]
    ids = torch.randint(3, 400, (row["prompts"], vs_trl.PROMPT_WORDS)).repeat_interleave(n, dim=0)
    config = GenerationConfig(max_new_tokens=row["response"], min_new_tokens=row["response"], do_sample=True,
                              temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
    best = float("inf")
    for _ in range(reps + 1):
        started = time.perf_counter()
        with torch.no_grad():
            engine_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        best = min(best, time.perf_counter() - started)
    return ids.shape[0] * row["response"] / best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--row", default="a", choices=["a", "a32", "d"])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    row = vs_trl.ROWS[args.row]
    with tempfile.TemporaryDirectory() as cache:
        params = vs_trl.build_assets(row["model"], Path(cache))
        row = dict(row, cache=cache)
        update_s, trainer_tps, trainer = run_trainer(row, args.steps)
        tokens = row["prompts"] * row["generations"] * (vs_trl.PROMPT_WORDS + row["response"])
        dtype = torch.bfloat16 if trainer.args.bf16 else torch.float32
        scored = row["prompts"] * row["generations"] * (row["response"] + 1)  # positions through the LM head
        shapes = linear_shapes(trainer.model, tokens, scored)
        roofline_s = 3 * matmul_seconds(shapes, dtype)  # backward = 2 matmuls of the forward's shapes
        work = 6 * sum(m * k * n for m, k, n in shapes)
        alone_tps = standalone_tokens_per_s(trainer, row)
    print(f"row {args.row}: {params / 1e6:.2f}M params, {tokens} tokens per update, dtype {dtype}")
    print(f"matmul roofline ({dtype}, this model's shapes): {work / roofline_s / 1e9:.0f} GFLOP/s")
    print(f"update phase: {update_s:.3f} s = {work / update_s / 1e9:.0f} GFLOP/s = "
          f"{roofline_s / update_s:.0%} of the roofline")
    print(f"generation: trainer {trainer_tps:.0f} tokens/s, engine alone {alone_tps:.0f} tokens/s = "
          f"{trainer_tps / alone_tps:.0%}")


if __name__ == "__main__":
    main()
