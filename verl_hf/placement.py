"""Where roles live. `Placement`: the one decision of a trainer's run (one process, DDP, ZeRO-1/2, ZeRO-3 or
FSDP2; the device), made once from the accelerator, that every build site asks. `ResourcePool`: which
devices a role lives on, for frozen roles placed by hand in one process.

`Placement.place_frozen(model)` puts a frozen model (reference, reward or cost model) where the actor's
weights are: partitioned by a DeepSpeed inference engine under ZeRO-3, sharded with `fully_shard` under
FSDP2, else a whole copy on the process's device. `place_critic(role)` does the same for the trained critic
(its own DeepSpeed engine under any ZeRO stage).

`pool.slice(a, b)` takes devices a..b-1; `role.deploy(slice)` moves a role there. A frozen role (reference,
reward model) given several devices is split across them layer by layer with accelerate's device map; a
trained role (actor, critic) takes one device, because its data parallelism belongs to `accelerate launch`.
On a machine without accelerators the pool is the CPU.

See it work: tests/test_roles.py, tests/test_sync_zero3.py, tests/test_fsdp2.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .distributed import deepspeed_inference, fsdp_version, sharded_like_actor, zero_stage

KINDS = ("one process", "ddp", "zero", "zero3", "fsdp2")


@dataclass(frozen=True)
class Placement:
    """Holds: the run's kind (KINDS: ZeRO-1/2 is 'zero'), its ZeRO stage (None without DeepSpeed), the
    process's device, the process count, and the accelerator that places models."""
    kind: str
    zero_stage: int | None
    device: torch.device
    num_processes: int
    accelerator: Any

    @classmethod
    def of(cls, accelerator, device) -> "Placement":
        stage = zero_stage(accelerator)
        if fsdp_version(accelerator) == 2:
            kind = "fsdp2"
        elif stage is not None:
            kind = "zero3" if stage == 3 else "zero"
        else:
            kind = "ddp" if accelerator.num_processes > 1 else "one process"
        return cls(kind, stage, torch.device(device), accelerator.num_processes, accelerator)

    @property
    def shards_weights(self) -> bool:
        """No process holds the whole policy (ZeRO-3, FSDP2): frozen copies are sharded too."""
        return self.kind in ("zero3", "fsdp2")

    def place_frozen(self, model: torch.nn.Module):
        """(the model where it runs, the DeepSpeed inference engine that holds it under ZeRO-3 or None)."""
        if self.kind == "zero3":
            engine = deepspeed_inference(self.accelerator, model)
            return engine.module, engine
        if self.kind == "fsdp2":
            return sharded_like_actor(self.accelerator, model.eval().requires_grad_(False)), None
        return model.to(self.device), None

    def place_critic(self, role):
        """The trained critic: its own DeepSpeed engine with the run's ZeRO stage, sharded like the actor under
        FSDP2 (which then averages its gradients), else on the device (DDP: averaged in its step())."""
        if self.zero_stage is not None:
            return role.use_deepspeed(self.accelerator.state.deepspeed_plugin.deepspeed_config)
        if self.kind == "fsdp2":
            role.model = sharded_like_actor(self.accelerator, role.model, frozen=False)
            return role
        role.model.to(self.device)
        return role


def _default_devices() -> list[str]:
    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


class ResourcePool:
    def __init__(self, devices: list[str | torch.device] | None = None, name: str = "default"):
        self.devices = [torch.device(d) for d in (devices if devices is not None else _default_devices())]
        self.name = name
        if not self.devices:
            raise ValueError(f"ResourcePool {name!r} has no devices; give e.g. devices=['cuda:0', 'cuda:1'].")

    def slice(self, start: int, stop: int) -> "ResourcePool":
        """Devices start..stop-1 as a pool of their own."""
        if not 0 <= start < stop <= len(self.devices):
            raise ValueError(f"slice({start}, {stop}) is outside pool {self.name!r} of {len(self.devices)} devices.")
        return ResourcePool(self.devices[start:stop], name=f"{self.name}[{start}:{stop}]")

    @property
    def primary(self) -> torch.device:
        return self.devices[0]

    def __len__(self) -> int:
        return len(self.devices)

    def __repr__(self) -> str:
        return f"ResourcePool({[str(d) for d in self.devices]}, name={self.name!r})"


def place_model(model: torch.nn.Module, pool: ResourcePool, frozen: bool) -> torch.nn.Module:
    """Move `model` onto the pool: one device as is; several devices only for frozen models (layer split)."""
    if len(pool) == 1:
        return model.to(pool.primary)
    if not frozen:
        raise ValueError(f"a trained role takes one device, got {pool}; run data parallel with `accelerate launch`.")
    from accelerate import dispatch_model, infer_auto_device_map

    budget = {d.index if d.type == "cuda" else str(d): torch.cuda.mem_get_info(d)[0] if d.type == "cuda" else 2**40
              for d in pool.devices}
    device_map = infer_auto_device_map(model, max_memory=budget, no_split_module_classes=getattr(
        model, "_no_split_modules", None))
    return dispatch_model(model, device_map=device_map)
