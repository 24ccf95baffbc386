"""The weight sync (training weights -> the rollout engine's copy): bucket size and verification."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from .applies import HF_ENGINE, VLLM_WITH_LORA, _help, one_of, raise_first_failed

VLLM_LORA_MODES = ("auto", "merge", "adapter")

VLLM_FUSES = ("sync_verify compares weights by their HF names, and vLLM keeps fused weights (qkv_proj, gate_up_proj); "
              "vLLM is checked by its log-probs instead (tests/test_rollout_vllm.py)")


@dataclass
class SyncFields:
    sync_bucket_mb: float = field(
        default=256.0,
        metadata=_help("Bucket size of the weight sync: at most this much is gathered from ZeRO-3 shards at once "
                       "(raised with a warning to the largest single weight)."),
    )
    sync_verify: Annotated[bool, HF_ENGINE.because(VLLM_FUSES)] = field(
        default=False,
        metadata=_help("After every sync compare the engine's weights with the gathered training weights, "
                       "bitwise, and fail on any difference (costs a second gather)."),
    )
    vllm_lora: Annotated[str, VLLM_WITH_LORA] = field(
        default="auto",
        metadata=_help(f"How vLLM samples for a LoRA policy: {VLLM_LORA_MODES}. 'adapter': the engine loads the base "
                       "once and each sync sends only the adapter (megabytes), applied by vLLM's LoRA kernels as a new "
                       "version; 'merge': each sync sends the whole model with the adapter merged in; 'auto': the "
                       "adapter where the engine and the adapter's settings allow it (colocated vLLM on a GPU "
                       "machine, or a server started with --lora-rank; not DoRA, biases, modules_to_save, embedding "
                       "or LM-head targets), else merge, saying why (without a GPU vLLM's LoRA kernels generate "
                       "slower than merged weights by more than the sync saves)."),
    )


def check_sync(cfg) -> None:
    raise_first_failed(cfg, [("sync_bucket_mb", cfg.sync_bucket_mb > 0, "must be > 0")])
    one_of("vllm_lora", cfg.vllm_lora, VLLM_LORA_MODES)
