"""`Critic`: a value model, V(prefix) for every response token, trained alongside the actor in PPO.

The model is an `AutoModelForTokenClassification` with one label: any HF causal-LM checkpoint loads as a
backbone with a fresh scalar head (`Critic.from_pretrained(path)`). Its head dropout (0.1 by default in
transformers) is set to 0 so that values are deterministic in training mode too.

See it work: tests/test_roles.py, examples/custom_loop_ppo.py.
"""

from __future__ import annotations

import torch

from ..batch import RolloutBatch
from .base import TrainableRole, score_in_chunks


def sequence_values(model, batch: RolloutBatch) -> torch.Tensor:
    """Values (B, Lr): the value of the state before each response token (position t-1 scores token t)."""
    attention_mask = batch.attention_mask
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    scores = model(input_ids=batch.input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    response_len = batch.response_ids.shape[1]
    return scores[:, -response_len - 1 : -1, 0].float() * batch.response_mask


class Critic(TrainableRole):
    from transformers import AutoModelForTokenClassification as auto_class

    def __init__(self, model, tokenizer=None, learning_rate: float = 1e-5, max_grad_norm: float | None = 1.0):
        super().__init__(model, tokenizer, learning_rate=learning_rate, max_grad_norm=max_grad_norm)
        num_labels = getattr(model.config, "num_labels", None)
        if num_labels != 1:
            raise ValueError(f"a Critic needs a one-output value head, got num_labels={num_labels}; load it with "
                             "Critic.from_pretrained(path) or AutoModelForTokenClassification(..., num_labels=1).")
        head_dropout = getattr(model, "dropout", None)
        if isinstance(head_dropout, torch.nn.Dropout):
            head_dropout.p = 0.0  # transformers defaults it to 0.1: values would be noisy in training mode

    @classmethod
    def _load_kwargs(cls, hf_kwargs: dict) -> dict:
        return {"num_labels": 1, **hf_kwargs}

    def compute_values(self, sequences: RolloutBatch, micro_batch_size: int | None = None) -> torch.Tensor:
        """Token-level values (B, Lr), zero outside the response mask; no gradients."""
        return score_in_chunks(self.model, sequences, micro_batch_size, sequence_values)

    def forward_values(self, sequences: RolloutBatch, model=None) -> torch.Tensor:
        """Token-level values (B, Lr) with gradients, for the value loss."""
        model = model or self.model
        model.train()
        return sequence_values(model, sequences.to(self.device))
