"""The vision demo's warm start: supervised fine-tuning of a tiny random-weight Qwen2-VL on the color task.

Every weight trains here (the vision tower too: a random tower sees nothing); RL then trains the language model
with the tower frozen (`freeze_vision_tower`, the default). Each row's prompt is rendered and its image processed
by the model's processor (vision/inputs.py `process_row`), the answer's tokens and the end of turn appended, the
loss on those alone; a batch joins its rows' pixels in row order, as the trainer does. Training stops once
sampled dev accuracy reaches `target_accuracy`.

Rebuild the shipped one with `python -m verl_hf.demo.sft --task vision --output_dir verl_hf/demo/warm_start_vision`.

See it work: tests/test_demo_vision.py.
"""

from __future__ import annotations

import torch

from ..vision.inputs import image_token_types, join_rows, process_row
from .sft_loop import StopAtAccuracy, pad_collate, train_until
from .tiny_vision import build_tiny_qwen2_vl, build_vision_processor
from .vision_task import names_the_color, vision_corpus, vision_splits


def vision_collate(processor):
    """Rows (prompt, images, answer) -> the model's inputs with labels on the answer and the end of its turn:
    sft_loop's padding (on the right) of the ids and labels, the image token types and the rows' joined pixels."""
    tokenizer = processor.tokenizer
    pad = pad_collate(tokenizer, left=False)

    def collate(rows):
        encoded, pixels = [], []
        for row in rows:
            text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            prompt, row_pixels = process_row(processor, text, row["images"])
            answer = tokenizer(row["answer"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            encoded.append({"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer})
            pixels.append(row_pixels)
        batch = pad(encoded)
        # Qwen2-VL numbers its 3-D rotary positions itself from these (vision/positions.py)
        batch["mm_token_type_ids"] = image_token_types(batch["input_ids"], processor.image_token_id)
        return {**batch, **join_rows(pixels)}

    return collate


@torch.no_grad()
def color_accuracy(model, processor, dataset, sample: bool = False, batch_size: int = 100) -> float:
    """The share of `dataset`'s pictures whose color the model names, greedily or sampled at temperature 1 (one
    answer each, seeded), with verl_hf's own Actor."""
    from ..roles import Actor

    was_training = model.training
    model.eval()
    actor = Actor(model, processor)
    correct = 0
    for start in range(0, len(dataset), batch_size):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        ids = [actor.images.prompt_ids(row, f"dev row {start + i}") for i, row in enumerate(rows)]
        batch = actor.generate_sequences(prompt_ids=ids, rows=rows, max_new_tokens=4, do_sample=sample, seed=start,
                                         temperature=1.0, return_logprobs=False)
        correct += sum(names_the_color(batch.completions, [row["answer"] for row in rows]))
    model.train(was_training)
    return correct / len(dataset)


def build_vision_warm_start(output_dir: str, seed: int = 0, target_accuracy: float = 0.3,
                            max_steps: int = 2000) -> dict:
    """The vision demo's warm start (model and processor) under `output_dir`; returns its training's figures."""
    processor = build_vision_processor(vision_corpus(), vocab_size=300)
    model = build_tiny_qwen2_vl(processor, seed=seed)
    train, dev, test = vision_splits(seed=0)
    # Sampled accuracy, not greedy: greedy answers are right long before the sampled ones are, and GRPO learns
    # from samples (stopped on greedy accuracy at step 25, the policy sampled at entropy 5.6 nats, near uniform
    # over its 300 tokens, and never earned a reward).
    stopper = StopAtAccuracy(lambda m: color_accuracy(m, processor, dev, sample=True), target_accuracy, every=5)
    figures = train_until(model, processor, train, vision_collate(processor), stopper, output_dir, seed, max_steps)
    return {**figures, "test_accuracy_greedy": color_accuracy(model, processor, test),
            "test_accuracy_sampled": color_accuracy(model, processor, test, sample=True)}
