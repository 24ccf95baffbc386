"""`ResourcePool`: which devices a role lives on, for frozen roles placed by hand in one process.

`pool.slice(a, b)` takes devices a..b-1; `role.deploy(slice)` moves a role there. A frozen role (reference,
reward model) given several devices is split across them layer by layer with accelerate's device map; a
trained role (actor, critic) takes one device, because its data parallelism belongs to `accelerate launch`.
On a machine without accelerators the pool is the CPU.

See it work: tests/test_roles.py.
"""

from __future__ import annotations

import torch


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
