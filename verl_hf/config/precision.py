"""Precision: the `bf16` field (None picks it by the machine) and its resolution."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .applies import _help
from .machine import bf16_is_fast, other_accelerator, wants_deepspeed


@dataclass
class PrecisionFields:
    bf16: bool | None = field(
        default=None,
        metadata=dict(nargs="?", const=True, **_help("bf16 mixed precision: fp32 master weights, forward and backward under bf16 autocast, "
                       "log-prob arithmetic in fp32, rollouts in bf16. None (default): on where bf16 is fast "
                       "(a CUDA GPU with bf16, a CPU with AVX512-BF16/AMX; the update measured 2-3x faster) and "
                       "fp16 is off, except under DeepSpeed without a GPU or when `accelerate launch "
                       "--mixed_precision` chose; off elsewhere. A bare --bf16 means true.")),
    )


def resolve_bf16(cfg) -> None:
    """bf16=None becomes on or off (see the field); bf16 on a machine without a GPU runs on the CPU, so
    use_cpu is set rather than letting TrainingArguments stop with "Your setup doesn't support bf16/gpu"."""
    import torch

    on_cpu = not torch.cuda.is_available() and not other_accelerator()
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")  # `accelerate launch --mixed_precision ...`
    if cfg.bf16 is None and launcher:
        cfg.bf16 = launcher == "bf16"
    elif cfg.bf16 is None:
        cfg.bf16 = bool(not cfg.fp16 and bf16_is_fast() and not (on_cpu and wants_deepspeed(cfg)))
    if cfg.bf16 and on_cpu and not wants_deepspeed(cfg):
        cfg.use_cpu = True
