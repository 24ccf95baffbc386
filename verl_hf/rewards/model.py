"""A reward model (`AutoModelForSequenceClassification`) used as one more reward function.

The policy's text is decoded and re-tokenised with the reward model's own tokenizer, so the two may differ.
Scoring runs under `no_grad` in batches. Only one-label models are accepted for now; a model with
`num_labels != 1` is refused at construction with the fix, not deep in the loss.

See it work: tests/test_reward_model.py.
"""

from __future__ import annotations

import torch


class RewardModelFunction:
    """Callable with the reward-function signature: one scalar per (prompt, completion)."""

    def __init__(self, model, tokenizer, batch_size: int = 32, max_length: int | None = None):
        num_labels = getattr(model.config, "num_labels", 1)
        if num_labels != 1:
            raise ValueError(
                f"reward_model has num_labels={num_labels}; verl_hf needs a one-label score model (a scalar per "
                f"sequence). Load it with num_labels=1 or wrap it in your own reward function."
            )
        self.model, self.tokenizer = model.eval().requires_grad_(False), tokenizer
        self.batch_size, self.max_length = batch_size, max_length
        self.__name__ = "reward_model"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id

    @torch.no_grad()
    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list[float]:
        texts = [_as_text(p) + c for p, c in zip(prompts, completions)]
        device = next(self.model.parameters()).device
        scores = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start : start + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=self.max_length is not None, max_length=self.max_length).to(device)
            scores += self.model(**enc).logits[:, 0].float().tolist()
        return scores


def _as_text(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return "".join(f"{m['role']}: {m['content']}\n" for m in prompt)


def reward_model_function(reward_model, tokenizer=None) -> RewardModelFunction:
    """From a model or an id/path (its tokenizer loaded from the same place unless given)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if isinstance(reward_model, RewardModelFunction):
        return reward_model
    if isinstance(reward_model, str):
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(reward_model)
        reward_model = AutoModelForSequenceClassification.from_pretrained(reward_model)
    if tokenizer is None:
        path = getattr(reward_model.config, "_name_or_path", None)
        if not path:
            raise ValueError("reward_model has no path to load its tokenizer from; pass "
                             "reward_model=RewardModelFunction(model, tokenizer).")
        tokenizer = AutoTokenizer.from_pretrained(path)
    return RewardModelFunction(reward_model, tokenizer)
