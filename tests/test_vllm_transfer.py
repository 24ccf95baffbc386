"""Server mode's transports, where a CPU can check them: the payloads we send parse as vLLM's own worker-side
classes (the NCCL packing geometry and the CUDA-IPC handle included), the device check picks the transport that
can join the trainer and the server, `verl-hf vllm-serve --transfer ipc` starts the server so that it accepts
handles, and the ZeRO-3/FSDP2 gather sizes its pieces by backend. The transfers themselves need GPUs:
scripts/gpu_check.py runs them (`ipc` on one GPU, `nccl` with two) where vLLM is installed; the gloo transport
runs for real in tests/test_rollout_vllm_server.py."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_hf.rollout.vllm_transfer import (GLOO_BACKEND, IPC_BACKEND, NCCL_PACK_BUFFERS, NCCL_PACK_BYTES,
                                           ipc_update_info, transport_device_problem, update_info, worker_init_info)
from verl_hf.sync.gather import CHUNK_BYTES, chunk_bytes_for

ROOT = Path(__file__).resolve().parents[1]
BUCKET = [("model.layers.0.mlp.up_proj.weight", torch.zeros(8, 4, dtype=torch.bfloat16)),
          ("model.layers.0.mlp.up_proj.bias", torch.zeros(8))]


def test_nccl_init_carries_the_packing_the_workers_unpack_with():
    pytest.importorskip("vllm")
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    info = NCCLWeightTransferInitInfo(**worker_init_info("nccl", "10.0.0.1", 29555, 3))
    assert (info.packed, info.packed_buffer_size_bytes, info.packed_num_buffers) == (True, NCCL_PACK_BYTES,
                                                                                     NCCL_PACK_BUFFERS)
    assert (info.master_address, info.master_port, info.rank_offset, info.world_size) == ("10.0.0.1", 29555, 1, 3)


def test_ipc_init_and_update_parse_as_vllms_own():
    """The handle goes pickled over HTTP, which vLLM's worker unpickles only with VLLM_ALLOW_INSECURE_SERIALIZATION
    (set by `verl-hf vllm-serve --transfer ipc`; in a process of its own, as vLLM reads its environment once)."""
    pytest.importorskip("vllm")
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferInitInfo

    assert IPCWeightTransferInitInfo(**worker_init_info(IPC_BACKEND, "", 0, 2)).packed
    handle = {"GPU-1234": (1, "storage", 64, 0, 2)}  # {uuid: rebuild args}; any picklable tuple stands in here
    payload = ipc_update_info(["a", "b"], ["bfloat16", "float32"], [[8, 4], [8]], [64, 32], handle)
    code = ("import pickle, sys\nfrom vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo\n"
            "info = IPCWeightTransferUpdateInfo(**pickle.loads(sys.stdin.buffer.read()))\n"
            "sys.stdout.buffer.write(pickle.dumps((info.names, info.dtype_names, info.shapes, info.tensor_sizes, "
            "info.ipc_handles)))")
    run = lambda allow: subprocess.run([sys.executable, "-c", code], input=pickle.dumps(payload), capture_output=True,
                                       timeout=300, cwd=ROOT, env={**__import__("os").environ,
                                                                   "VLLM_ALLOW_INSECURE_SERIALIZATION": allow})
    accepted = run("1")
    assert accepted.returncode == 0, accepted.stderr.decode()[-2000:]
    assert pickle.loads(accepted.stdout) == (["a", "b"], ["bfloat16", "float32"], [[8, 4], [8]], [64, 32], handle)
    refused = run("0")
    assert refused.returncode != 0 and b"VLLM_ALLOW_INSECURE_SERIALIZATION=1" in refused.stderr


def test_a_broadcast_update_parses_as_vllms_own():
    pytest.importorskip("vllm")
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    info = NCCLWeightTransferUpdateInfo(**update_info(BUCKET))
    assert (info.names, info.dtype_names, info.shapes) == ([n for n, _ in BUCKET], ["bfloat16", "float32"],
                                                           [[8, 4], [8]])
    assert worker_init_info(GLOO_BACKEND, "h", 1, 2) == {"master_address": "h", "master_port": 1, "rank_offset": 1,
                                                         "world_size": 2}


@pytest.mark.parametrize("transport, trainer, server, says", [
    ("ipc", "GPU-a", ["GPU-a"], ""),
    ("ipc", "GPU-a", ["GPU-b"], "only reaches a server on the same GPU: start it with --transfer nccl"),
    ("ipc", None, ["GPU-a"], "needs this process on a GPU, and it is not: run the trainer on a GPU, or start the "
                             "server with --transfer verl_hf_gloo"),
    ("nccl", None, ["GPU-b"], "needs this process on a GPU"),
    ("nccl", "GPU-a", ["GPU-b", "GPU-c"], ""),
    ("nccl", "GPU-a", ["GPU-a"], "NCCL cannot join two processes on one GPU: start it with --transfer ipc"),
    # a server over the trainer's GPU and another: neither transport can work, and neither is offered alone
    ("nccl", "GPU-a", ["GPU-a", "GPU-b"], "Start the server on GPUs the trainer does not use (--transfer nccl), or "
                                         "on the trainer's GPU alone (--transfer ipc)"),
    ("ipc", "GPU-a", ["GPU-a", "GPU-b"], "Start the server on GPUs the trainer does not use"),
    (GLOO_BACKEND, "GPU-a", ["GPU-a"], ""),
    (GLOO_BACKEND, None, [None], ""),
])
def test_the_transport_must_be_able_to_join_the_devices(transport, trainer, server, says):
    problem = transport_device_problem(transport, trainer, server, "http://h:8000")
    assert (problem == "") == (says == "") and says in problem
    if problem:
        assert "http://h:8000" in problem


def test_vllm_serve_ipc_lets_the_workers_take_handles_and_needs_one_gpu():
    from verl_hf.rollout.vllm_serve import parse_serve_args, serve_command

    cmd, env = serve_command(*parse_serve_args(["m", "--transfer", "ipc"]), has_gpu=True)
    assert '{"backend": "ipc"}' in cmd and env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in serve_command(*parse_serve_args(["m"]), has_gpu=True)[1]
    with pytest.raises(SystemExit, match="--transfer ipc needs GPUs"):
        serve_command(*parse_serve_args(["m", "--transfer", "ipc"]), has_gpu=False)
    with pytest.raises(SystemExit, match="--transfer ipc reaches only the trainer's own GPU, and "
                                         "--tensor-parallel-size 2 puts workers on others"):
        serve_command(*parse_serve_args(["m", "--transfer", "ipc", "--tensor-parallel-size", "2"]), has_gpu=True)


def test_the_gather_takes_gloo_in_pieces_and_nccl_gpu_tensors_whole():
    assert chunk_bytes_for("gloo", "cpu") == CHUNK_BYTES == 4 * 2**20
    assert chunk_bytes_for("nccl", "cuda") >= 2**40  # more than any tensor: one collective each
    for backend, device in (("ccl", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"), ("gloo", "cuda")):
        assert chunk_bytes_for(backend, device) == CHUNK_BYTES, (backend, device)
