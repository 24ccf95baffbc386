"""What DeepSpeed and FSDP allow: FSDP runs as FSDP2, and the settings that cannot work sharded yet."""

from __future__ import annotations

from .machine import fsdp_version_wanted


def check_parallel(cfg) -> None:
    """FSDP runs as FSDP2 (`fully_shard`); FSDP1 (FlatParameter) has no gather path in the weight sync."""
    version = fsdp_version_wanted(cfg)
    if version is None:
        return
    if version != 2:
        raise ValueError(f"FSDP version {version} (FSDP1) is not supported: the weight sync gathers FSDP2's "
                         f"DTensor parameters. Set `fsdp_version: 2` in the accelerate config (fsdp_config), or "
                         f"fsdp_config={{'version': 2}} with fsdp= in VerlConfig.")
    if cfg.rollout_hf_weights == "shared":
        raise ValueError("rollout_hf_weights='shared' under FSDP2 would gather every layer again for each generated "
                         "token; use rollout_hf_weights='copy' (what 'auto' picks under FSDP2) or rollout_engine='vllm'.")
