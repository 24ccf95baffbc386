"""A LoRA policy served to vLLM as an adapter (`vllm_lora='adapter'`): what is sent at a sync, and when it can be.

The engine loads the base weights once (the first sync pushes every LoRA module's base weight unmerged), then
each sync sends only the adapter's lora_A / lora_B tensors under PEFT's checkpoint names
(`base_model.model.<module>.lora_A.weight`) with the adapter's config; vLLM applies them with its own LoRA
kernels as a new adapter version (rollout/vllm_lora.py). Under ZeRO-3 and FSDP2 only those small tensors are
gathered: the base is never gathered again (`sync/base_tensors` counts what a sync gathered of it).

`adapter_refusal` says why a LoRA setting cannot be served as an adapter (vLLM's PEFT reader rejects it, or we
have not measured it); 'auto' then merges, 'adapter' is refused, before any model loads.

See it work: tests/test_sync_adapter.py, tests/test_architectures.py (colocated vLLM, Llama/Qwen3/Phi-3).
"""

from __future__ import annotations

import contextlib

import torch

from ..distributed import full_tensor, gathered_params, is_dtensor, process_rank
from .gather import Unit
from .names import engine_name

# Ranks vLLM's LoRA kernels are built for (vllm.config.lora.MaxLoRARanks); the engine takes the smallest >= r.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Linear-layer adapters only: vLLM's embedding/LM-head LoRA needs its own vocabulary handling, not measured here.
UNSERVED_TARGETS = ("embed_tokens", "lm_head", "wte", "embed_in", "embed_out")
UNSERVED_VARIANTS = ("layer_replication", "alora_invocation_tokens", "use_qalora", "trainable_token_indices",
                     "use_bdlora", "arrow_config")


def lora_config_of(model, peft_config):
    """The LoRA config the policy trains with: `peft_config` as given, or an already wrapped PeftModel's; None
    when the policy has no LoRA adapter."""
    if peft_config is None and hasattr(model, "peft_config"):
        configs = model.peft_config
        if len(configs) > 1:
            return configs  # several adapters: adapter_refusal says why not
        peft_config = next(iter(configs.values()), None)
    return peft_config if getattr(peft_config, "peft_type", None) is not None else None


def adapter_refusal(config) -> str:
    """Why this LoRA config cannot be served as a vLLM adapter; "" when it can."""
    if isinstance(config, dict):
        return f"the policy has {len(config)} PEFT adapters ({sorted(config)}); one adapter is served at a time"
    peft_type = str(getattr(config, "peft_type", "")).split(".")[-1]
    if peft_type != "LORA":
        return f"peft_type={peft_type} is not LoRA"
    largest = max([config.r, *(config.rank_pattern or {}).values()])
    checks = [
        (config.use_dora, "DoRA (use_dora=True): vLLM has no DoRA kernels"),
        (getattr(config, "lora_bias", False), "lora_bias=True: vLLM has no LoRA bias"),
        (config.bias != "none", f"bias={config.bias!r}: vLLM applies no trained biases with an adapter"),
        (config.modules_to_save, f"modules_to_save={list(config.modules_to_save or [])}: vLLM serves full copies "
                                 f"of modules only for classifier heads"),
        (unserved_targets(config.target_modules),
         f"target_modules={config.target_modules!r} includes an embedding or the LM head"),
        (getattr(config, "target_parameters", None), "target_parameters (MoE experts): not measured with vLLM yet"),
        (isinstance(config.init_lora_weights, str) and config.init_lora_weights.lower() in
         ("pissa", "olora", "corda", "loftq") or str(config.init_lora_weights).startswith("pissa"),
         f"init_lora_weights={config.init_lora_weights!r} changes the base weights"),
        (largest > VLLM_MAX_LORA_RANKS[-1], f"rank {largest} is above vLLM's largest LoRA rank {VLLM_MAX_LORA_RANKS[-1]}"),
    ]
    # PEFT variants whose adapters are not a plain LoRA: vLLM would apply them as one, wrongly
    checks += [(getattr(config, name, None), f"{name}={getattr(config, name, None)!r}: not a plain LoRA for vLLM")
               for name in UNSERVED_VARIANTS]
    return next((why for failed, why in checks if failed), "")


