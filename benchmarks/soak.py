"""A long run: the demo trained for 500 steps with periodic evaluation and checkpoints, its resources sampled.

Every `--every` steps the trainer's own process reports resident memory (VmRSS), open file descriptors,
threads (the kernel's count, /proc/self/task) and live child processes. The goal, after warm-up (the first
evaluation and the first checkpoint): RSS growth under 5 %, file descriptors and threads flat. Linux only
(it reads /proc/self).

    python benchmarks/soak.py                          # 500 steps, eval every 50, checkpoint every 100
    python benchmarks/soak.py --steps 100 --every 5    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def sample_resources() -> dict:
    """This process's RSS (MB), open file descriptors, OS threads and child processes, read from /proc."""
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    children = 0
    for task in os.listdir("/proc/self/task"):
        try:
            children += len(open(f"/proc/self/task/{task}/children").read().split())
        except OSError:  # a thread that ended between the listing and the read
            pass
    return {"rss_mb": int(status["VmRSS"].split()[0]) / 1024, "fds": len(os.listdir("/proc/self/fd")),
            "threads": int(status["Threads"]), "children": children}


def make_sampler(every: int, rows: list[dict]):
    from transformers import TrainerCallback

    class ResourceSampler(TrainerCallback):
        """Appends one row of resources every `every` optimizer steps (and at step 0)."""

        def on_train_begin(self, args, state, control, **kwargs):
            rows.append({"step": 0, "time_s": 0.0, **sample_resources()})
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0:
                rows.append({"step": state.global_step, "time_s": round(time.perf_counter() - self.started, 1),
                             **sample_resources()})

    return ResourceSampler()


def soak(steps: int, every: int, eval_steps: int, save_steps: int) -> tuple[list[dict], dict]:
    from transformers.trainer_callback import PrinterCallback

    from verl_hf import VerlTrainer
    from verl_hf.cli import DEMO_CONFIG, parse_config
    from verl_hf.runner import load_policy_path, load_splits

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as out:
        script, config = parse_config(str(DEMO_CONFIG), [
            "--max_steps", str(steps), "--eval_steps", str(eval_steps), "--save_strategy", "steps",
            "--save_steps", str(save_steps), "--save_total_limit", "2", "--output_dir", out,
            "--disable_tqdm", "true"])
        train, test = load_splits(script)
        trainer = VerlTrainer(model=load_policy_path(script.model_name_or_path), args=config, train_dataset=train,
                              eval_dataset=test, callbacks=[make_sampler(every, rows)])
        trainer.remove_callback(PrinterCallback)  # the resource table is the output
        trainer.train()
        evals = [h["eval_accuracy"] for h in trainer.state.log_history if "eval_accuracy" in h]
        checkpoints = sorted(os.listdir(out))
    return rows, {"evals": len(evals), "last_accuracy": evals[-1] if evals else None, "kept": checkpoints}


def summarise(rows: list[dict], warm_step: int) -> dict:
    """Growth after warm-up: the median RSS of the last quarter of the rows after `warm_step` against the
    median of the first quarter (a row of step N is taken before that step's evaluation and checkpoint,
    and single rows swing by tens of MB with the allocator), and the least-squares trend over them all."""
    from statistics import median

    after = [r for r in rows if r["step"] > warm_step]
    quarter = max(len(after) // 4, 1)
    first, last = (median(r["rss_mb"] for r in part) for part in (after[:quarter], after[-quarter:]))
    mean_step = sum(r["step"] for r in after) / len(after)
    mean_rss = sum(r["rss_mb"] for r in after) / len(after)
    slope = sum((r["step"] - mean_step) * (r["rss_mb"] - mean_rss) for r in after) / max(
        sum((r["step"] - mean_step) ** 2 for r in after), 1e-9)
    return {"warm_step": warm_step, "rss_first_quarter_mb": round(first, 1), "rss_last_quarter_mb": round(last, 1),
            "rss_growth_pct": round(100 * (last - first) / first, 2),
            "rss_max_mb": round(max(r["rss_mb"] for r in after), 1),
            "rss_trend_mb_per_100_steps": round(100 * slope, 2),
            "fds": sorted({r["fds"] for r in after}), "threads": sorted({r["threads"] for r in after}),
            "children": sorted({r["children"] for r in after})}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every", type=int, default=10, help="sample resources every N steps")
    parser.add_argument("--eval_steps", type=int, default=50)
    parser.add_argument("--save_steps", type=int, default=100)
    parser.add_argument("--json", help="also write the rows and the summary to this file")
    args = parser.parse_args()
    rows, run = soak(args.steps, args.every, args.eval_steps, args.save_steps)
    print(f"{'step':>6} {'time_s':>8} {'rss_mb':>8} {'fds':>5} {'threads':>8} {'children':>9}")
    for r in rows:
        print(f"{r['step']:>6} {r['time_s']:>8} {r['rss_mb']:>8.1f} {r['fds']:>5} {r['threads']:>8} {r['children']:>9}")
    summary = {**summarise(rows, warm_step=max(args.save_steps, args.eval_steps)), **run}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
