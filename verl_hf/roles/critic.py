"""`Critic`: a value model, V(prefix) for every response token, trained alongside the actor in PPO.

The model is an `AutoModelForTokenClassification` with one label: any HF causal-LM checkpoint loads as a
backbone with a fresh scalar head (`Critic.from_pretrained(path)`). Its dropout, the head's included (0.1 by
default in transformers), is off like every role's (roles/dropout.py), so values are deterministic in training
mode too.

See it work: tests/test_roles.py, examples/custom_loop_ppo.py.
"""

from __future__ import annotations

import os

import torch

from ..batch import RolloutBatch
from ..distributed import full_state_dicts, is_fsdp2, load_full_state_dicts
from .base import TrainableRole, score_in_chunks
from .dropout import original_rates_restored


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

    @classmethod
    def _load_kwargs(cls, hf_kwargs: dict) -> dict:
        return {"num_labels": 1, **hf_kwargs}

    engine = None  # a DeepSpeed engine once `use_deepspeed` ran

    def use_deepspeed(self, ds_config: dict) -> "Critic":
        """Shard the critic like the actor: its own DeepSpeed engine (ZeRO-2/3) with its own AdamW at the critic's
        learning rate. The engine then counts micro-steps and steps at accumulation boundaries itself."""
        import copy

        import deepspeed

        config = copy.deepcopy(ds_config)
        config.pop("optimizer", None)
        config.pop("scheduler", None)
        config["zero_allow_untested_optimizer"] = True  # torch AdamW under ZeRO
        if self.max_grad_norm:
            config["gradient_clipping"] = self.max_grad_norm
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.learning_rate, weight_decay=0.0)
        self.engine, self.optimizer, *_ = deepspeed.initialize(model=self.model, optimizer=optimizer, config=config)
        return self

    @property
    def steps_every_micro_step(self) -> bool:
        """True when `step()` belongs after every backward (DeepSpeed decides when the optimizer really steps)."""
        return self.engine is not None

    def backward(self, loss: torch.Tensor) -> None:
        if self.engine is None:
            return super().backward(loss)
        self.engine.backward(loss, scale_wrt_gas=False)  # the loss is already normalised over the whole step

    def step(self) -> float | None:
        if self.engine is None:
            return super().step()
        boundary = self.engine.is_gradient_accumulation_boundary()
        self.engine.step()
        norm = self.engine.get_global_grad_norm() if boundary else None
        return float(norm) if norm is not None else None

    def save_checkpoint(self, path: str, main_process: bool = True) -> None:
        """Weights and optimizer state: a DeepSpeed checkpoint (every rank writes its shards), else an HF model
        folder plus optimizer.pt written by the main process (under FSDP2 gathered whole first, by everyone)."""
        if self.engine is not None:
            self.engine.save_checkpoint(path)
            return
        if is_fsdp2(self.model):
            weights, optimizer = full_state_dicts(self.model, self.optimizer)
        else:
            weights, optimizer = None, self.optimizer.state_dict() if self.optimizer is not None else None
        if main_process:
            with original_rates_restored(self.model):  # the config as built, not with RL's zero dropout
                self.model.save_pretrained(path, state_dict=weights)
            if optimizer is not None:
                torch.save(optimizer, os.path.join(path, "optimizer.pt"))

    def load_checkpoint(self, path: str) -> None:
        if self.engine is not None:
            self.engine.load_checkpoint(path, load_optimizer_states=True, load_lr_scheduler_states=False)
            return
        weights = type(self.model).from_pretrained(path).state_dict()
        state_path = os.path.join(path, "optimizer.pt")
        optimizer = torch.load(state_path, weights_only=True) if os.path.exists(state_path) else None
        if is_fsdp2(self.model):
            load_full_state_dicts(self.model, self._ensure_optimizer() if optimizer else None, weights, optimizer)
            return
        self.model.load_state_dict(weights)
        if optimizer is not None:
            self.load_optimizer_state(optimizer)

    def compute_values(self, sequences: RolloutBatch, micro_batch_size: int | None = None) -> torch.Tensor:
        """Token-level values (B, Lr), zero outside the response mask; no gradients."""
        return score_in_chunks(self.engine or self.model, sequences, micro_batch_size, sequence_values)

    def forward_values(self, sequences: RolloutBatch, model=None) -> torch.Tensor:
        """Token-level values (B, Lr) with gradients, for the value loss."""
        model = model or self.engine or self.model
        model.train()
        return sequence_values(model, sequences.to(self.device))
