"""`Role`: the shared shell of Actor, Critic, ReferencePolicy and RewardModel.

A role wraps an HF model (and its tokenizer). `from_pretrained` passes every HF loading option through
(`trust_remote_code`, `attn_implementation`, `dtype`, `device_map`, ...); an existing `PreTrainedModel` or
PEFT model is accepted as is. `deploy(pool)` places it.

See it work: tests/test_roles.py.
"""

from __future__ import annotations

import math

import torch

from ..distributed import compute_device, full_tensor, is_fsdp2
from .dropout import disable_dropout, original_rates_restored


@torch.no_grad()
def score_in_chunks(model, sequences, micro_batch_size, score) -> torch.Tensor:
    """`score(model, micro_batch)` (B, Lr) over micro-batches with the model in eval mode (restored after), without
    gradients; the parts concatenated along the batch. Each micro-batch is scored without its all-padding
    columns and its scores padded back with zeros to the batch's response width."""
    device = compute_device(model)
    width = sequences.response_ids.shape[1]
    was_training = model.training
    model.eval()
    try:
        parts = [score(model, mb.without_padding().to(device)) for mb in sequences.split(micro_batch_size or len(sequences))]
    finally:
        model.train(was_training)
    return torch.cat([torch.nn.functional.pad(part, (0, width - part.shape[1])) for part in parts])


def average_gradients(model) -> None:
    """Average the gradients over all processes in one flat all-reduce (DDP's job, for a role that is not
    wrapped in DDP); nothing without torch.distributed or with one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


class Role:
    auto_class = None  # the transformers Auto class that loads this role's model
    frozen = False

    def __init__(self, model, tokenizer=None):
        """Every role's model runs without dropout, in training mode too (roles/dropout.py); what cannot be turned
        off is refused for roles that train (or run in training mode), a warning for frozen ones."""
        disable_dropout(model, strict=not self.frozen)
        self.model, self.tokenizer = model, tokenizer

    @classmethod
    def from_pretrained(cls, id_or_path: str, *, tokenizer=None, **kwargs):
        """Load the model with `cls.auto_class.from_pretrained(id_or_path, **hf_kwargs)`, and its tokenizer.

        Keywords that the role's constructor takes (e.g. `learning_rate`, `temperature`) go to the role;
        all others go to transformers (`trust_remote_code`, `attn_implementation`, `dtype`, `device_map`, ...).
        """
        import inspect

        from transformers import AutoTokenizer

        own = set(inspect.signature(cls.__init__).parameters) - {"self", "model", "tokenizer"}
        role_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in own}
        model = cls.auto_class.from_pretrained(id_or_path, **cls._load_kwargs(kwargs))
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(id_or_path, trust_remote_code=kwargs.get("trust_remote_code", False))
        return cls(model, tokenizer=tokenizer, **role_kwargs)

    @classmethod
    def _load_kwargs(cls, hf_kwargs: dict) -> dict:
        return hf_kwargs

    @property
    def device(self) -> torch.device:
        return compute_device(self.model)

    def deploy(self, pool) -> "Role":
        """Place the model on a `ResourcePool` slice (see verl_hf.placement)."""
        from ..placement import place_model

        self.model = place_model(self.model, pool, frozen=self.frozen)
        return self

    def save_pretrained(self, path: str, **kwargs) -> None:
        with original_rates_restored(self.model):  # the config as it was built, not with RL's zero dropout
            self.model.save_pretrained(path, **kwargs)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)

    def push_to_hub(self, repo_id: str, **kwargs):
        """Upload the model (and tokenizer) with transformers' own `push_to_hub`."""
        with original_rates_restored(self.model):
            result = self.model.push_to_hub(repo_id, **kwargs)
        if self.tokenizer is not None:
            self.tokenizer.push_to_hub(repo_id, **kwargs)
        return result


class TrainableRole(Role):
    """A role with its own optimizer for custom loops (VerlTrainer uses the Trainer's optimizer instead)."""

    def __init__(self, model, tokenizer=None, learning_rate: float = 1e-5, max_grad_norm: float | None = 1.0):
        super().__init__(model, tokenizer)
        self.learning_rate, self.max_grad_norm = learning_rate, max_grad_norm
        self.optimizer = None

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _ensure_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(params, lr=self.learning_rate, weight_decay=0.0)
        return self.optimizer

    def load_optimizer_state(self, state: dict) -> None:
        """Resume the role's optimizer (created here if it does not exist yet)."""
        self._ensure_optimizer().load_state_dict(state)

    def step(self) -> float:
        """Clip (if `max_grad_norm`), take an AdamW step, zero the gradients; returns the gradient norm. A NaN/inf
        norm skips the step (the gradients are dropped; the caller sees the norm). Under several processes
        (torch.distributed) the gradients are averaged across them first."""
        self._ensure_optimizer()
        if not is_fsdp2(self.model):  # FSDP2's backward already reduce-scattered (averaged) the gradients
            average_gradients(self.model)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm or float("inf"))
        norm = full_tensor(norm).item()  # FSDP2: a DTensor
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def update(self, loss: torch.Tensor) -> float | None:
        """`backward(loss)` then `step()`."""
        self.backward(loss)
        return self.step()
