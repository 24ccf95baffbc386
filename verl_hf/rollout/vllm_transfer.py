"""The data plane of server mode: tensors from the trainer into a running `vllm serve`, over vLLM's native
weight-transfer protocol (`init_weight_transfer_engine`, `start_weight_update`, `update_weights`,
`finish_weight_update`).

Three transports, chosen by the server's `--weight-transfer-config` (`verl-hf vllm-serve --transfer`):
- `nccl` (the server on other GPUs; vLLM's own worker engine): the trainer joins vLLM's NCCL group as rank 0
  and broadcasts each bucket packed into one buffer (cut by vLLM's own `pack_tensors`, which its workers unpack
  with the same geometry), instead of one broadcast per tensor.
- `ipc` (the server on the trainer's own GPU, where NCCL cannot put two ranks on one device; vLLM's CUDA-IPC
  worker engine): each bucket is packed into one GPU buffer whose CUDA-IPC handle goes with `update_weights`;
  the workers map it and load from it. No byte leaves the GPU.
- `verl_hf_gloo` (CPU, or any machine without NCCL): the same protocol over a gloo group, one broadcast per
  tensor. vLLM has no CPU transport, so we register one through vLLM's plugin entry point
  (`vllm.general_plugins`, see setup.cfg); it is what lets CI run server mode for real on CPU.

Every transport loads on arrival with vLLM's layerwise reload, opened once per sync (the trainer sends whole
layers per `update_weights`, see verl_hf.sync.gather.plan_buckets). Where the trainer and the server's workers
are on one GPU or on others is checked before the first update (`transport_device_problem`): NCCL between two
processes on one GPU fails inside NCCL, and CUDA IPC to another GPU fails in the worker.

See it work: tests/test_rollout_vllm_server.py (gloo), tests/test_vllm_transfer.py (the payloads against vLLM's
own classes), scripts/gpu_check.py (`ipc`, or `nccl` with two GPUs).
"""

from __future__ import annotations

import base64
import datetime
import functools
import pickle
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from .vllm_version import guarded_plugin

GLOO_BACKEND = "verl_hf_gloo"
IPC_BACKEND = "ipc"
TRANSPORTS = ("nccl", IPC_BACKEND, GLOO_BACKEND)
# NCCL packing: vLLM's default buffer, so that a bucket (256 MB by default, sync_bucket_mb) is one broadcast.
# Smaller pieces would split a bucket, and vLLM 0.32's receiver could then reuse a piece's memory while layerwise
# reload still reads it (0.33 fixed that in packed_nccl_broadcast_consumer). The packed copy is one bucket.
NCCL_PACK_BYTES = 2**30
NCCL_PACK_BUFFERS = 2  # the workers' pipelining (vLLM's default); the trainer sends the pieces one after another


@guarded_plugin
def register() -> None:
    """vLLM plugin entry point (runs in every vLLM process; under an unsupported vLLM it does nothing,
    vllm_version.py): make `verl_hf_gloo` a weight-transfer backend, give
    the workers `verl_hf_parameter_names`, `verl_hf_transfer_facts` and the adapter methods (reached through the
    server's /collective_rpc route), and let vLLM's adapter reader take adapters sent from memory (vllm_lora.py)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.v1.worker.worker_base import WorkerBase

    from .vllm_compat import parameter_names
    from .vllm_lora import (free_adapter_in_worker, install_in_worker_manager, loaded_adapters_in_worker,
                            wait_adapter_in_worker)

    if GLOO_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO_BACKEND, __name__, "GlooWeightTransferEngine")
    WorkerBase.verl_hf_parameter_names = parameter_names
    WorkerBase.verl_hf_transfer_facts = transfer_facts
    WorkerBase.verl_hf_wait_adapter = wait_adapter_in_worker
    WorkerBase.verl_hf_free_adapter = free_adapter_in_worker
    WorkerBase.verl_hf_loaded_adapters = loaded_adapters_in_worker
    install_in_worker_manager()


def device_uuid(worker=None) -> str | None:
    """The physical UUID of this process's GPU (the same GPU has the same UUID in every process, whatever
    CUDA_VISIBLE_DEVICES numbers it), None without one; `worker`: a vLLM worker's own device."""
    if not torch.cuda.is_available():
        return None
    device = getattr(worker, "device", None)
    index = device.index if isinstance(device, torch.device) and device.type == "cuda" else torch.cuda.current_device()
    return str(torch.cuda.get_device_properties(index).uuid)


