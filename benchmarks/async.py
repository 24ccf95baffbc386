"""Synchronous against asynchronous GRPO (max_staleness 1 and 2) with the vLLM server engine, side by side in one
run on the same machine and the same total thread budget: seconds per step, generated tokens per second, the
trainer's and the producer's waits, held-out accuracy, and the overlap bound.

    python benchmarks/async.py [--steps 20] [--splits 1+1 2+2] [--repeats 3] [--batch 128] [--response 24]

`--splits`: how the machine's two cores are shared, each run under every split given.
- `1+1`: the server's processes on core 1 (taskset, VLLM_CPU_OMP_THREADS_BIND), the trainer on core 0, one
  thread. Generation and the update never compete, so this is where overlapping them pays.
- `1+1f`: the same threads, unpinned: the server computes on core 1, but its Python processes (HTTP, the engine's
  scheduler) and the trainer's float over both cores, as they do when nobody pins them.
- `2+2`: both may use both cores (the trainer with 2 threads): the fastest synchronous split when each phase
  scales with threads, since only one of them computes at a time.

The overlap bound: asynchronous training cannot beat the slower of its two sides, each at its split's cores. From
the synchronous phases at each split, generation g = rollout + reward and training t = the rest of the step; the
bound is the best synchronous s/step over the splits divided by the smallest max(g, t). Each split gets a
discarded warm-up run first; figures are medians over `--repeats` alternating runs. Needs vllm (vllm-cpu on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import statistics
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


# server processes' cores (taskset), server compute threads (VLLM_CPU_OMP_THREADS_BIND), trainer cores, threads
SPLITS = {"1+1": ("1", "1", {0}, 1), "1+1f": ("0-1", "1", {0, 1}, 1), "2+2": ("0-1", "0-1", {0, 1}, 2)}


@contextlib.contextmanager
def server(cores: str, compute: str, log: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = ["taskset", "-c", cores, sys.executable, "-m", "verl_hf.cli", "vllm-serve", WARM_START, "--host",
           "127.0.0.1", "--port", str(port), "--max-model-len", "128", "--dtype", "float32"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": compute})
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
    tokens = sum(h["response_length/mean"] for h in steps) * args.batch
    return {"s_per_step": seconds / args.steps, "tokens_per_s": tokens / seconds,
            "generation": (total("time/rollout") + total("time/reward")) / args.steps,
            "trainer_wait_s": total("async/trainer_wait_s"), "producer_wait_s": total("async/producer_wait_s"),
            "staleness_max": max((h.get("async/staleness_max", 0.0) for h in steps), default=0.0),
            "accuracy": (before, after),
            "phases": {k.removeprefix("time/"): round(total(k) / args.steps, 3)
                       for k in sorted({k for h in steps for k in h}) if k.startswith("time/")}}


def run_split(split: str, args, tmp: str) -> dict[int, list[dict]]:
    """Every mode's runs at one split (after a discarded synchronous warm-up), by max_staleness."""
    import torch

    server_cores, server_compute, trainer_cores, threads = SPLITS[split]
    os.sched_setaffinity(0, trainer_cores)
    torch.set_num_threads(threads)
    runs = {k: [] for k in args.staleness}
    with server(server_cores, server_compute, Path(tmp) / f"server{split}.log") as url:
        run(url, 0, args, f"{tmp}/{split}_warmup")
        for repeat in range(args.repeats):
            for k in args.staleness:
                runs[k].append(run(url, k, args, f"{tmp}/{split}_{repeat}_{k}"))
    return runs


def median(values):
    return statistics.median(values)


def report(results: dict[str, dict[int, list[dict]]], args) -> None:
    print(f"\n{args.batch} completions x up to {args.response} tokens, {args.steps} steps, median of "
          f"{args.repeats} alternating runs (this machine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores)\n")
    print("| split | max_staleness | s/step | tokens/s | trainer wait s | producer wait s | staleness max | "
          "accuracy before -> after |\n|---|---:|---:|---:|---:|---:|---:|---|")
    for split, runs in results.items():
        for k, rs in runs.items():
            acc = [r["accuracy"] for r in rs]
            print(f"| {split} | {k} | {median([r['s_per_step'] for r in rs]):.3f} | "
                  f"{median([r['tokens_per_s'] for r in rs]):.0f} | {median([r['trainer_wait_s'] for r in rs]):.1f} | "
                  f"{median([r['producer_wait_s'] for r in rs]):.1f} | {max(r['staleness_max'] for r in rs):.0f} | "
                  f"{median([a[0] for a in acc]):.3f} -> {median([a[1] for a in acc]):.3f} |")
    print("\nsynchronous phases, s/step: generation g (rollout + reward), training t (the rest); per split")
    ideal = {}
    for split, runs in results.items():
        step, g = median([r["s_per_step"] for r in runs[0]]), median([r["generation"] for r in runs[0]])
        ideal[split] = max(g, step - g)
        print(f"  {split}: step {step:.3f}, g {g:.3f}, t {step - g:.3f}, max(g, t) {ideal[split]:.3f}; "
              f"phases {runs[0][len(runs[0]) // 2]['phases']}")
    best_sync = min(median([r["s_per_step"] for r in runs[0]]) for runs in results.values())
    bound = best_sync / min(ideal.values())
    print(f"best synchronous {best_sync:.3f} s/step; overlap bound {bound:.2f}x (90%: {0.9 * bound:.2f}x)")
    for k in (k for k in args.staleness if k > 0):
        best = min(median([r["s_per_step"] for r in runs[k]]) for runs in results.values())
        print(f"max_staleness={k}: best {best:.3f} s/step, {best_sync / best:.2f}x the best synchronous, "
              f"{best_sync / best / bound:.0%} of the bound")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS),
                        help="how server and trainer share the cores (see above)")
    parser.add_argument("--batch", type=int, default=128, help="completions per step")
    parser.add_argument("--response", type=int, default=24, help="max_response_length")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of every mode")
    parser.add_argument("--evaluate", action="store_true", help="held-out accuracy before and after each run")
    args = parser.parse_args()
    if 0 not in args.staleness:
        parser.error("--staleness must include 0: the bound and the ratios are against the synchronous runs")
    with tempfile.TemporaryDirectory() as tmp:
        results = {split: run_split(split, args, tmp) for split in args.splits}
    report(results, args)


if __name__ == "__main__":
    main()
