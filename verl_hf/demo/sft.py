"""Build the demos' warm-start policies: supervised fine-tuning with a plain `transformers.Trainer`.

RL needs a policy that sometimes answers correctly. For the addition demo we train the tiny model on
`prompt -> #### <sum></s>` and stop as soon as greedy accuracy on a dev split reaches `--target_accuracy`
(default 0.30). Stopping on accuracy, not on a step count, matters: the jump in accuracy comes at a
seed-dependent step. For the tool demo (`--task tools`, tools_task.py) we train on whole conversations, the
loss on the assistant's turns only, that call the `multiply` tool in a `--tool_share` of them, and stop once
sampled dev accuracy (through the tool, with verl_hf's own multi-turn rollout) reaches the target: greedy
decoding still answers directly then, so the RL run starts from a policy that uses the tool sometimes.

The results (about 2 MB each in fp32) ship as `verl_hf/demo/warm_start/`, `warm_start_tools/`,
`warm_start_tools_qwen3/` and `warm_start_tools_mistral/`, so the demos spend their time on RL. Rebuild them with
`python -m verl_hf.demo.sft --output_dir verl_hf/demo/warm_start`,
`python -m verl_hf.demo.sft --task tools --output_dir verl_hf/demo/warm_start_tools`,
`python -m verl_hf.demo.sft --task tools --family qwen3 --output_dir verl_hf/demo/warm_start_tools_qwen3` and
`python -m verl_hf.demo.sft --task tools --family mistral --output_dir verl_hf/demo/warm_start_tools_mistral`.

See it work: tests/test_demo_task.py.
"""

from __future__ import annotations

import argparse

import torch
from ..rewards.scorers import gsm8k_score
from .sft_loop import StopAtAccuracy, pad_collate, train_until
from .task import demo_splits
from .tiny import build_char_tokenizer, build_tiny_llama


@torch.no_grad()
def greedy_accuracy(model, tokenizer, dataset, max_new_tokens: int = 12, batch_size: int = 200) -> float:
    """Fraction of `dataset` rows whose greedy completion carries the right `#### <answer>`."""
    model.eval()
    correct = 0
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        enc = tokenizer(rows["prompt"], return_tensors="pt", padding=True).to(model.device)
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        correct += sum(gsm8k_score(t, a) == 1.0 for t, a in zip(texts, rows["answer"]))
    model.train()
    return correct / len(dataset)


def tokenize_for_sft(tokenizer, dataset):
    """input_ids = prompt + completion + EOS; labels mask the prompt with -100 (loss on the answer only)."""

    def encode(row):
        prompt_ids = tokenizer(row["prompt"]).input_ids
        completion_ids = tokenizer(row["completion"]).input_ids + [tokenizer.eos_token_id]
        return {"input_ids": prompt_ids + completion_ids, "labels": [-100] * len(prompt_ids) + completion_ids}

    return dataset.map(encode, remove_columns=dataset.column_names)


def build_warm_start(output_dir: str, seed: int = 0, target_accuracy: float = 0.30, max_steps: int = 3000) -> dict:
    """The addition demo's warm start, saved under `output_dir`; returns the figures of its training."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, seed=seed)
    train, dev, test = demo_splits(seed=0)
    stopper = StopAtAccuracy(lambda m: greedy_accuracy(m, tokenizer, dev), target_accuracy, every=25)
    figures = train_until(model, tokenizer, tokenize_for_sft(tokenizer, train), pad_collate(tokenizer), stopper,
                          output_dir, seed, max_steps)
    return {**figures, "test_accuracy": greedy_accuracy(model, tokenizer, test)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--task", choices=("addition", "tools", "vision"), default="addition")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target_accuracy", type=float, default=None,
                        help="dev accuracy to stop at (default: 0.30 for addition, 0.15 sampled for tools)")
    parser.add_argument("--tool_share", type=float, default=0.3, help="tools: the share of conversations that "
                        "call the tool")
    parser.add_argument("--family", choices=("llama", "qwen3", "mistral"), default="llama",
                        help="tools: the model family and its format (verl_hf/demo/families.py)")
    args = parser.parse_args(argv)
    if args.task == "vision":
        from .sft_vision import build_vision_warm_start

        print(build_vision_warm_start(args.output_dir, seed=args.seed,
                                      target_accuracy=0.3 if args.target_accuracy is None else args.target_accuracy))
    elif args.task == "tools":
        from .sft_tools import build_tools_warm_start

        print(build_tools_warm_start(args.output_dir, seed=args.seed, tool_share=args.tool_share,
                                     target_accuracy=0.15 if args.target_accuracy is None else args.target_accuracy,
                                     family_name=args.family))
    else:
        print(build_warm_start(args.output_dir, seed=args.seed,
                               target_accuracy=0.30 if args.target_accuracy is None else args.target_accuracy))


if __name__ == "__main__":
    main()
