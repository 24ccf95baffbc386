"""Build the demo's warm-start policy: supervised fine-tuning with a plain `transformers.Trainer`.

RL needs a policy that sometimes answers correctly. We train the tiny model on `prompt -> #### <sum></s>`
and stop as soon as greedy accuracy on a dev split reaches `--target_accuracy` (default 0.30). Stopping on
accuracy, not on a step count, matters: the jump in accuracy comes at a seed-dependent step.

The result (about 2 MB in fp32) ships as `verl_hf/demo/warm_start/`, so the demo spends its time on RL.
Rebuild it with `python -m verl_hf.demo.sft --output_dir verl_hf/demo/warm_start`.

See it work: tests/test_demo_task.py.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from ..rewards.scorers import gsm8k_score
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


def pad_collate(tokenizer):
    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = [[tokenizer.pad_token_id] * (width - len(r["input_ids"])) + r["input_ids"] for r in rows]
        labels = [[-100] * (width - len(r["labels"])) + r["labels"] for r in rows]
        mask = [[0] * (width - len(r["input_ids"])) + [1] * len(r["input_ids"]) for r in rows]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(mask)}

    return collate


class StopAtAccuracy(TrainerCallback):
    """Measures dev accuracy every `every` steps and stops training once it reaches `target`."""

    def __init__(self, tokenizer, dev, target: float, every: int):
        self.tokenizer, self.dev, self.target, self.every = tokenizer, dev, target, every
        self.history: list[tuple[int, float]] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            acc = greedy_accuracy(model, self.tokenizer, self.dev)
            self.history.append((state.global_step, acc))
            print(f"step {state.global_step}: dev accuracy {acc:.3f}", flush=True)
            control.should_training_stop = acc >= self.target
        return control


def build_warm_start(output_dir: str, seed: int = 0, target_accuracy: float = 0.30, max_steps: int = 3000) -> dict:
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, seed=seed)
    train, dev, test = demo_splits(seed=0)
    stopper = StopAtAccuracy(tokenizer, dev, target_accuracy, every=25)
    args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=64, learning_rate=1e-3, max_steps=max_steps,
        warmup_steps=50, weight_decay=0.0, logging_steps=50, save_strategy="no", report_to="none",
        seed=seed, use_cpu=True, remove_unused_columns=False, disable_tqdm=True,
    )
    started = time.time()
    trainer = Trainer(
        model=model, args=args, train_dataset=tokenize_for_sft(tokenizer, train),
        data_collator=pad_collate(tokenizer), callbacks=[stopper],
    )
    trainer.train()
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {"seconds": time.time() - started, "steps": trainer.state.global_step,
            "dev_accuracy": stopper.history[-1][1] if stopper.history else None,
            "test_accuracy": greedy_accuracy(model, tokenizer, test)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target_accuracy", type=float, default=0.30)
    args = parser.parse_args(argv)
    print(build_warm_start(args.output_dir, seed=args.seed, target_accuracy=args.target_accuracy))


if __name__ == "__main__":
    main()
