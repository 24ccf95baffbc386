"""The weight sync (training weights -> the rollout engine's copy): bucket size and verification."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from .applies import HF_ENGINE, _help, raise_first_failed

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


def check_sync(cfg) -> None:
    raise_first_failed(cfg, [("sync_bucket_mb", cfg.sync_bucket_mb > 0, "must be > 0")])
