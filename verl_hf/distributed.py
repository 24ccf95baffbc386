"""Neutral DeepSpeed / FSDP2 / torch.distributed helpers, used by the rollout engines, the roles, the weight
sync and the trainer's setup alike (so that none of them imports another's internals).

Every helper works without torch.distributed, DeepSpeed or FSDP: one process, rank 0, plain parameters.

See it work: tests/test_sync_zero3.py, tests/test_distributed.py, tests/test_fsdp2.py.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys

import torch


def process_rank() -> int:
    """This process's global rank; 0 without torch.distributed."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def close_process_group_at_exit() -> None:
    """Destroy torch.distributed's default process group when this process exits cleanly (registered once).

    Why: a gloo group left to interpreter shutdown is sometimes torn down while its worker threads are still
    joinable, and the process aborts after a successful run ("terminate called without an active exception",
    SIGABRT; pytorch/pytorch#190489). CI saw it about once a suite in two-process runs. Not when the process
    ends with an uncaught exception: a peer may be waiting in a collective, and the launcher ends them all."""
    if not getattr(close_process_group_at_exit, "registered", False):
        close_process_group_at_exit.registered = True
        atexit.register(_destroy_process_group_if_clean)


def _destroy_process_group_if_clean() -> None:
    import torch.distributed as dist

    failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # set for an uncaught exception
    if failed is None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_zero3(model_or_params) -> bool:
    """True when any parameter (of a module, or in an iterable) is a DeepSpeed ZeRO-3 partition."""
    params = model_or_params.parameters() if isinstance(model_or_params, torch.nn.Module) else model_or_params
    return any(hasattr(p, "ds_id") for p in params)


def is_dtensor(p) -> bool:
    """True for a DTensor parameter (FSDP2's `fully_shard`, or tensor parallelism)."""
    return type(p).__name__ == "DTensor" or getattr(p, "_local_tensor", None) is not None


def mesh_device(t) -> torch.device:
    """Where a DTensor's collectives and its module's forward run: its mesh's device (with FSDP2's CPU offload
    the shard itself lives on the CPU)."""
    kind = t.device_mesh.device_type
    return torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def compute_device(model: torch.nn.Module) -> torch.device:
    """The device `model` computes on: its parameters' device, or for FSDP2 its mesh's device."""
    first = next(model.parameters())
    return mesh_device(first) if is_dtensor(first) else first.device


def is_fsdp2(model_or_params) -> bool:
    """True when any parameter is a DTensor, i.e. the model is sharded by FSDP2's `fully_shard`."""
    params = model_or_params.parameters() if isinstance(model_or_params, torch.nn.Module) else model_or_params
    return any(is_dtensor(p) for p in params)


def is_sharded(model) -> bool:
    """Each process holds only part of `model`'s weights (ZeRO-3 or FSDP2): its forward is a collective."""
    return is_zero3(model) or is_fsdp2(model)


def held_tensor(p: torch.Tensor) -> torch.Tensor:
    """The part of `p` this process holds: its ZeRO-3 partition (`p.data` is empty then), its FSDP2 shard, or
    `p` itself."""
    partition = getattr(p, "ds_tensor", None)
    if partition is not None:
        return partition
    return p.to_local() if is_dtensor(p) else p.data


def local_parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of `model`'s parameters this process holds: its ZeRO-3 partitions, its FSDP2 shards, or all of them."""
    return sum(held.numel() * held.element_size() for held in map(held_tensor, model.parameters()))


def full_tensor(t) -> torch.Tensor:
    """`t` whole on this process: DTensor's own gather (`full_tensor()`, a collective), else `t` itself."""
    return t.full_tensor() if is_dtensor(t) else t


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


def sum_over_processes(accelerator):
    """`reduce_sum(tensor) -> tensor`: the sum over every training process (every rank calls it together), the
    tensor itself in one process."""
    if accelerator.num_processes == 1:
        return lambda values: values
    return lambda values: accelerator.reduce(values, reduction="sum")


def zero_stage(accelerator) -> int | None:
    """The DeepSpeed ZeRO stage an `accelerate.Accelerator` runs with; None without DeepSpeed."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return getattr(plugin, "zero_stage", None)


def fsdp_version(accelerator) -> int | None:
    """The FSDP version (1 or 2) an `accelerate.Accelerator` runs with; None without FSDP."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    return None if plugin is None else getattr(plugin, "fsdp_version", 1)


