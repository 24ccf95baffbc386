"""Synchronous against asynchronous GRPO (max_staleness 1 and 2) with the vLLM server engine, side by side in one
run on the same machine: seconds per step, the trainer's and the producer's waits, and held-out accuracy.

    python benchmarks/async.py [--steps 40] [--split 1+1] [--batch 64] [--response 12] [--evaluate]

The server and the trainer share the machine's cores. `--split S+T` gives the server S cores
(VLLM_CPU_OMP_THREADS_BIND) and the trainer T threads, the same for every mode; `--split 2+2` lets both use
both cores (they then compete whenever both compute, which only the asynchronous modes do). One server serves
every run of a split (the trainer pushes its starting weights first). Needs vllm (vllm-cpu on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
WARM_START = str(REPO / "verl_hf" / "demo" / "warm_start")


@contextlib.contextmanager
def server(cores: str, log: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "verl_hf.cli", "vllm-serve", WARM_START, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", "128", "--dtype", "float32"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": cores})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def run(url: str, staleness: int, args, out: str) -> dict:
    from verl_hf import VerlConfig, VerlTrainer
    from verl_hf.demo.task import demo_splits

    train, _, test = demo_splits(seed=0, num_train=4000, num_test=200, num_dev=10)
    config = VerlConfig(
        output_dir=out, rollout_engine="vllm_server", vllm_server_url=url, max_staleness=staleness,
        rollout_is="token", per_device_train_batch_size=args.batch, num_generations=4, learning_rate=1e-4,
        lr_scheduler_type="constant", max_prompt_length=32, max_response_length=args.response, max_steps=args.steps,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, bf16=False,
        reward_funcs=["gsm8k", "gsm8k_format"], reward_weights=[1.0, 0.1], per_device_eval_batch_size=200, seed=0)
    trainer = VerlTrainer(model=WARM_START, args=config, train_dataset=train.remove_columns("completion"),
                          eval_dataset=test.remove_columns("completion"))
    before = trainer.evaluate()["eval_accuracy"] if args.evaluate else float("nan")
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    after = trainer.evaluate()["eval_accuracy"] if args.evaluate else float("nan")
    steps = [h for h in trainer.state.log_history if "reward/mean" in h]
    total = lambda key: sum(h.get(key, 0.0) for h in steps)  # noqa: E731
    return {"s_per_step": seconds / args.steps, "rollout_s": total("time/rollout"), "update_s": total("time/update"),
            "trainer_wait_s": total("async/trainer_wait_s"), "producer_wait_s": total("async/producer_wait_s"),
            "staleness_max": max((h.get("async/staleness_max", 0.0) for h in steps), default=0.0),
            "accuracy": (before, after)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--split", default="1+1", help="server cores + trainer threads, e.g. 1+1 or 2+2")
    parser.add_argument("--batch", type=int, default=64, help="completions per step")
    parser.add_argument("--response", type=int, default=12, help="max_response_length")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of every mode")
    parser.add_argument("--evaluate", action="store_true", help="held-out accuracy before and after each run")
    args = parser.parse_args()
    import torch

    server_cores, trainer_threads = args.split.split("+")
    cores = {"1": "1", "2": "0-1"}.get(server_cores, server_cores)
    torch.set_num_threads(int(trainer_threads))
    rows = []
    with tempfile.TemporaryDirectory() as tmp, server(cores, Path(tmp) / "server.log") as url:
        for repeat in range(args.repeats):
            for k in args.staleness:
                rows.append((k, run(url, k, args, f"{tmp}/run{repeat}_{k}")))
    print(f"\nsplit {args.split} (server cores + trainer threads), {args.batch} completions x {args.response} tokens, "
          f"{args.steps} steps\n")
    print("| max_staleness | s/step | rollout s | update s | trainer wait s | producer wait s | staleness max | "
          "accuracy before -> after |\n|---:|---:|---:|---:|---:|---:|---:|---|")
    for k, r in rows:
        print(f"| {k} | {r['s_per_step']:.3f} | {r['rollout_s']:.1f} | {r['update_s']:.1f} | {r['trainer_wait_s']:.1f} "
              f"| {r['producer_wait_s']:.1f} | {r['staleness_max']:.0f} | {r['accuracy'][0]:.3f} -> "
              f"{r['accuracy'][1]:.3f} |")


if __name__ == "__main__":
    main()
