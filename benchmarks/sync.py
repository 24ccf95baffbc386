"""Weight sync under DeepSpeed ZeRO-3 and FSDP2, two CPU processes, on a >= 100M-parameter Llama built from a
config.

Run `python benchmarks/sync.py` (it launches itself with `accelerate launch`, 2 processes, gloo; the same
model is built once ZeRO-3-partitioned and once sharded with FSDP2's `fully_shard`, one decoder layer per
unit). Each rank reports, side by side in one run:

1. sync: seconds, GB/s and the measured peak extra memory (VmHWM) for several bucket sizes, for each
   sharding, next to the bound "one bucket + the largest layer", and next to a plain in-process copy of the
   same bytes (ratio);
2. the HF engine under ZeRO-3, per rollout: "shared" (generate on the sharded model, whole-model gather per
   generate call) against "copy" (one bucketed sync, then generate on a plain inference copy).

3. `--lora`: a LoRA policy into colocated vLLM (one process, no launcher), merged (`vllm_lora='merge'`: the whole
   model every sync) against served as an adapter (`'adapter'`: the base once, then the adapter): bytes, seconds
   and peak extra memory per sync after the first, and generation tokens/s of the same batch from each engine
   (vLLM's LoRA kernels against merged weights).

    python benchmarks/sync.py                      # defaults: ~110M params, buckets 16/64/256 MB
    python benchmarks/sync.py --layers 4 --hidden 256   # a quick small run
    python benchmarks/sync.py --lora               # LoRA r=16 on every linear layer, merged vs adapter
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--buckets_mb", type=float, nargs="+", default=[16, 64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generate_calls", type=int, default=2, help="generate calls per rollout")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--skip_rollout", action="store_true", help="only the sync table")
    parser.add_argument("--shardings", nargs="+", default=["zero3", "fsdp2"], choices=["zero3", "fsdp2"])
    parser.add_argument("--lora", action="store_true", help="LoRA into colocated vLLM: merged vs adapter")
    parser.add_argument("--lora_rank", type=int, default=16)
    return parser.parse_args()


def llama_config(args):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                       num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                       num_key_value_heads=args.hidden // 64, tie_word_embeddings=True, max_position_embeddings=512)


def build_fsdp2_model(args):
    """The same Llama, sharded by FSDP2 as accelerate shards a policy: one `fully_shard` unit per decoder layer,
    the embedding (tied to the LM head) and the rest in the root."""
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(llama_config(args))
    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)


def build_model(args):
    """A Llama-style model, ZeRO-3-partitioned as it is built (zero.Init), wrapped for inference hooks."""
    import deepspeed
    from transformers import LlamaForCausalLM

    config = llama_config(args)
    ds_config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = LlamaForCausalLM(config)
    engine, *_ = deepspeed.initialize(model=model, config=ds_config)
    return engine.module


def plain_copy_seconds(engine, repeats: int) -> tuple[float, int]:
    """A plain in-process copy of the same bytes into the engine's weights: the speed ceiling of a push."""
    import torch

    sources = {n: torch.randn_like(p) for n, p in engine.model.named_parameters()}
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        with torch.no_grad():
            for n, p in engine.model.named_parameters():
                p.copy_(sources[n])
        best = min(best, time.perf_counter() - started)
    return best, sum(t.numel() * t.element_size() for t in sources.values())


