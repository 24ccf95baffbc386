"""Whether vLLM serves a LoRA policy as an adapter (`vllm_lora`), decided before any model loads: what the
adapter's settings allow (sync/adapter.py), what the engine offers (a server started for LoRA, a GPU), and the
settings that rule it out. `VerlTrainer` calls `lora_serving` once; the answer configures the engine and the
weight sync.

See it work: tests/test_sync_adapter.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .config import VerlConfig

logger = logging.getLogger("verl_hf.trainer_setup")  # where users' log filters already look for setup notices


# Measured (python benchmarks/sync.py --lora, 112M Llama, fp32, AVX2-only AMD EPYC): the adapter's sync takes 1.3%
# of the merged sync's seconds (0.01 against 0.80 s), but vLLM's CPU LoRA kernels generate at 0.53-0.64x the
# merged weights' tokens/s, which costs a round far more than the sync saves. GPUs keep the adapter.
CPU_LORA_KERNELS = ("on a machine without a GPU vLLM's LoRA kernels generate at 0.53-0.64x the merged weights' "
                    "tokens/s (benchmarks/sync.py --lora), more than the adapter's sync saves; "
                    "vllm_lora='adapter' serves it anyway")


def _server_without_adapters(args: VerlConfig, lora) -> str:
    """Why the vLLM server cannot serve the adapter ("" when it can): asked of the server itself."""
    from .rollout.vllm_server import server_call, server_lora_problem, server_lora_routes_problem
    from .sync.adapter import engine_lora_rank, vllm_adapter_config

    if args.partial_rollouts:
        return "partial_rollouts continue a response with new weights, and a request keeps its adapter version"
    info = server_call(args.vllm_server_url.rstrip("/"), "GET", "/server_info?config_format=json", None,
                       args.vllm_server_timeout_s)
    url = args.vllm_server_url.rstrip("/")
    return (server_lora_problem(info["vllm_config"].get("lora_config"), engine_lora_rank(vllm_adapter_config(lora)),
                                url) or server_lora_routes_problem(url, args.vllm_server_timeout_s))


def lora_serving(args: VerlConfig, lora, vision: bool = False) -> dict | None:
    """The adapter config vLLM serves a LoRA policy with (`lora`: its PEFT config; sync/adapter.py), or None
    when the sync merges it: vllm_lora='merge', no LoRA, an engine without adapters, or 'auto' where the adapter
    cannot be served (said once, with why). vllm_lora='adapter' where it cannot be is refused, before any model
    loads. `vision`: a vision run (vLLM's LoRA kernels on a vision-language model are not measured)."""
    from .sync.adapter import adapter_refusal, vllm_adapter_config

    if lora is None or args.rollout_engine not in ("vllm", "vllm_server") or args.vllm_lora == "merge":
        return None
    why = adapter_refusal(lora) or (_server_without_adapters(args, lora) if args.rollout_engine == "vllm_server" else "")
    if not why and vision:
        why = ("the run shows the model images (image prompts, or a vision-language processor with tools or an "
               "environment): vLLM's LoRA kernels on a vision-language model (adapter names inside its language "
               "model) are not measured here")
    if not why and args.vllm_sleep_level:
        why = (f"vllm_sleep_level={args.vllm_sleep_level}: whether vLLM's sleep mode keeps the base weights and the "
               f"loaded adapter is not measured (level 2 drops the weights, which the adapter's syncs never push again)")
    if not why and args.vllm_lora == "auto" and args.rollout_engine == "vllm" and not torch.cuda.is_available():
        why = CPU_LORA_KERNELS
    if not why:
        return vllm_adapter_config(lora)
    if args.vllm_lora == "adapter":
        raise ValueError(f"vllm_lora='adapter' cannot serve this LoRA policy to vLLM: {why}. Set vllm_lora='merge' "
                         f"(or 'auto', which merges it then).")
    logger.warning("vllm_lora='auto': the LoRA adapter is merged into the whole model at every sync, because %s.", why)
    return None
