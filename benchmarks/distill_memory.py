"""Peak memory of one distillation micro-step against a GRPO micro-step of the same shape (issue 29's bar: GKD
within 1.3x of GRPO with a 32k vocabulary and 512-token responses).

    python benchmarks/distill_memory.py [--rows 8 --prompt 64 --response 512 --vocab 32000 --hidden 256]

Student and teacher are Qwen2 models of the same size with random weights (untied heads, so each head's
weights are (vocab, hidden) of their own). Each variant runs in its own process (peak RSS is per process) and
goes through the code the trainer runs (roles.scoring.scored_responses, TeacherPolicy):
- grpo: the student's log-probs through its head in chunks, the policy-gradient loss, backward;
- reverse_kl: the teacher's log-probs of the samples first (no graph), then the grpo step;
- gkd: the teacher's forward (hidden states, no graph), then the student's forward with the generalized JSD
  through both heads in chunks, backward.
`step MB` is the process's peak RSS minus its RSS just before the step (models loaded); `process MB` the
process's peak, which with a teacher includes its weights. Every process runs with glibc's mmap threshold fixed
(FIXED_MMAP_THRESHOLD) so that RSS measures the tensors rather than the heap's fragmentation.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


# glibc raises its mmap threshold each time a large block is freed, after which chunk-sized tensors come from the
# heap and fragment it: RSS then grows with the number of chunks although the tensors are freed (measured: 940 MB
# held after 63 freed chunks of logits, 153 MB with the threshold fixed). Fixed, RSS follows the tensors.
FIXED_MMAP_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def _model(vocab: int, hidden: int, layers: int, seed: int):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         tie_word_embeddings=False, max_position_embeddings=4096)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def _rss_mb() -> float:
    """This process's resident memory now (the peak, ru_maxrss, only ever grows)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _batch(rows: int, prompt: int, response: int, vocab: int):
    import torch

    from verl_hf.batch import RolloutBatch

    generator = torch.Generator().manual_seed(0)
    return RolloutBatch(prompt_ids=torch.randint(0, vocab, (rows, prompt), generator=generator),
                        prompt_mask=torch.ones(rows, prompt, dtype=torch.long),
                        response_ids=torch.randint(0, vocab, (rows, response), generator=generator),
                        response_mask=torch.ones(rows, response, dtype=torch.long),
                        group_ids=torch.arange(rows), truncated=torch.zeros(rows, dtype=torch.bool))


def one(variant: str, rows: int, prompt: int, response: int, vocab: int, hidden: int, layers: int) -> dict:
    import torch

    from verl_hf.roles import TeacherPolicy
    from verl_hf.roles.scoring import scored_responses

    student = _model(vocab, hidden, layers, seed=0)
    teacher = None if variant == "grpo" else TeacherPolicy(_model(vocab, hidden, layers, seed=1))
    batch = _batch(rows, prompt, response, vocab)
    advantages = torch.randn(rows, response)
    student.train()
    base = _rss_mb()
    started = time.perf_counter()
    divergence = teacher.divergence_against(batch, 0.5) if variant == "gkd" else None
    if variant == "reverse_kl":
        advantages = advantages + teacher.get_logprobs(batch)
    logprobs, _, values = scored_responses(student, batch, divergence=divergence)
    loss = -(advantages * logprobs).mean() + (values.mean() if values is not None else 0)
    loss.backward()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"variant": variant, "seconds": seconds, "step_mb": peak - base, "process_mb": peak}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = [str(x) for x in ("--rows", args.rows, "--prompt", args.prompt, "--response", args.response, "--vocab",
                              args.vocab, "--hidden", args.hidden, "--layers", args.layers)]
    if args.variant:
        print(json.dumps(one(args.variant, args.rows, args.prompt, args.response, args.vocab, args.hidden,
                             args.layers)))
        return
    logits_mb = args.rows * args.response * args.vocab * 4 / 2**20
    print(f"{args.rows} rows x {args.response} response tokens (+ {args.prompt} prompt), vocab {args.vocab}, hidden "
          f"{args.hidden}, {args.layers} layers: one model's fp32 response logits would be {logits_mb:.0f} MB")
    print("| variant | seconds | step MB | process MB | step / grpo's |\n|---|---:|---:|---:|---:|")
    grpo = None
    for variant in ("grpo", "reverse_kl", "gkd") * args.repeats:
        out = subprocess.run([sys.executable, __file__, "--variant", variant, *shape], capture_output=True, text=True,
                             check=True, env={**os.environ, **FIXED_MMAP_THRESHOLD})
        r = json.loads(out.stdout.strip().splitlines()[-1])
        grpo = r["step_mb"] if variant == "grpo" else grpo
        print(f"| {variant} | {r['seconds']:.2f} | {r['step_mb']:.0f} | {r['process_mb']:.0f} | "
              f"{r['step_mb'] / grpo:.2f}x |")


if __name__ == "__main__":
    main()
