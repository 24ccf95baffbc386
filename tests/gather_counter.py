"""Counts the bytes each weight sync receives through collectives, independently of the sync's own metrics
(`sync/base_tensors`, `sync/gigabytes`): `install()` wraps torch.distributed's gathers and broadcast, the
all-gather DeepSpeed's ZeRO-3 takes (its communication backend holds its own reference to torch's function)
and DTensor's `full_tensor` (FSDP2), and `WeightSync.sync`, so that each sync appends the bytes this process
received to `SYNCS`. A sync that gathered a base weight shows its bytes. Used inside `accelerate launch` by
tests/test_architectures.py (`SCRIPT`)."""

from __future__ import annotations

import functools

SYNCS: list[int] = []
_received: list[int] | None = None  # bytes received by the sync in progress; None: no sync runs


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _counting(original, received):
    """`original`, adding what `received(args, kwargs, result)` says the call brought to the sync's count."""
    if getattr(original, "counted", False):
        return original

    @functools.wraps(original)
    def counted(*args, **kwargs):
        result = original(*args, **kwargs)
        if _received is not None:
            _received[0] += received(args, kwargs, result)
        return result

    counted.counted = True
    return counted


def _arg(args, kwargs, index, name):
    return kwargs[name] if name in kwargs else (args[index] if len(args) > index else None)


def _gather_bytes(args, kwargs, result) -> int:  # dist.gather(tensor, gather_list, dst): the world's pieces
    import torch.distributed as dist

    return _nbytes([_arg(args, kwargs, 0, "tensor")]) * dist.get_world_size(kwargs.get("group"))


RECEIVED = {  # torch.distributed function -> the bytes one call brings to this process
    "all_gather_into_tensor": lambda a, k, r: _nbytes([_arg(a, k, 0, "output_tensor")]),
    "_all_gather_base": lambda a, k, r: _nbytes([_arg(a, k, 0, "output_tensor")]),
    "all_gather": lambda a, k, r: _nbytes(_arg(a, k, 0, "tensor_list") or []),
    "gather": _gather_bytes,
    "broadcast": lambda a, k, r: _nbytes([_arg(a, k, 0, "tensor")]),
}


def _wrap_collectives() -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    for name, received in RECEIVED.items():
        setattr(dist, name, _counting(getattr(dist, name), received))
    DTensor.full_tensor = _counting(DTensor.full_tensor, lambda a, k, r: _nbytes([r]))
    try:
        import deepspeed.comm.comm as ds_comm
    except ImportError:
        return
    backend = getattr(ds_comm, "cdb", None)  # set once DeepSpeed initialised its communication
    if backend is not None and getattr(backend, "all_gather_function", None) is not None:
        backend.all_gather_function = _counting(backend.all_gather_function,
                                                lambda a, k, r: _nbytes([_arg(a, k, 0, "output_tensor")]))


def install() -> None:
    """Count every `WeightSync.sync` from now on (call before training starts)."""
    from verl_hf.sync.plugin import WeightSync

    original = WeightSync.sync

    def sync(self, model, engine):
        global _received
        _wrap_collectives()  # here: DeepSpeed's backend exists once the model is prepared
        _received = [0]
        try:
            return original(self, model, engine)
        finally:
            SYNCS.append(_received[0])
            _received = None

    WeightSync.sync = sync


SCRIPT = """
import json, os, sys
sys.path.insert(0, {tests!r})
import gather_counter
from verl_hf.cli import parse_config
from verl_hf.runner import run_training
gather_counter.install()
script, config = parse_config(sys.argv[1], sys.argv[2:])
run_training(script, config)
with open(os.path.join(config.output_dir, f"gathers{{os.environ['RANK']}}.json"), "w") as f:
    json.dump(gather_counter.SYNCS, f)
"""
