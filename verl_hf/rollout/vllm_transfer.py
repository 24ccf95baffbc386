"""The data plane of server mode: tensors from the trainer into a running `vllm serve`, over vLLM's native
weight-transfer protocol (`init_weight_transfer_engine`, `start_weight_update`, `update_weights`,
`finish_weight_update`).

Two transports, chosen by the server's `--weight-transfer-config`:
- `nccl` (GPU; vLLM's own worker engine): the trainer joins vLLM's NCCL group as rank 0 and broadcasts.
- `verl_hf_gloo` (CPU, or any machine without NCCL): the same protocol over a gloo group. vLLM has no CPU
  transport, so we register one through vLLM's plugin entry point (`vllm.general_plugins`, see setup.cfg);
  it is what lets CI run server mode for real on CPU.

Both are unpacked: one broadcast per tensor, each loaded on arrival with vLLM's layerwise reload (the trainer
sends whole layers per `update_weights`, see verl_hf.sync.gather.plan_buckets).

See it work: tests/test_rollout_vllm_server.py.
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass

import torch

from .vllm_version import guarded_plugin

GLOO_BACKEND = "verl_hf_gloo"
TRANSPORTS = ("nccl", GLOO_BACKEND)


@guarded_plugin
def register() -> None:
    """vLLM plugin entry point (runs in every vLLM process; under an unsupported vLLM it does nothing,
    vllm_version.py): make `verl_hf_gloo` a weight-transfer backend, give
    the workers `verl_hf_parameter_names` and the adapter methods (reached through the server's /collective_rpc
    route), and let vLLM's adapter reader take adapters sent from memory (vllm_lora.py)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.v1.worker.worker_base import WorkerBase

    from .vllm_compat import parameter_names
    from .vllm_lora import (free_adapter_in_worker, install_in_worker_manager, loaded_adapters_in_worker,
                            wait_adapter_in_worker)

    if GLOO_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO_BACKEND, __name__, "GlooWeightTransferEngine")
    WorkerBase.verl_hf_parameter_names = parameter_names
    WorkerBase.verl_hf_wait_adapter = wait_adapter_in_worker
    WorkerBase.verl_hf_free_adapter = free_adapter_in_worker
    WorkerBase.verl_hf_loaded_adapters = loaded_adapters_in_worker
    install_in_worker_manager()


def gloo_group(address: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0):
    """A standalone gloo group (rank 0 hosts the store): it leaves any default process group untouched."""
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    store = TCPStore(address, port, world_size, is_master=rank == 0,
                     timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    return ProcessGroupGloo(PrefixStore("verl_hf_weights", store), rank, world_size,
                            datetime.timedelta(seconds=timeout_s))


class TrainerSender:
    """The trainer's end (rank 0 of the transfer group): `broadcast(tensor)` sends one tensor to every worker."""

    def __init__(self, transport: str, address: str, port: int, world_size: int):
        if transport not in TRANSPORTS:
            raise ValueError(f"The server's weight transfer backend is {transport!r}; start it with "
                             f"--weight-transfer-config '{{\"backend\": \"nccl\"}}' (GPU) or "
                             f"'{{\"backend\": \"{GLOO_BACKEND}\"}}' (CPU), e.g. through `verl-hf vllm-serve`.")
        self.transport = transport
        if transport == "nccl":
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self._group = trainer_init({"master_address": address, "master_port": port, "world_size": world_size})
        else:
            self._group = gloo_group(address, port, 0, world_size)

    def broadcast(self, tensor: torch.Tensor) -> None:
        tensor = tensor.contiguous()
        if self.transport == "nccl":
            self._group.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
        else:
            self._group.broadcast(tensor, 0).wait()

    def synchronize(self) -> None:
        if self.transport == "nccl":
            torch.cuda.current_stream().synchronize()


def worker_init_info(transport: str, address: str, port: int, world_size: int) -> dict:
    """The `init_weight_transfer_engine` payload for the server's workers (ranks 1.. of the group)."""
    info = {"master_address": address, "master_port": port, "rank_offset": 1, "world_size": world_size}
    if transport == "nccl":
        info["packed"] = False  # we send one tensor per broadcast, as GlooWeightTransferEngine receives
    return info


def update_info(named_tensors: list[tuple[str, torch.Tensor]]) -> dict:
    """One `update_weights` payload: what the workers must allocate, in send order."""
    return {"names": [n for n, _ in named_tensors],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in named_tensors],
            "shapes": [list(t.shape) for _, t in named_tensors]}


@functools.cache
def _worker_engine_class():
    """Defined lazily: the base classes live in vLLM, which the trainer side does not need for gloo."""
    from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                       WeightTransferUpdateInfo)
    from .vllm_compat import check_cpu_moe_reloadable, repack_cpu_moe
    from .vllm_reload import close_reload, open_reload

    @dataclass
    class GlooInitInfo(WeightTransferInitInfo):
        master_address: str
        master_port: int
        rank_offset: int
        world_size: int

    @dataclass
    class GlooUpdateInfo(WeightTransferUpdateInfo):
        names: list
        dtype_names: list
        shapes: list

    class GlooWeightTransferEngine(WeightTransferEngine):
        """vLLM worker side of `verl_hf_gloo`: receive each tensor by broadcast and load it layerwise."""

        init_info_cls, update_info_cls = GlooInitInfo, GlooUpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, init_info) -> None:
            check_cpu_moe_reloadable(self.model)  # before any weight arrives (see vllm_compat)
            parallel = self.parallel_config
            worker = parallel.data_parallel_index * parallel.world_size + parallel.rank
            self.group = gloo_group(init_info.master_address, init_info.master_port,
                                    init_info.rank_offset + worker, init_info.world_size)

        def start_weight_update(self) -> None:
            open_reload(self.model)

        def finish_weight_update(self) -> None:
            close_reload(self.model, self.model_config, self.device)
            repack_cpu_moe(self.model)  # the trainer pushes every weight in every update (see vllm_compat)

        def update_weights(self, update_info: dict) -> None:
            # The base class ends with torch.accelerator.synchronize(), which raises on CPU; gloo's wait()
            # has already completed each copy.
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, info) -> None:
            for name, dtype_name, shape in zip(info.names, info.dtype_names, info.shapes):
                weight = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
                self.group.broadcast(weight, 0).wait()
                self.model.load_weights([(name, weight)])

        def shutdown(self) -> None:
            self.group = None

    return GlooWeightTransferEngine


def __getattr__(name: str):
    # vLLM's factory imports `GlooWeightTransferEngine` from this module by name.
    if name == "GlooWeightTransferEngine":
        return _worker_engine_class()
    raise AttributeError(name)