def all_gather_seconds(nbytes: int, repeats: int) -> float:
    """The transport alone: all-gathering the same bytes in the sync's piece size into a reused buffer."""
    import torch
    import torch.distributed as dist

    from verl_hf.sync.gather import CHUNK_BYTES

    world = dist.get_world_size()
    piece = torch.randn(CHUNK_BYTES // 4 // world)
    out = torch.empty(piece.numel() * world)
    calls = max(nbytes // CHUNK_BYTES, 1)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            dist.all_gather_into_tensor(out, piece)
        best = min(best, time.perf_counter() - started)
    return best


def bench_baselines(model, engine, args, rank: int) -> tuple[int, float, float]:
    """(bytes, seconds of a plain in-process copy, seconds of a bare all-gather) of the model's weights; printed
    with the table's header."""
    from verl_hf.sync.gather import full_numel, weight_units

    copy_s, nbytes = plain_copy_seconds(engine, args.repeats)
    gather_s = all_gather_seconds(nbytes, args.repeats)
    largest_mb = max(u.nbytes for u in weight_units(model)) / 2**20
    if rank == 0:
        print(f"\nmodel: {sum(full_numel(p) for p in model.parameters()) / 1e6:.1f}M parameters, {nbytes / 1e9:.3f} "
              f"GB fp32; largest weight {largest_mb:.1f} MB, one decoder layer {decoder_layer_mb(model):.1f} MB")
        print(f"plain in-process copy of the same bytes: {copy_s:.3f} s = {nbytes / 1e9 / copy_s:.2f} GB/s")
        print(f"bare all-gather of the same bytes (the transport, no sync): {gather_s:.3f} s = "
              f"{nbytes / 1e9 / gather_s:.2f} GB/s\n")
        print("| sharding | bucket MB | buckets | sync s | GB/s | vs plain copy | vs bare all-gather | "
              "peak extra MB (rank 0) | bound: bucket + layer MB |")
        print("|---|---|---|---|---|---|---|---|---|")
    return nbytes, copy_s, gather_s


def decoder_layer_mb(model) -> float:
    from verl_hf.sync.gather import full_numel

    return sum(full_numel(p) * p.element_size() for p in model.model.layers[0].parameters()) / 2**20


def bench_sync(model, engine, args, rank: int, sharding: str, baselines: tuple[int, float, float]) -> None:
    from verl_hf.sync import WeightSync

    nbytes, copy_s, gather_s = baselines
    for bucket in args.buckets_mb:
        sync = WeightSync(bucket_mb=bucket)
        sync.sync(model, engine)  # warm-up: name check, allocator
        runs = [sync.sync(model, engine) for _ in range(args.repeats)]
        best = min(runs, key=lambda m: m["sync/seconds"])
        peak = max(m["sync/peak_extra_mb"] for m in runs)
        bound = sync.bucket_bytes / 2**20 + decoder_layer_mb(model)
        if rank == 0:
            print(f"| {sharding} | {bucket:g} | {best['sync/buckets']:.0f} | {best['sync/seconds']:.3f} | {best['sync/gb_per_s']:.2f} | "
                  f"{best['sync/gb_per_s'] / (nbytes / 1e9 / copy_s):.2f}x | "
                  f"{best['sync/gb_per_s'] / (nbytes / 1e9 / gather_s):.2f}x | {peak:.0f} | {bound:.0f}"
                  f"{'' if peak <= bound else '  EXCEEDED'} |")
    WeightSync(verify=True).sync(model, engine)  # and the copy is exact


def bench_rollout(model, copy_engine, args, rank: int) -> None:
    """One rollout = `generate_calls` generate calls; the copy form pays one sync per rollout."""
    import torch

    from verl_hf.rollout import HFSharedEngine, SamplingConfig
    from verl_hf.sync import WeightSync

    shared = HFSharedEngine(model, pad_token_id=0, eos_token_ids=[args.vocab - 1])
    prompts = [[1 + (i * 7 + j) % 1000 for j in range(16)] for i in range(args.batch)]
    params = SamplingConfig(max_new_tokens=args.new_tokens, seed=0)
    sync = WeightSync(bucket_mb=64)
    sync.sync(model, copy_engine)
    timings = {}
    for name, engine in (("shared (gather per generate)", shared), ("copy (sync + plain generate)", copy_engine)):
        engine.generate(prompts, params)  # warm-up
        started = time.perf_counter()
        if engine is copy_engine:
            sync.sync(model, copy_engine)
        for _ in range(args.generate_calls):
            engine.generate(prompts, params)
        timings[name] = time.perf_counter() - started
    tokens = args.generate_calls * args.batch * args.new_tokens
    if rank == 0:
        print(f"\nHF engine under ZeRO-3, one rollout = {args.generate_calls} generate calls x {args.batch} prompts x "
              f"{args.new_tokens} new tokens (rank 0):\n")
        print("| form | rollout s | tokens/s | persistent extra memory |")
        print("|---|---|---|---|")
        size = sum(p.numel() * p.element_size() for p in copy_engine.model.parameters()) / 2**20
        for name, seconds in timings.items():
            extra = f"{size:.0f} MB (the copy)" if name.startswith("copy") else "0 (full model only during generate)"
            print(f"| {name} | {seconds:.2f} | {tokens / seconds:.0f} | {extra} |")
    torch.distributed.barrier()


def worker(args) -> None:
    import torch
    from accelerate import PartialState

    from verl_hf.rollout import HFCopyEngine

    state = PartialState(backend="gloo")
    rank, baselines = state.process_index, None
    for sharding in args.shardings:
        torch.manual_seed(0)
        model = build_model(args) if sharding == "zero3" else build_fsdp2_model(args)
        engine = HFCopyEngine.of(model, pad_token_id=0, eos_token_ids=[args.vocab - 1])
        baselines = baselines or bench_baselines(model, engine, args, rank)
        bench_sync(model, engine, args, rank, sharding, baselines)
        if sharding == "zero3" and not args.skip_rollout:
            bench_rollout(model, engine, args, rank)
        del model, engine
        gc.collect()


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def bench_lora(args) -> None:
    """Merged against adapter syncs into colocated vLLM, one process, then tokens/s of each engine's generation."""
    import statistics

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from verl_hf.rollout import SamplingConfig
    from verl_hf.rollout.vllm_engine import VLLMEngine
    from verl_hf.sync import WeightSync
    from verl_hf.sync.adapter import engine_lora_rank, vllm_adapter_config

    torch.manual_seed(0)
    lora = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules=LORA_TARGETS,
                      init_lora_weights=False)
    model = get_peft_model(LlamaForCausalLM(llama_config(args)), lora).eval()
    adapter = vllm_adapter_config(lora)
    rows = {}
    for mode, sync, rank in (("merge", WeightSync(bucket_mb=64), None),
                             ("adapter", WeightSync(bucket_mb=64, adapter_config=adapter), engine_lora_rank(adapter))):
        engine = VLLMEngine(model.get_base_model().config, 0, [args.vocab - 1], max_model_len=64,
                            kv_cache_memory_bytes=256 * 2**20, lora_rank=rank)
        first = sync.sync(model, engine)
        later = []
        for _ in range(args.repeats):
            with torch.no_grad():  # an update of the adapter, as an optimizer step makes
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.add_(1e-3 * torch.randn_like(p))
            later.append(sync.sync(model, engine))
        prompts = [[1 + (i * 7 + j) % 1000 for j in range(16)] for i in range(args.batch)]
        params = SamplingConfig(max_new_tokens=args.new_tokens, seed=0)
        engine.generate(prompts, params)  # warm-up
        started = time.perf_counter()
        out = engine.generate(prompts, params)
        tokens = int(out.response_mask.sum()) / (time.perf_counter() - started)
        rows[mode] = (first, {k: statistics.median(s[k] for s in later) for k in later[0]}, tokens)
        del engine
        gc.collect()
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\nLoRA r={args.lora_rank} on every linear layer of a {params_m:.0f}M-parameter Llama, fp32, colocated vLLM, "
          f"one process; syncs after the first: median of {args.repeats}; generation: {args.batch} prompts x "
          f"{args.new_tokens} new tokens:\n")
    print("| vllm_lora | first sync MB | sync MB | sync s | peak extra MB | generate tokens/s |")
    print("|---|---|---|---|---|---|")
    for mode, (first, median, tokens) in rows.items():
        print(f"| {mode} | {first['sync/gigabytes'] * 1e3:.1f} | {median['sync/gigabytes'] * 1e3:.2f} | "
              f"{median['sync/seconds']:.4f} | {median.get('sync/peak_extra_mb', float('nan')):.1f} | {tokens:.0f} |")
    (_, merged, merged_tokens), (_, served, served_tokens) = rows["merge"], rows["adapter"]
    print(f"\nadapter / merge: bytes {served['sync/gigabytes'] / merged['sync/gigabytes']:.2%}, seconds "
          f"{served['sync/seconds'] / merged['sync/seconds']:.2%}, generate tokens/s {served_tokens / merged_tokens:.2f}x")


def launch() -> int:
    # A fixed mmap threshold makes glibc return every freed block >= 64 KB to the OS at once, so the resident
    # set (what PeakMemory reads on CPU) tracks live tensors instead of recycled heap memory.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "ACCELERATE_USE_DEEPSPEED": "true",
           "MALLOC_MMAP_THRESHOLD_": "65536"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--use_deepspeed",
           "--zero_stage", "3", "--mixed_precision", "no", "--dynamo_backend", "no", __file__, "--worker",
           *sys.argv[1:]]
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    arguments = parse()
    if arguments.lora:
        bench_lora(arguments)
    elif arguments.worker:
        worker(arguments)
    else:
        sys.exit(launch())