def unserved_targets(targets) -> bool:
    """Whether LoRA `target_modules` (names, a regex string, or None: PEFT's defaults for the architecture, which
    are attention or MLP projections) reach an embedding or the LM head. A regex is judged by the names it
    mentions; the modules it matched are checked again at the first sync (`check_only_the_adapter_trains`)."""
    if targets is None:
        return False
    if isinstance(targets, str):
        return any(name in targets for name in UNSERVED_TARGETS)
    return any(t.rsplit(".", 1)[-1] in UNSERVED_TARGETS for t in targets)


def engine_lora_rank(adapter_config: dict) -> int:
    """vLLM's max_lora_rank for an adapter (`vllm_adapter_config`'s fields): the smallest kernel size that holds
    every module's rank."""
    largest = max([adapter_config["r"], *adapter_config["rank_pattern"].values()])
    return next(r for r in VLLM_MAX_LORA_RANKS if r >= largest)


def vllm_adapter_config(config) -> dict:
    """The adapter_config.json fields vLLM's PEFTHelper reads, from a PEFT LoraConfig."""
    targets = config.target_modules  # None (PEFT's defaults) until the model is wrapped: the sync names them
    return dict(r=config.r, lora_alpha=config.lora_alpha, use_rslora=bool(config.use_rslora),
                target_modules=sorted(targets) if isinstance(targets, (list, set, tuple)) else targets, bias="none",
                rank_pattern=dict(config.rank_pattern or {}), alpha_pattern=dict(config.alpha_pattern or {}))


def check_only_the_adapter_trains(model: torch.nn.Module, units: list[Unit]) -> None:
    """Serving the adapter pushes the base once: a trainable weight outside the adapter would go stale. Also
    the modules the adapter adapts, as wrapped (a regex or PEFT's defaults name them only now)."""
    outside = [n for n, p in model.named_parameters() if p.requires_grad and ".lora_" not in n]
    if outside:
        raise ValueError(f"vllm_lora='adapter' pushes the base weights once, but {outside[0]!r} ({len(outside)} "
                         f"weights outside the LoRA adapter) trains: the engine would sample with its first value. "
                         f"Freeze it, or set vllm_lora='merge'.")
    adapted = adapted_modules(units)
    if unserved_targets(adapted):
        raise ValueError(f"vllm_lora='adapter': the LoRA adapter adapts {adapted}, an embedding or the LM head, "
                         f"which vLLM's LoRA kernels are not measured on here; set vllm_lora='merge'.")


def adapted_modules(units: list[Unit]) -> list[str]:
    """The module names (last part) the LoRA adapter adapts: vLLM's `target_modules` for it."""
    return sorted({engine_name(u.name).rsplit(".", 1)[-1] for u in adapter_units(units)})


def adapter_units(units: list[Unit]) -> list[Unit]:
    return [u for u in units if u.lora]


def adapter_params(unit: Unit) -> list[tuple[str, torch.nn.Parameter]]:
    """(PEFT checkpoint name, parameter) of a LoRA module's A and B, e.g.
    'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'."""
    module, adapter = engine_name(unit.name), unit.module.active_adapters[0]  # one adapter (adapter_refusal)
    return [(f"base_model.model.{module}.{part}.weight", getattr(unit.module, part)[adapter].weight)
            for part in ("lora_A", "lora_B")]


@contextlib.contextmanager
def adapter_tensors(units: list[Unit], dst: int | None = None):
    """{PEFT name: full tensor} of every LoRA module's A and B, gathered (ZeRO-3, FSDP2) without touching the base
    weights; with `dst`, only that rank receives them (the others get {}). Valid inside the block."""
    named = [pair for unit in adapter_units(units) for pair in adapter_params(unit)]
    with gathered_params([p for _, p in named]):  # ZeRO-3: these small tensors only
        receives = dst is None or process_rank() == dst
        tensors = {}
        for name, p in named:
            full = full_tensor(p.detach()) if is_dtensor(p) else p.detach()  # FSDP2: a collective on every rank
            if receives:
                tensors[name] = full
        try:
            yield tensors
        finally:
            tensors.clear()