def transfer_facts(worker) -> dict:
    """A server worker's side of the transport checks (worker method `verl_hf_transfer_facts`): its GPU, and
    whether it unpickles CUDA-IPC handles sent over HTTP (VLLM_ALLOW_INSECURE_SERIALIZATION)."""
    from vllm import envs

    return {"gpu": device_uuid(worker), "takes_handles": bool(envs.VLLM_ALLOW_INSECURE_SERIALIZATION)}


def transport_device_problem(transport: str, trainer_gpu: str | None, server_gpus: list, url: str) -> str:
    """Why `transport` cannot carry weights between this trainer process (on GPU `trainer_gpu`, a UUID or None)
    and the server's workers (on `server_gpus`); "" when it can. NCCL cannot put two processes on one GPU, CUDA IPC
    cannot reach another GPU, and both need the trainer on a GPU."""
    server = f"the vLLM server at {url} ({transport} transport, workers on {server_gpus})"
    if transport == GLOO_BACKEND:
        return ""
    if trainer_gpu is None:
        return (f"{server} needs this process on a GPU, and it is not: run the trainer on a GPU, or start the server "
                f"with --transfer {GLOO_BACKEND}")
    shares = trainer_gpu in server_gpus
    if shares and len(server_gpus) > 1:
        return (f"{server} spans this process's GPU ({trainer_gpu}) and others: NCCL cannot join two processes on "
                f"one GPU and CUDA IPC cannot reach the others. Start the server on GPUs the trainer does not use "
                f"(--transfer nccl), or on the trainer's GPU alone (--transfer {IPC_BACKEND})")
    if transport == IPC_BACKEND and not shares:
        return (f"{server} takes weights by CUDA IPC, which maps this process's GPU memory ({trainer_gpu}) and so "
                f"only reaches a server on the same GPU: start it with --transfer nccl")
    if transport == "nccl" and shares:
        return (f"{server} shares this process's GPU ({trainer_gpu}), and NCCL cannot join two processes on one GPU: "
                f"start it with --transfer {IPC_BACKEND} (`verl-hf vllm-serve MODEL --transfer {IPC_BACKEND}`)")
    return ""


