"""Layer 2 of the weight sync: full tensors from (possibly ZeRO-3- or FSDP2-sharded) training weights, bucket
by bucket.

Parameters are walked module by module in the model's order (layer order for HF models). Modules are packed
into buckets of at most `bucket_bytes` (whole numbered layers only), measured with `ds_numel` (the full size
of a ZeRO-3 partition; a DTensor's own numel is the full one); the extra memory is one bucket, never the whole model. A PEFT LoRA module is one unit: its base weight plus
`get_delta_weight` of each active adapter (PEFT's own merge math), so no full merged model is ever built.

ZeRO-3 weights are all-gathered straight from their partitions (`ds_tensor`: rank r holds elements
[r*P, (r+1)*P) of the flattened weight, zero-padded at the end), on gloo in pieces of at most `CHUNK_BYTES`
for all ranks together (`chunk_bytes_for`; NCCL takes each tensor whole). Deviation from
`deepspeed.zero.GatheredParameters`, which gathers a whole tensor at once: on gloo the collective keeps a
second full-size copy while it runs (measured: 187 MB extra for one 94 MB embedding, also with plain
torch.distributed.all_gather), so one large embedding would double the peak.
LoRA modules (PEFT reads their weights in place), offloaded or quantised partitions still go through
GatheredParameters, and `sync_verify` compares against GatheredParameters, an independent path.

FSDP2 weights (DTensors split by rows) take the same chunked gather from their local shards, each padded to
the common shard length. A LoRA module under FSDP2 is merged on its shards (PEFT's math runs on DTensors: the
small lora_A is gathered by DTensor itself) and the merged weight gathered once. `sync_verify` compares
against DTensor's own `full_tensor()`.

See it work: tests/test_sync.py, tests/test_distributed.py, tests/test_fsdp2.py.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field

import torch

from ..distributed import full_tensor, gathered_params, is_dtensor, is_zero3, mesh_device, process_rank  # noqa: F401  (is_zero3: its former home)
from .names import engine_name


@dataclass(eq=False)  # identity: units hold tensors, which have no truth value to compare
class Unit:
    """One module whose weights travel together: `name` (training module name), its own parameters."""

    name: str
    module: torch.nn.Module
    params: list[tuple[str, torch.nn.Parameter]] = field(default_factory=list)
    lora: bool = False

    @property
    def nbytes(self) -> int:
        return sum(full_numel(p) * p.element_size() for _, p in self.params)

    def engine_names(self) -> list[str]:
        """The engine names this unit pushes, in order: a LoRA module's merged weight (and bias), else one
        per parameter."""
        if not self.lora:
            return [engine_name(f"{self.name}.{n}" if self.name else n) for n, _ in self.params]
        has_bias = getattr(self.module.get_base_layer(), "bias", None) is not None
        return [engine_name(f"{self.name}.{n}") for n in ("weight", "bias")[: 1 + has_bias]]


def full_numel(p: torch.Tensor) -> int:
    """Elements of the whole tensor, also for a ZeRO-3 partition (whose own numel() is 0)."""
    return getattr(p, "ds_numel", p.numel())


def _is_lora(module) -> bool:
    return hasattr(module, "get_delta_weight") and hasattr(module, "lora_A") and hasattr(module, "base_layer")


def weight_units(model: torch.nn.Module) -> list[Unit]:
    """The model's modules with weights, in order; tied parameters appear once (first owner)."""
    units, seen, skip = [], set(), ()
    for name, module in model.named_modules():
        if skip and name.startswith(skip):
            continue
        if _is_lora(module):
            units.append(Unit(name, module, [(n, p) for n, p in module.named_parameters() if id(p) not in seen], True))
            skip = (*skip, name + ".")
        elif hasattr(module, "modules_to_save") and hasattr(module, "original_module"):
            # PEFT trains a full copy of this module; the active copy is what the engine must receive.
            active = module.modules_to_save[module.active_adapters[0]] if not module.disable_adapters else module.original_module
            units.append(Unit(name, active, [(n, p) for n, p in active.named_parameters() if id(p) not in seen]))
            skip = (*skip, name + ".")
        else:
            units.append(Unit(name, module, [(n, p) for n, p in module.named_parameters(recurse=False)
                                             if id(p) not in seen]))
        seen.update(id(p) for _, p in units[-1].params)
    return [u for u in units if u.params]


