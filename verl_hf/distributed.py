"""Neutral DeepSpeed / torch.distributed helpers, used by the rollout engines, the roles, the weight sync and
the trainer's setup alike (so that none of them imports another's internals).

Every helper works without torch.distributed or DeepSpeed: one process, rank 0, plain parameters, no ZeRO.

See it work: tests/test_sync_zero3.py, tests/test_distributed.py.
"""

from __future__ import annotations

import contextlib

import torch


def process_rank() -> int:
    """This process's global rank; 0 without torch.distributed."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_zero3(model_or_params) -> bool:
    """True when any parameter (of a module, or in an iterable) is a DeepSpeed ZeRO-3 partition."""
    params = model_or_params.parameters() if isinstance(model_or_params, torch.nn.Module) else model_or_params
    return any(hasattr(p, "ds_id") for p in params)


def gathered_params(params: list[torch.Tensor]):
    """A context in which ZeRO-3 parameters hold their full tensors (DeepSpeed's GatheredParameters, one
    all-gather); a no-op for ordinary parameters."""
    if not is_zero3(params):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def whole_model(model: torch.nn.Module):
    """A context holding every parameter of `model` in full: under ZeRO-3 one gather for a whole `generate`
    call, since otherwise the partitioned layers would be gathered again for every generated token.
    Elsewhere a no-op."""
    return gathered_params(list(model.parameters()))


def zero_stage(accelerator) -> int | None:
    """The DeepSpeed ZeRO stage an `accelerate.Accelerator` runs with; None without DeepSpeed."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return getattr(plugin, "zero_stage", None)


def deepspeed_inference(accelerator, model):
    """`model` in a DeepSpeed inference engine with the run's ZeRO-3 settings (no optimizer): sharded like
    the actor, gathered layer by layer in each forward. Returns the engine."""
    import copy

    import deepspeed

    config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    hidden = getattr(model.config, "hidden_size", None) or 1024
    zero = config.setdefault("zero_optimization", {})
    # deepspeed.initialize does not resolve 'auto' (accelerate does when it prepares a model): its sizes here.
    for key, value in (("reduce_bucket_size", hidden * hidden), ("stage3_prefetch_bucket_size", int(0.9 * hidden * hidden)),
                       ("stage3_param_persistence_threshold", 10 * hidden)):
        if zero.get(key) == "auto":
            zero[key] = value
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()
    return engine
