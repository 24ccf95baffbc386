"""The one step of `VerlConfig` that acts on the process: on a machine without GPUs, several processes under
DeepSpeed or FSDP2 need their process group made (gloo) before `TrainingArguments` makes its own.

It runs inside the config's construction, just before `TrainingArguments.__post_init__`, because that is
where transformers creates the process state (its `__post_init__` reads `self.device`, which builds the
`PartialState`): a state made later could not replace it. Every side effect of building a config is here,
and it does nothing in one process or on a GPU machine.
"""

from __future__ import annotations

import os

from .machine import fsdp_version_wanted, wants_deepspeed


def set_up_process(cfg) -> None:
    """The process group for CPU DeepSpeed or CPU FSDP2 under several processes; no-op otherwise."""
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if not several or _cuda():
        return
    if wants_deepspeed(cfg):
        _set_up_cpu_deepspeed(cfg)
    elif fsdp_version_wanted(cfg) == 2:
        _set_up_cpu_fsdp2(cfg)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _set_up_cpu_deepspeed(cfg) -> None:
    """DeepSpeed under several processes on a machine without GPUs: accelerate would give every rank
    num_processes=1 and the first collective crashes ("ProcessGroupGloo::allgather: invalid output tensor
    list"). Creating the process state with the gloo backend first, and telling the Trainer to use it, fixes
    it (measured, ../shared/design/CPU-STACK.md); users need no workaround."""
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # DeepSpeed's CPU shared-memory all-reduce (deepspeed_shm_comm) has a start-up race: a rank maps its peer's
    # buffer as soon as the name exists, before the peer has written it (shm.cpp, shared_create/shared_open);
    # we saw a rank abort (SIGABRT) in about 1 of 10 two-process starts. Plain gloo collectives instead.
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    from accelerate import PartialState

    PartialState(backend="gloo")
    _use_configured_state(cfg)


def _set_up_cpu_fsdp2(cfg) -> None:
    """FSDP2 under several processes on a machine without GPUs: accelerate would run plain DDP (its FSDP branch
    is for GPU-like devices), silently unsharded. The process group is made here (gloo, on the CPU) and the
    Trainer told to use it; VerlTrainer then puts the FSDP plugin into the accelerator's state
    (distributed.install_cpu_fsdp)."""
    if cfg.fp16:
        raise ValueError("fp16 under FSDP2 on a machine without GPUs: its gradient scaler is GPU-only; use "
                         "--mixed_precision bf16 or no.")
    config = cfg.fsdp_config if isinstance(cfg.fsdp_config, dict) else {}
    offload = (os.environ.get("FSDP_OFFLOAD_PARAMS", "").lower() == "true" or "offload" in str(cfg.fsdp)
               or str(config.get("cpu_offload", config.get("offload_params", ""))).lower() == "true")
    if offload:
        raise ValueError("fsdp_offload_params=true on a machine without GPUs: the shards already live in CPU memory "
                         "(and FSDP2's offload pins memory, which needs an accelerator); set fsdp_offload_params: "
                         "false in the accelerate config (--fsdp_offload_params false).")
    from accelerate import PartialState

    PartialState(cpu=True, backend="gloo")
    _use_configured_state(cfg)


def _use_configured_state(cfg) -> None:
    """The Trainer's accelerator then takes the process state made here."""
    if cfg.accelerator_config is None or isinstance(cfg.accelerator_config, dict):
        cfg.accelerator_config = {**(cfg.accelerator_config or {}), "use_configured_state": True}
