"""`ReferencePolicy`: the frozen policy that KL is measured against.

It never builds a graph: its parameters are frozen and every call runs under `torch.no_grad()` (leaking the
reference's graph into the loss is a classic RLHF bug). With a PEFT actor there is no copy at all: the
reference is the same model with its adapters disabled.

See it work: tests/test_roles.py.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ..algorithms import kl_penalty
from ..batch import RolloutBatch
from .actor import sequence_logprobs


class ReferencePolicy:
    def __init__(self, model, temperature: float = 1.0, adapter_model=None):
        """`model`: a frozen causal LM; or `adapter_model`: a PEFT model whose base (adapters off) is the reference."""
        self.model, self.adapter_model, self.temperature = model, adapter_model, temperature
        if model is not None:
            model.eval()
            model.requires_grad_(False)

    @classmethod
    def from_actor(cls, actor_model, temperature: float = 1.0) -> "ReferencePolicy":
        """The actor's starting point: adapters disabled for PEFT models, else a frozen copy."""
        if hasattr(actor_model, "disable_adapter"):
            return cls(None, temperature, adapter_model=actor_model)
        return cls(copy.deepcopy(actor_model), temperature)

    def _context(self):
        return self.adapter_model.disable_adapter() if self.adapter_model is not None else contextlib.nullcontext()

    @torch.no_grad()
    def get_logprobs(self, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
        model = self.model if self.model is not None else self.adapter_model
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            with self._context():
                parts = [sequence_logprobs(model, mb.to(device), self.temperature)[0]
                         for mb in batch.split(micro_batch_size)]
        finally:
            model.train(was_training)
        return torch.cat(parts)

    def kl_divergence(self, batch: RolloutBatch, logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
        """Per-token KL(actor || reference) estimate (B, Lr), zero outside the response mask."""
        return kl_penalty(logprobs, batch.ref_logprobs, kind) * batch.response_mask
