"""`ReferencePolicy`: the frozen policy that KL is measured against.

It never builds a graph: its parameters are frozen and every call runs under `torch.no_grad()` (leaking the
reference's graph into the loss is a classic RLHF bug, and `freeze=True` alone does not prevent it). With a
PEFT actor there is no copy at all: the reference is the same model with its adapters disabled.

See it work: tests/test_roles.py.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ..algorithms import kl_penalty
from ..batch import RolloutBatch
from ..distributed import compute_device
from .base import Role, score_in_chunks
from .scoring import sequence_logprobs


class ReferencePolicy(Role):
    from transformers import AutoModelForCausalLM as auto_class

    frozen = True

    def __init__(self, model=None, tokenizer=None, temperature: float = 1.0, adapter_model=None,
                 logits_chunk_size: int | None = None):
        """`model`: a causal LM (frozen here); or `adapter_model`: a PEFT model whose base (adapters off) is the
        reference. `logits_chunk_size`: as for `Actor` (tokens per LM-head chunk; 0: full logits)."""
        super().__init__(model, tokenizer)
        if (model is None) == (adapter_model is None):
            raise ValueError("ReferencePolicy takes exactly one of model= or adapter_model=.")
        self.adapter_model, self.temperature, self.logits_chunk_size = adapter_model, temperature, logits_chunk_size
        self.moved = False  # set by SyncRefModelCallback: checkpoints then carry the moved reference
        self.engine = None  # a DeepSpeed inference engine holding the model under ZeRO-3
        if model is not None:
            model.eval()
            model.requires_grad_(False)

    @classmethod
    def from_actor(cls, actor_model, temperature: float = 1.0, logits_chunk_size: int | None = None) -> "ReferencePolicy":
        """The actor's starting point: adapters disabled for PEFT models, else a frozen copy."""
        if hasattr(actor_model, "disable_adapter"):
            return cls(adapter_model=actor_model, temperature=temperature, logits_chunk_size=logits_chunk_size)
        return cls(copy.deepcopy(actor_model), temperature=temperature, logits_chunk_size=logits_chunk_size)

    @property
    def device(self) -> torch.device:
        return compute_device(self.model or self.adapter_model)

    def deploy(self, pool) -> "ReferencePolicy":
        if self.adapter_model is not None:
            raise ValueError("a PEFT reference shares the actor's weights; it lives wherever the actor lives.")
        return super().deploy(pool)

    def _context(self):
        return self.adapter_model.disable_adapter() if self.adapter_model is not None else contextlib.nullcontext()

    def get_logprobs(self, sequences: RolloutBatch, micro_batch_size: int | None = None) -> torch.Tensor:
        """Reference log-probs (B, Lr) of the responses; never carries gradients."""
        model = self.model if self.model is not None else self.adapter_model
        with self._context():
            logprobs = score_in_chunks(model, sequences, micro_batch_size,
                                       lambda m, mb: sequence_logprobs(m, mb, self.temperature,
                                                                         chunk_size=self.logits_chunk_size)[0])
        return logprobs.to(sequences.response_ids.device)

    def add_logprobs(self, sequences: RolloutBatch, micro_batch_size: int | None = None) -> RolloutBatch:
        sequences.ref_logprobs = self.get_logprobs(sequences, micro_batch_size)
        return sequences

    def kl_divergence(self, sequences: RolloutBatch, logprobs: torch.Tensor | None = None,
                      kind: str = "k3") -> torch.Tensor:
        """Per-token KL(actor || reference) estimate (B, Lr), zero outside the response mask.

        `logprobs` are the actor's; by default the sampling log-probs the rollout returned.
        """
        if logprobs is None:
            logprobs = sequences.old_logprobs if sequences.old_logprobs is not None else sequences.rollout_logprobs
            if logprobs is None:
                raise ValueError("kl_divergence needs the actor's log-probs: pass logprobs=actor.get_logprobs(seqs), "
                                 "or generate with return_logprobs=True.")
        if sequences.ref_logprobs is None:
            self.add_logprobs(sequences)
        return kl_penalty(logprobs, sequences.ref_logprobs.to(logprobs.device), kind) * sequences.response_mask.to(logprobs.device)
