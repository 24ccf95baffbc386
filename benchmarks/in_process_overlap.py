"""Would a producer thread overlap generation with the update inside one process (the HF copy engine), here?

The question asynchronous training asks of the in-process engines before building a producer for them: on this
machine, does `generate` on a copy of the policy in one thread, while another thread runs the update, finish both
sooner than running them one after the other at the full thread count? One process, the demo's warm start, a
round of `--batch` completions of `--response` tokens (every one to full length) and one forward/backward/AdamW
step on them; each figure the best of `--repeats`.

    python benchmarks/in_process_overlap.py [--batch 128] [--response 12] [--repeats 3]

It prints sequential time at 1 and at all threads, and the concurrent time with one thread each. The overlap pays
only where the concurrent time is well below the sequential time at all threads: generating a tiny model token by
token is mostly Python (holding the GIL), and each phase alone already scales with the cores.
"""

from __future__ import annotations

import argparse
import copy
import os
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

WARM_START = str(Path(__file__).resolve().parents[1] / "verl_hf" / "demo" / "warm_start")


def timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--response", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    policy = AutoModelForCausalLM.from_pretrained(WARM_START, dtype=torch.float32)
    engine = copy.deepcopy(policy).eval()  # what rollout_hf_weights='copy' samples from
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    prompts = torch.randint(10, 60, (args.batch, 32))
    sequences = torch.randint(10, 60, (args.batch, 32 + args.response))

    def generate(threads: int):
        torch.set_num_threads(threads)  # this thread's OpenMP team
        with torch.no_grad():
            engine.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=args.response,
                            min_new_tokens=args.response, do_sample=True, pad_token_id=0)

    def update(threads: int):
        torch.set_num_threads(threads)
        policy(sequences, labels=sequences).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    cores = os.cpu_count()
    sequential = {}
    for threads in sorted({1, cores}):
        timed(generate, threads), timed(update, threads)  # warm-up
        g = min(timed(generate, threads) for _ in range(args.repeats))
        t = min(timed(update, threads) for _ in range(args.repeats))
        sequential[threads] = g + t
        print(f"sequential, {threads} thread(s): generate {g:.3f} s + update {t:.3f} s = {g + t:.3f} s")
    both = []
    for _ in range(args.repeats):
        producer = threading.Thread(target=generate, args=(1,))
        started = time.perf_counter()
        producer.start()
        update(1)
        producer.join()
        both.append(time.perf_counter() - started)
    print(f"concurrent, one thread each: {min(both):.3f} s (median {sorted(both)[len(both) // 2]:.3f}); "
          f"{sequential[cores] / min(both):.2f}x the sequential step at {cores} thread(s)")


if __name__ == "__main__":
    main()
