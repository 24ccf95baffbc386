"""The demos' supervised warm-start loop: a plain `transformers.Trainer` run until dev accuracy reaches a target.

Shared by the addition warm start (sft.py) and the tool demo's (sft_tools.py).
"""

from __future__ import annotations

import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


def pad_collate(tokenizer, left: bool = True):
    """Pads rows of input_ids/labels to one width: on the left (the addition warm start was built so), or on
    the right (whole conversations: every token keeps the position it has when the rollout samples it)."""

    def pad(row: list[int], value: int, width: int) -> list[int]:
        return [value] * (width - len(row)) + row if left else row + [value] * (width - len(row))

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = [pad(r["input_ids"], tokenizer.pad_token_id, width) for r in rows]
        labels = [pad(r["labels"], -100, width) for r in rows]
        mask = [pad([1] * len(r["input_ids"]), 0, width) for r in rows]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(mask)}

    return collate


class StopAtAccuracy(TrainerCallback):
    """Measures dev accuracy (`measure(model) -> float`) every `every` steps and stops training once it
    reaches `target`."""

    def __init__(self, measure, target: float, every: int):
        self.measure, self.target, self.every = measure, target, every
        self.history: list[tuple[int, float]] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            acc = self.measure(model)
            self.history.append((state.global_step, acc))
            print(f"step {state.global_step}: dev accuracy {acc:.3f}", flush=True)
            control.should_training_stop = acc >= self.target
        return control


def train_until(model, tokenizer, dataset, collate, stopper: StopAtAccuracy, output_dir: str, seed: int,
                max_steps: int, learning_rate: float = 1e-3) -> dict:
    """Supervised training with a plain transformers.Trainer until `stopper` says so (or `max_steps`); the model
    and tokenizer are saved under `output_dir`. Returns seconds, steps and the last dev accuracy."""
    args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=64, learning_rate=learning_rate, max_steps=max_steps,
        warmup_steps=50, weight_decay=0.0, logging_steps=50, save_strategy="no", report_to="none",
        seed=seed, use_cpu=True, remove_unused_columns=False, disable_tqdm=True,
    )
    started = time.time()
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate, callbacks=[stopper])
    trainer.train()
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {"seconds": time.time() - started, "steps": trainer.state.global_step,
            "dev_accuracy": stopper.history[-1][1] if stopper.history else None}
