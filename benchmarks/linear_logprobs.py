"""Peak memory and time of the log-prob + backward of one micro-batch: full logits vs the chunked LM head.

    python benchmarks/linear_logprobs.py [--rows 4096 --hidden 256 --vocab 32000 --chunk 1024]

Each variant runs in its own process (peak RSS is per process); the rows are B x T response tokens.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(variant: str, rows: int, hidden: int, vocab: int, chunk: int) -> dict:
    import torch

    from verl_hf.algorithms import logprobs_from_logits
    from verl_hf.algorithms.linear_logprobs import linear_logprobs

    torch.manual_seed(0)
    h = torch.randn(rows, hidden, requires_grad=True)
    w = (torch.randn(vocab, hidden) * 0.02).requires_grad_()
    targets = torch.randint(0, vocab, (rows,))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    if variant == "full":
        logprobs = logprobs_from_logits((h @ w.t()).float(), targets)
    else:
        logprobs, _ = linear_logprobs(h, w, targets, chunk_size=chunk, with_entropy=False)
    logprobs.sum().backward()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": variant, "seconds": seconds, "peak_extra_mb": (peak - base) / 1024}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(one(args.variant, args.rows, args.hidden, args.vocab, args.chunk)))
        return
    logits_mb = args.rows * args.vocab * 4 / 2**20
    print(f"{args.rows} rows x vocab {args.vocab} (one fp32 logits tensor: {logits_mb:.0f} MB), chunk {args.chunk}")
    print("| variant | seconds (forward + backward) | peak extra RSS MB |\n|---|---:|---:|")
    for variant in ("full", "chunked", "full", "chunked"):
        out = subprocess.run([sys.executable, __file__, "--variant", variant, "--rows", str(args.rows), "--hidden",
                              str(args.hidden), "--vocab", str(args.vocab), "--chunk", str(args.chunk)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {r['variant']} | {r['seconds']:.3f} | {r['peak_extra_mb']:.0f} |")


if __name__ == "__main__":
    main()