def gloo_group(address: str, port: int, rank: int, world_size: int, timeout_s: float = 600.0):
    """A standalone gloo group (rank 0 hosts the store): it leaves any default process group untouched."""
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    store = TCPStore(address, port, world_size, is_master=rank == 0,
                     timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    return ProcessGroupGloo(PrefixStore("verl_hf_weights", store), rank, world_size,
                            datetime.timedelta(seconds=timeout_s))


PostUpdate = Callable[[dict], None]  # one `update_weights` call to the server, with this update_info


class TrainerSender:
    """The trainer's end (rank 0 of the transfer group; no group for `ipc`): `send(bucket, post_update)` is one
    `update_weights` with its tensors. Holds the transfer group and, for `ipc`, this GPU's UUID."""

    def __init__(self, transport: str, address: str, port: int, world_size: int):
        if transport not in TRANSPORTS:
            raise ValueError(f"The server's weight transfer backend is {transport!r}; start it with "
                             f"--weight-transfer-config '{{\"backend\": \"nccl\"}}' (other GPUs), "
                             f"'{{\"backend\": \"{IPC_BACKEND}\"}}' (the trainer's GPU) or "
                             f"'{{\"backend\": \"{GLOO_BACKEND}\"}}' (CPU), e.g. through `verl-hf vllm-serve`.")
        self.transport, self._group, self._gpu = transport, None, None
        if transport == "nccl":
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self._group = trainer_init({"master_address": address, "master_port": port, "world_size": world_size})
        elif transport == GLOO_BACKEND:
            self._group = gloo_group(address, port, 0, world_size)
        else:
            self._gpu = device_uuid()

    def send(self, named_tensors: list[tuple[str, torch.Tensor]], post_update: PostUpdate) -> None:
        if self.transport == IPC_BACKEND:
            self._send_ipc(named_tensors, post_update)
        else:
            self._send_broadcast(named_tensors, post_update)

    def _send_broadcast(self, named_tensors, post_update: PostUpdate) -> None:
        """The workers receive inside `update_weights`, so the call runs beside the broadcasts; a call that fails
        (the server refused the update, or a worker failed to load) ends the wait with its error instead of
        leaving this process in a broadcast nobody joins."""
        pool = ThreadPoolExecutor(1)
        try:
            server_side = pool.submit(post_update, update_info(named_tensors))
            if self.transport == "nccl":
                self._broadcast_packed(named_tensors, server_side)
            else:
                for _, tensor in named_tensors:
                    _raise_if_failed(server_side)
                    self._group.broadcast(tensor.contiguous(), 0).wait()
            server_side.result()
        finally:
            # Not waiting for the call: after a failed broadcast the workers stay inside theirs and it never returns
            pool.shutdown(wait=False)

    def _broadcast_packed(self, named_tensors, server_side) -> None:
        """The bucket in pieces cut by vLLM's own `pack_tensors` (the rule its workers cut by, from the same
        names, shapes and buffer size), one broadcast each on this stream, waited for while watching the call."""
        from vllm.distributed.weight_transfer.packed_tensor import pack_tensors

        stream, pairs = torch.cuda.current_stream(), iter(named_tensors)
        with warnings.catch_warnings():  # a weight over the buffer is a piece alone, on both sides alike
            warnings.filterwarnings("ignore", message=r"Tensor .* exceeds buffer_size_bytes")
            while (piece := pack_tensors(pairs, lambda pair: pair[1], NCCL_PACK_BYTES)) is not None:
                _raise_if_failed(server_side)
                self._group.broadcast(piece.packed_tensor, src=0, stream=stream)
                sent = torch.cuda.Event()
                sent.record(stream)
                while not sent.query():
                    _raise_if_failed(server_side)
                    time.sleep(0.001)

    def _send_ipc(self, named_tensors, post_update: PostUpdate) -> None:
        """The bucket packed into one buffer (one handle for the workers to map, not one per tensor), exported
        by vLLM's packed IPC producer, which waits for the copies before handing out the handle. Each call
        returns after the workers loaded from it, so the buffer can go."""
        from vllm.distributed.weight_transfer.packed_tensor import packed_ipc_producer

        size = sum(t.numel() * t.element_size() for _, t in named_tensors)
        for chunk in packed_ipc_producer(iter(named_tensors), self._gpu, post_iter_func=lambda pair: pair[1],
                                         buffer_size_bytes=max(size, 1)):
            post_update(ipc_update_info(chunk.names, chunk.dtype_names, chunk.shapes, chunk.tensor_sizes,
                                        chunk.ipc_handle))

    def finish(self) -> None:
        """After `finish_weight_update`: the workers have released this sync's IPC buffers; free them here."""
        if self.transport == IPC_BACKEND:
            torch.cuda.ipc_collect()


def _raise_if_failed(server_side) -> None:
    """The `update_weights` call's error, if it has ended with one."""
    if server_side.done() and server_side.exception() is not None:
        raise RuntimeError(f"the server's update_weights failed while this process was sending the tensors; the "
                           f"transfer group is left mid-update: {server_side.exception()}") from server_side.exception()


def worker_init_info(transport: str, address: str, port: int, world_size: int) -> dict:
    """The `init_weight_transfer_engine` payload for the server's workers (ranks 1.. of the group; `ipc` has no
    group, only the wire format)."""
    if transport == IPC_BACKEND:
        return {"packed": True}
    info = {"master_address": address, "master_port": port, "rank_offset": 1, "world_size": world_size}
    if transport == "nccl":  # the geometry the workers unpack with: the trainer's, or the bytes land misaligned
        info.update(packed=True, packed_buffer_size_bytes=NCCL_PACK_BYTES, packed_num_buffers=NCCL_PACK_BUFFERS)
    return info


def update_info(named_tensors: list[tuple[str, torch.Tensor]]) -> dict:
    """One `update_weights` payload of a broadcast transport: what the workers must allocate, in send order."""
    return {"names": [n for n, _ in named_tensors],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in named_tensors],
            "shapes": [list(t.shape) for _, t in named_tensors]}


def ipc_update_info(names: list, dtype_names: list, shapes: list, tensor_sizes: list, handle: dict) -> dict:
    """One `update_weights` payload of `ipc`: the packed buffer's handle ({GPU UUID: rebuild arguments}) pickled,
    as vLLM's workers take it over HTTP (they unpickle it only with VLLM_ALLOW_INSECURE_SERIALIZATION=1, which
    `verl-hf vllm-serve --transfer ipc` sets)."""
    return {"names": list(names), "dtype_names": list(dtype_names), "shapes": [list(s) for s in shapes],
            "tensor_sizes": list(tensor_sizes),
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handle)).decode("ascii")}


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
