"""The one place a rollout engine is built from a `VerlConfig`: `make_rollout_engine(model, tokenizer, args,
placement)` returns the engine that `rollout_engine`, `rollout_hf_weights` and `rollout_dtype` ask for.

Errors that only show once the engine is built (a dtype for an engine without its own weights, a tensor-parallel
size that does not divide the processes, an unreachable server) are raised here, before any training.

See it work: tests/test_sync.py (HF forms, dtypes), tests/test_rollout_vllm.py, tests/test_rollout_vllm_server.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .base import RolloutEngine
from .hf import HFCopyEngine, HFSharedEngine

if TYPE_CHECKING:
    from ..config import VerlConfig
    from ..placement import Placement


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a response: the tokenizer's EOS and the model's generation_config EOS ids."""
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
    return sorted(i for i in ids if i is not None)


def make_rollout_engine(model, tokenizer, args: VerlConfig, placement: Placement | None = None,
                        adapter: dict | None = None, processor=None) -> RolloutEngine:
    """The engine `args.rollout_engine` names, for the training `model` (possibly PEFT- or DeepSpeed-wrapped),
    in the run's `placement` (None: one process). 'auto' HF weights copy under ZeRO-3 and FSDP2. `adapter`: the
    LoRA adapter vLLM serves itself (adapter_setup.lora_serving), else None. `processor`: a vision-language
    policy's processor when the prompts have images (the HF engine takes the pixels from the Actor)."""
    if args.rollout_engine == "vllm":
        return make_vllm_engine(model, tokenizer, args, adapter, processor)
    if args.rollout_engine == "vllm_server":
        return make_vllm_server_engine(model, tokenizer, args, adapter, processor)
    return make_hf_engine(model, tokenizer, args, placement)


def make_hf_engine(model, tokenizer, args: VerlConfig, placement: Placement | None = None) -> RolloutEngine:
    """The HF engine in the form `rollout_hf_weights` asks for ('auto': see VerlConfig)."""
    zero_stage = placement.zero_stage if placement is not None else None
    sharded = placement is not None and placement.shards_weights
    form = args.rollout_hf_weights
    if form == "auto":
        # Under ZeRO-3 the shared form gathers the whole model for every generate call; sampling from a copy is
        # about 7x faster (benchmarks/sync.py). On a CPU under bf16/fp16 mixed precision the shared form decodes
        # from the fp32 master weights (autocast re-casts them every step); a half-precision copy decodes 1.2x
        # faster (0.51 vs 0.60 s for 16 x 64 tokens, 20.7M Llama, AVX512-BF16) for a 3 ms copy per sync. Not
        # on GPUs (memory matters more there and autocast is cheap) and not for LoRA (the copy would hold the
        # whole base model again).
        mixed = rollout_dtype(args, model) != next(model.parameters()).dtype
        cpu_copy = mixed and not torch.cuda.is_available() and not hasattr(model, "get_base_model") and zero_stage is None
        form = "copy" if sharded or cpu_copy else "shared"
    eos = eos_token_ids(model, tokenizer)
    if form == "shared":
        if args.rollout_dtype != "auto":
            raise ValueError(f"rollout_dtype={args.rollout_dtype!r} needs an engine with its own weights; set "
                             f"rollout_hf_weights='copy' (or leave rollout_dtype='auto').")
        return HFSharedEngine(model, tokenizer.pad_token_id, eos)
    return HFCopyEngine.of(model, tokenizer.pad_token_id, eos, dtype=rollout_dtype(args, model), device=args.device,
                           attn_implementation=preferred_attention(args, model.config, training=False))


# Eager attention beats SDPA's CPU kernels in bf16 at short lengths, measured on a 20.7M Llama (AVX512-BF16,
# 16 x 80 tokens): decoding 0.38 vs 0.47 s, forward + backward 0.27 vs 0.35 s; equal at 528 tokens. It holds
# the (rows, heads, T, T) probabilities (fp32 and bf16, 6 bytes each) that SDPA does not: for training, of
# every layer until backward; for generation, of one layer at a time. It is chosen only while they fit here.
EAGER_ATTENTION_BUDGET_BYTES = 2**30


