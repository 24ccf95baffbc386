"""What MoE routing replay changes when the sampler and the trainer differ in precision, measured in one run.

A tiny Qwen3-MoE (random weights, the tests' BPE tokenizer) samples from its bf16 HF copy, as `VerlTrainer`
does under bf16 on a CPU; the fp32 trainer scores the same responses twice: routing live, and replaying the
sampler's routes. It prints the share of (token, layer) choices the trainer's router made too, and the
log-prob gap (trainer - sampler, nats per response token) of both passes.

    .venv/bin/python benchmarks/routing_replay.py                       # 4 experts top-2, 2 layers
    .venv/bin/python benchmarks/routing_replay.py --experts 16 --top-k 4 --layers 4
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from architectures import ARCHITECTURES, build, build_tokenizer, chat_prompts  # noqa: E402


def measure(path: str, tokenizer, prompts: int, samples: int, tokens: int) -> dict:
    from transformers import AutoModelForCausalLM

    from verl_hf.roles import Actor
    from verl_hf.rollout import HFCopyEngine

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    engine = HFCopyEngine.of(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], dtype=torch.bfloat16)
    actor = Actor(model, tokenizer, engine=engine, routing_replay=True)
    ids = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                         return_dict=False) for row in chat_prompts(prompts)]
    batch = actor.generate_sequences(prompt_ids=ids, max_new_tokens=tokens, num_return_sequences=samples, seed=0)
    mask = batch.response_mask.bool()
    replayed = actor.get_logprobs(batch)
    agreement = actor.routing_metrics()["moe/replay_agreement"]
    replay, actor.routing = actor.routing, None
    live = actor.get_logprobs(batch)
    actor.routing = replay
    figures = {"tokens": int(mask.sum()), "agreement": agreement}
    for name, scores in (("live", live), ("replayed", replayed)):
        gap = (scores - batch.rollout_logprobs)[mask]
        figures[name] = dict(mean_abs=gap.abs().mean().item(), max_abs=gap.abs().max().item(), k1=gap.mean().item())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    model_type, extra = ARCHITECTURES["qwen3_moe"]
    ARCHITECTURES["bench_moe"] = (model_type, {**extra, "num_experts": args.experts, "num_experts_per_tok": args.top_k,
                                               "num_hidden_layers": args.layers})
    tokenizer = build_tokenizer()
    with tempfile.TemporaryDirectory() as directory:
        figures = measure(build("bench_moe", Path(directory), tokenizer), tokenizer, args.prompts, args.samples,
                          args.tokens)
    print(f"Qwen3-MoE {args.experts} experts top-{args.top_k}, {args.layers} layers; bf16 sampler, fp32 trainer; "
          f"{figures['tokens']} response tokens")
    print(f"  trainer's router chose the sampler's experts: {figures['agreement']:.2%} of (token, layer) choices")
    print(f"  {'routing':9s} {'mean |gap|':>11s} {'max |gap|':>10s} {'k1':>10s}")
    for name in ("live", "replayed"):
        f = figures[name]
        print(f"  {name:9s} {f['mean_abs']:11.2e} {f['max_abs']:10.2e} {f['k1']:10.2e}")


if __name__ == "__main__":
    main()