def layer_key(name: str) -> str:
    """The numbered layer a module belongs to ('model.layers.3.mlp.up_proj' -> 'model.layers.3'), else itself."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return name


def _layers(units: list[Unit]) -> list[list[Unit]]:
    """Consecutive units grouped by layer_key: a layer always travels in one bucket, because engines that fuse
    weights (vLLM's qkv_proj, gate_up_proj) must receive a layer's tensors in one load."""
    groups: list[list[Unit]] = []
    for unit in units:
        if groups and layer_key(groups[-1][0].name) == layer_key(unit.name):
            groups[-1].append(unit)
        else:
            groups.append([unit])
    return groups


def training_layers(units: list[Unit], trained: frozenset = frozenset()) -> tuple[list[Unit], frozenset]:
    """(the units of the layers in which some parameter trains now (requires_grad) or trained at the last sync
    (`trained`: their layer keys), each layer whole; the keys of the layers that train now). Only these can have
    changed since the last sync: a layer frozen after it may have been updated before it froze. The others (a
    frozen vision tower, the embeddings and norms of a LoRA policy) keep the values a full push gave the engine."""
    layers = _layers(units)
    now = frozenset(layer_key(layer[0].name) for layer in layers
                    if any(p.requires_grad for u in layer for _, p in u.params))
    return [unit for layer in layers if layer_key(layer[0].name) in now | trained for unit in layer], now


def plan_buckets(units: list[Unit], bucket_bytes: int) -> tuple[list[list[Unit]], int]:
    """(buckets of whole layers, the bucket size used). A layer larger than the bucket raises the bucket to its
    size with a warning (a layer is never split: fused engine weights and LoRA merges need it whole)."""
    layers = _layers(units)
    sizes = [sum(u.nbytes for u in layer) for layer in layers]
    largest = max(sizes, default=0)
    if largest > bucket_bytes:
        warnings.warn(f"sync_bucket_mb={bucket_bytes / 2**20:.1f} is smaller than the largest layer "
                      f"({largest / 2**20:.1f} MB); using {largest / 2**20:.1f} MB buckets.", stacklevel=2)
        bucket_bytes = largest
    buckets, current, size = [], [], 0
    for layer, layer_bytes in zip(layers, sizes):
        if current and size + layer_bytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current += layer
        size += layer_bytes
    if current:
        buckets.append(current)
    return buckets, bucket_bytes


CHUNK_BYTES = 4 * 2**20  # gloo all-gather peaks at ~4 MB pieces (1.4 GB/s vs 1.2 at 16 MB, 0.3 at 64 MB, 2 CPU processes)
WHOLE = 2**62  # a piece no tensor reaches: one collective per tensor


def chunk_bytes_for(backend: str, device_type: str) -> int:
    """The gather's piece size for a tensor on `device_type` gathered over process-group `backend`. A GPU tensor
    over NCCL: the whole tensor in one collective, written straight into the result on the device (no second
    copy to bound, and pieces sized for gloo would leave NCCL's links mostly idle, one launch per 4 MiB).
    Anything else (gloo, DeepSpeed's oneCCL on CPU, a CPU tensor under "cpu:gloo,cuda:nccl"): `CHUNK_BYTES`,
    as gloo keeps a second copy of a collective's output while it runs (see above)."""
    return WHOLE if device_type == "cuda" and "nccl" in backend else CHUNK_BYTES


def _partition_gatherable(p) -> bool:
    part = getattr(p, "ds_tensor", None)
    return (part is not None and hasattr(p, "ds_process_group") and getattr(part, "final_location", None) is None
            and not hasattr(part, "ds_quant_scale"))


def _gather_flat(part: torch.Tensor, group, device, chunk_bytes: int | None, dst: int | None) -> torch.Tensor | None:
    """Every process's equally long flat `part`, as rows of a (world, part size) tensor: on every process
    (`dst=None`, all-gather) or on global rank `dst` only (None elsewhere); in pieces of at most `chunk_bytes`
    for all processes together (None: `chunk_bytes_for` the group's backend and the device), so that gloo's second
    copy of a collective's output stays small. In one piece, straight into the result."""
    import torch.distributed as dist

    chunk_bytes = chunk_bytes or chunk_bytes_for(str(dist.get_backend(group)), torch.device(device).type)
    world = dist.get_world_size(group=group)
    receives = dst is None or dist.get_rank() == dst
    size = part.numel()
    step = max(min(max(chunk_bytes // (world * part.element_size()), 1), size), 1)
    full = torch.empty(world, size, dtype=part.dtype, device=device) if receives else None
    if step == size:
        piece = part.to(device).contiguous()
        if dst is None:
            dist.all_gather_into_tensor(full.view(-1), piece, group=group)
        else:
            dist.gather(piece, list(full) if receives else None, dst=dst, group=group)
        return full
    staging = torch.empty(world * step, dtype=part.dtype, device=device) if receives else None
    for start in range(0, size, step):
        piece = part[start : start + step].to(device).contiguous()
        out = staging[: world * piece.numel()] if receives else None
        if dst is None:
            dist.all_gather_into_tensor(out, piece, group=group)
        else:
            dist.gather(piece, list(out.view(world, -1)) if receives else None, dst=dst, group=group)
        if receives:
            full[:, start : start + piece.numel()].copy_(out.view(world, -1))
    return full


def gather_partitioned(p: torch.Tensor, device, chunk_bytes: int | None = None, dst: int | None = None):
    """The full tensor of a ZeRO-3 parameter, gathered from its partitions chunk by chunk: on every process
    (`dst=None`, all-gather), or on global rank `dst` only (None is returned elsewhere)."""
    full = _gather_flat(p.ds_tensor.view(-1), p.ds_process_group, device, chunk_bytes, dst)
    return None if full is None else full.view(-1)[: p.ds_numel].view(p.ds_shape)


def _row_sharded(t) -> bool:
    """A DTensor split by rows over a one-dimensional mesh: FSDP2's `fully_shard` layout (`Shard(0)`)."""
    from torch.distributed.tensor import Shard

    return t.device_mesh.ndim == 1 and tuple(t.placements) == (Shard(0),)


def gather_dtensor(t, chunk_bytes: int | None = None, dst: int | None = None):
    """The full tensor of a DTensor (an FSDP2 parameter, or a LoRA weight merged on its shards), on every process
    (`dst=None`) or on global rank `dst` only (None elsewhere), on its mesh's device. FSDP2 splits dim 0 like
    `torch.chunk`: ceil(rows / world) rows per process, fewer (or none) on the last, so each shard is padded to
    that many rows, gathered chunk by chunk (as ZeRO-3 partitions are), and the padding cut off. Other
    layouts (2-D meshes, tensor parallelism) take DTensor's own `full_tensor()` on every process."""
    import torch.distributed as dist

    device = mesh_device(t)
    if not _row_sharded(t):
        full = t.full_tensor().to(device)
        return full if dst is None or dist.get_rank() == dst else None
    group = t.device_mesh.get_group()
    world = dist.get_world_size(group=group)
    rows, rest = -(-t.shape[0] // world), t.shape[1:]
    part = t.to_local().detach().reshape(-1)
    padded = rows * math.prod(rest)
    if part.numel() < padded:
        part = torch.cat([part, part.new_zeros(padded - part.numel())])
    full = _gather_flat(part, group, device, chunk_bytes, dst)
    return None if full is None else full.view(world * rows, *rest)[: t.shape[0]]


@contextlib.contextmanager
def bucket_tensors(units: list[Unit], device, dst: int | None = None, merge_lora: bool = True):
    """(engine name, full tensor) pairs of a bucket, in unit order, valid inside the block. With `dst`, only
    that rank gets the gathered tensors (the others get an empty list). `merge_lora=False`: a LoRA module gives
    its base weight alone (an engine that serves the adapter itself, sync/adapter.py). ZeRO-3 partitions and FSDP2 DTensors
    are gathered chunk by chunk; ZeRO-3 LoRA modules and offloaded partitions go through DeepSpeed's
    GatheredParameters, which gathers on every rank."""
    direct = [u for u in units if not u.lora and u.params and all(_partition_gatherable(p) for _, p in u.params)]
    # any DTensor makes a unit FSDP2's (a frozen 4-bit base or ignored module may sit beside sharded adapters)
    sharded = [u for u in units if any(is_dtensor(p) for _, p in u.params)]
    receives = dst is None or process_rank() == dst
    with gathered([u for u in units if u not in direct and u not in sharded]):
        pairs = []
        for unit in units:
            if unit in direct:
                full = [gather_partitioned(p, device, dst=dst) for _, p in unit.params]
                pairs += list(zip(unit.engine_names(), full)) if receives else []
            elif unit in sharded:  # FSDP2: a LoRA module is merged on its shards first, then gathered once
                full = [(name, gather_dtensor(t, dst=dst) if is_dtensor(t) else t)
                        for name, t in unit_tensors(unit, merge_lora)]
                pairs += full if receives else []
            elif receives:
                pairs += unit_tensors(unit, merge_lora)
        try:
            yield pairs
        finally:
            pairs.clear()  # the caller may still hold the list: free the bucket before the next one is gathered


def gathered(units: list[Unit]):
    """Full tensors for the units' parameters while inside (ZeRO-3: one all-gather, released on exit)."""
    return gathered_params([p for u in units for _, p in u.params])


def unit_tensors(unit: Unit, merge_lora: bool = True) -> list[tuple[str, torch.Tensor]]:
    """(engine name, full tensor) of a gathered unit; a LoRA module yields its merged weight and bias (its base
    weight and bias with `merge_lora=False`)."""
    if not unit.lora:
        return list(zip(unit.engine_names(), (p.detach() for _, p in unit.params)))
    module, base = unit.module, unit.module.get_base_layer()
    weight = base.weight.detach()
    if merge_lora and not module.disable_adapters and not module.merged:
        for adapter in module.active_adapters:
            if adapter not in module.lora_A.keys():
                continue
            if module.use_dora.get(adapter) or getattr(module, "lora_bias", {}).get(adapter):
                raise NotImplementedError(f"{unit.name}: syncing DoRA / lora_bias adapters is not supported; "
                                          f"use plain LoRA or merge the adapter first.")
            delta = module.get_delta_weight(adapter)
            if is_dtensor(delta) != is_dtensor(weight):  # one side left unsharded by FSDP2: both whole
                weight, delta = full_tensor(weight), full_tensor(delta)
            weight = weight + delta.to(weight.dtype)
    tensors = [weight] + ([base.bias.detach()] if getattr(base, "bias", None) is not None else [])
    return list(zip(unit.engine_names(), tensors))


def engine_names(units: list[Unit]) -> list[str]:
    """The names a sync of these units pushes, computed without gathering anything."""
    return [name for unit in units for name in unit.engine_names()]