def preferred_attention(args: VerlConfig, config, training: bool) -> str | None:
    """'eager' for bf16 on a CPU when its attention probabilities fit EAGER_ATTENTION_BUDGET_BYTES (training:
    all layers of one micro-batch; generation: one layer of a round); None: the model's own choice."""
    if not args.bf16 or torch.cuda.is_available() or config is None:
        return None
    text = config.get_text_config(decoder=True)
    heads, layers = getattr(text, "num_attention_heads", None), getattr(text, "num_hidden_layers", None)
    if not heads or not layers:
        return None
    length = args.max_prompt_length + args.max_response_length
    rows = args.per_device_train_batch_size if training else args.rollout_generation_batch_size
    held = rows * heads * length**2 * 6 * (layers if training else 1)
    return "eager" if held <= EAGER_ATTENTION_BUDGET_BYTES else None


def rollout_dtype(args: VerlConfig, model) -> torch.dtype:
    """The engine's weight dtype: as configured; for 'auto' the mixed-precision dtype when training uses one
    (the forward passes already compute in it, and the copy takes half the memory), else the weights' own."""
    if args.rollout_dtype != "auto":
        return getattr(torch, args.rollout_dtype)
    if args.bf16:
        return torch.bfloat16
    if args.fp16:
        return torch.float16
    return next(model.parameters()).dtype


def make_vllm_engine(model, tokenizer, args: VerlConfig, adapter: dict | None = None, processor=None) -> RolloutEngine:
    """A colocated vLLM engine for this process, sized from VerlConfig; filled by the weight sync (with LoRA
    kernels for `adapter`'s rank when it serves the adapter; taking image prompts with `processor`)."""
    from ..sync.adapter import engine_lora_rank
    from .vllm_engine import VLLMEngine
    from .vllm_version import check_vllm_version

    check_vllm_version()  # an unsupported vLLM is refused in one line before anything is built
    tp = args.rollout_tensor_parallel_size
    if args.world_size % tp:
        raise ValueError(f"rollout_tensor_parallel_size={tp} must divide the number of processes "
                         f"({args.world_size}); e.g. {args.world_size} or 1.")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kv_mb = args.vllm_kv_cache_mb or (None if torch.cuda.is_available() else 256)
    dtype = rollout_dtype(args, base)
    return VLLMEngine(
        base.config, tokenizer.pad_token_id, eos_token_ids(model, tokenizer), dtype=dtype,
        seed=args.seed + args.process_index // tp,  # one seed per data-parallel rank, shared inside a TP group
        max_model_len=args.vllm_max_model_len or args.max_prompt_length + args.max_response_length,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        kv_cache_memory_bytes=kv_mb * 2**20 if kv_mb else None, tensor_parallel_size=tp,
        distributed=args.world_size > 1, sleep_level=args.vllm_sleep_level, return_routes=args.routing_replay,
        enforce_eager=args.vllm_enforce_eager,
        lora_rank=engine_lora_rank(adapter) if adapter else None, processor=processor,
    )


def make_vllm_server_engine(model, tokenizer, args: VerlConfig, adapter: dict | None = None,
                             processor=None) -> RolloutEngine:
    """A client of the running vLLM server at vllm_server_url (checked now, before any training), serving
    `adapter` with the server's LoRA kernels when given."""
    from ..sync.adapter import engine_lora_rank
    from .vllm_server import VLLMServerEngine

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return VLLMServerEngine(args.vllm_server_url, base.config, tokenizer.pad_token_id, eos_token_ids(model, tokenizer),
                            max_model_len=args.max_prompt_length + args.max_response_length,
                            timeout_s=args.vllm_server_timeout_s,
                            lora_rank=engine_lora_rank(adapter) if adapter else None, processor=processor)