def sharded_like_actor(accelerator, model: torch.nn.Module, frozen: bool = True) -> torch.nn.Module:
    """Under FSDP2: `model` (a frozen role, or the critic with `frozen=False`) sharded in place as accelerate
    shards the actor: each decoder layer its own `fully_shard` unit (the plugin's layer classes where this
    model has them, else its own `_no_split_modules`), the rest in the root, on the run's mesh, with its
    mixed-precision and CPU-offload settings. A trained role keeps fp32 master weights under mixed precision
    (as accelerate gives the actor) and the run's reshard setting; a frozen one, which has no backward to free
    its gathered weights, reshards after every forward, root included. Elsewhere returned as it is.

    Not accelerate's `fsdp2_prepare_model`: that one fixes the plugin's layer classes on the first model it
    sees (the actor's), so a reward model of another architecture could not be sharded after it."""
    if fsdp_version(accelerator) != 2 or is_fsdp2(model):
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    plugin = accelerator.state.fsdp_plugin
    if not frozen and accelerator.mixed_precision != "no":
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.float()
    # cpu_ram_efficient_loading: transformers loaded the weights on rank 0 only (zeros elsewhere)
    loaded = model.state_dict() if plugin.cpu_ram_efficient_loading else None
    mesh = getattr(accelerator, "torch_device_mesh", None)
    kwargs = {"offload_policy": plugin.cpu_offload, "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
              "mesh": mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)] if mesh is not None else None}
    names = {type(m).__name__ for m in model.modules()}
    layer_classes = set(plugin.transformer_cls_names_to_wrap or ()) & names or set(
        getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules())[1:]:
        if type(module).__name__ in layer_classes:
            fully_shard(module, reshard_after_forward=True if frozen else plugin.reshard_after_forward, **kwargs)
    fully_shard(model, **kwargs, **({"reshard_after_forward": True} if frozen else {}))
    if loaded is not None:
        set_model_state_dict(model, loaded, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model


def shard_actor(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Under FSDP2: the policy sharded now, as the Trainer's `prepare` would shard it when training starts
    (accelerate's own activation checkpointing and `fsdp2_prepare_model`), so that it is placed as under
    ZeRO-3 from the start: the reference, the engine's first sync and an evaluation before training see the
    real weights (with cpu_ram_efficient_loading only rank 0 loaded them), and no process ever holds the whole
    model. `prepare` then finds an FSDP module and keeps it. Elsewhere returned as it is."""
    if fsdp_version(accelerator) != 2 or is_fsdp2(model):
        return model
    from accelerate.utils import fsdp2_apply_ac, fsdp2_prepare_model

    plugin = accelerator.state.fsdp_plugin
    plugin.set_auto_wrap_policy(model)
    if plugin.activation_checkpointing:
        model = fsdp2_apply_ac(accelerator, model)
    return fsdp2_prepare_model(accelerator, model)


@contextlib.contextmanager
def actor_already_prepared(accelerator):
    """Around the Trainer's `prepare` of a policy that `shard_actor` sharded (and checkpointed) already: the
    plugin's activation checkpointing off meanwhile, since accelerate would wrap every layer a second time (its
    policy sees through the wrappers). Restored after: the plugin belongs to the process's accelerator state."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is None or getattr(plugin, "fsdp_version", 1) != 2:
        yield
        return
    applied, plugin.activation_checkpointing = plugin.activation_checkpointing, False
    try:
        yield
    finally:
        plugin.activation_checkpointing = applied


def full_state_dicts(model: torch.nn.Module, optimizer=None, trainable_only: bool = False) -> tuple[dict, dict | None]:
    """An FSDP2 model's (and its optimizer's) state gathered whole, on the CPU: (weights, optimizer state or
    None). A collective: every process calls it; the full tensors arrive on rank 0 (the others get empty dicts:
    `cpu_offload` keeps them there only). `trainable_only`: leave frozen weights out (a LoRA model's base)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    weights = get_model_state_dict(model, options=options)
    # Tied weights (a shared embedding and LM head) come back as two copies; one tensor under both names again,
    # so that save_pretrained drops the tied name as it does for an unsharded model.
    first_name: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first = first_name.setdefault(id(p), name)
        if first != name and first in weights and name in weights:
            weights[name] = weights[first]
    return weights, get_optimizer_state_dict(model, optimizer, options=options) if optimizer is not None else None


def load_full_state_dicts(model: torch.nn.Module, optimizer, weights: dict, optimizer_state: dict | None) -> None:
    """Load full (unsharded) state into an FSDP2 model and its optimizer; each process keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    if optimizer is not None and optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def install_cpu_fsdp(accelerator, plugin_args: dict | None) -> bool:
    """On a machine without GPUs accelerate never turns FSDP on (its FSDP branch lists GPU-like devices only):
    under `accelerate launch` with an FSDP config it runs DDP instead, silently. VerlConfig has already made the
    process group (gloo, CPU); this puts the FSDP plugin into the accelerator's state, so that `prepare`
    shards with `fully_shard` as on GPUs. Called for runs that ask for FSDP2 (config.fsdp_version_wanted); True
    when it did. Measured: tests/test_fsdp2.py."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if getattr(state, "fsdp_plugin", None) is not None or torch.cuda.is_available():
        return False
    if accelerator.num_processes < 2:
        logging.getLogger(__name__).warning("FSDP with one process on a machine without GPUs: nothing to shard "
                                            "over, so it trains unsharded (launch --num_processes 2 or more).")
        return False
    plugin = FullyShardedDataParallelPlugin(**(plugin_args or {}))
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin, state.distributed_type = plugin, DistributedType.FSDP
    return True


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
