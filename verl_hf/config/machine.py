"""What the machine and the launcher decide: a fast bf16, a GPU, DeepSpeed or FSDP asked for by `accelerate
launch`. Read-only: nothing here changes the config or the process.
"""

from __future__ import annotations

import functools
import os


@functools.cache  # a property of the machine; every VerlConfig asks
def bf16_is_fast() -> bool:
    """The hardware multiplies bf16 several times faster than fp32: a CUDA GPU with bf16, or a CPU with bf16
    matrix instructions (AVX512-BF16, AMX; measured on an AMD EPYC with AVX512-BF16: 1000 vs 210 GFLOP/s)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported(including_emulation=False)  # emulated bf16 (sm < 80) is slow
    if other_accelerator():
        return False  # MPS, XPU, HPU, NPU...: not measured here, so the user decides
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def other_accelerator() -> bool:
    """An accelerator other than CUDA is present (then nothing here moves training to the CPU)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available() and not torch.cuda.is_available())


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def wants_deepspeed(cfg) -> bool:
    return bool(cfg.deepspeed) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"


def fsdp_version_wanted(cfg) -> int | None:
    """The FSDP version the run asks for: `fsdp=` in the config (transformers' default version is 2), else an
    `accelerate launch` FSDP config (accelerate's default is 1); None without FSDP."""
    if cfg.fsdp:
        config = cfg.fsdp_config if isinstance(cfg.fsdp_config, dict) else {}
        return int(config.get("version", 2))
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return int(os.environ.get("FSDP_VERSION", "1"))
    return None
