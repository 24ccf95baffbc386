"""Non-finite values never reach the weights: the gradient check before every optimizer step, the loss check
before every backward under DeepSpeed, and the weight check before every save.

- `NonFiniteGuard.after_gradients` runs where the Trainer has the step's gradient norm, before
  `optimizer.step()`. A NaN/inf norm either stops the run (`on_nonfinite="raise"`, the default: the weights
  are as they were after the last good step) or drops the gradients so that the step changes nothing
  (`"skip"`: AdamW skips parameters without a gradient, moments included; the learning-rate schedule moves
  on) and counts it (`train/skipped_steps`). Five skipped steps in a row stop the run: something is broken.
- Under DeepSpeed the engine steps inside the backward call, before the Trainer sees a norm, so each
  micro-batch's loss is checked before its backward instead (all processes together, so none is left
  waiting in a collective); "skip" is refused there.
- `check_finite_weights` refuses to write a checkpoint or a model whose weights hold NaN/inf.

See it work: tests/test_nonfinite.py.
"""

from __future__ import annotations

import math

import torch

from .distributed import held_tensor

ON_NONFINITE = ("raise", "skip")
MAX_SKIPPED_IN_ROW = 5


class NonFiniteGuard:
    """Holds: the optimizer steps skipped for a non-finite gradient, in all and in a row (in checkpoints)."""

    def __init__(self, mode: str):
        if mode not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite={mode!r} must be one of {ON_NONFINITE}.")
        self.mode, self.skipped, self.in_row = mode, 0, 0

    def after_gradients(self, grad_norm, parameters, step: int) -> bool:
        """True when the step may go ahead; False when it was skipped (its gradients dropped)."""
        norm = float(grad_norm) if grad_norm is not None else math.nan
        if math.isfinite(norm):
            self.in_row = 0
            return True
        if self.mode == "raise":
            raise FloatingPointError(
                f"step {step}: the gradient norm is {norm}; the optimizer step was not taken, so the weights are "
                f"those of step {step - 1}. The logged reward/*, actor/* and kl of the last steps show which values "
                f"grew; lower learning_rate, or set on_nonfinite='skip' to skip such steps and count them.")
        if self.in_row + 1 >= MAX_SKIPPED_IN_ROW:
            raise FloatingPointError(f"step {step}: {MAX_SKIPPED_IN_ROW} optimizer steps in a row had a non-finite "
                                     f"gradient norm and were skipped; the run cannot recover by itself (lower "
                                     f"learning_rate, check the rewards).")
        for param in parameters:
            param.grad = None
        self.skipped, self.in_row = self.skipped + 1, self.in_row + 1
        return False

    def metrics(self) -> dict[str, float]:
        return {"train/skipped_steps": float(self.skipped)} if self.mode == "skip" else {}

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "in_row": self.in_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.in_row = state["skipped"], state["in_row"]


def check_finite_loss(loss: torch.Tensor, reduce_sum, step: int, what: str = "actor loss") -> None:
    """Raise on every process when the loss is non-finite on any of them (`reduce_sum`: a sum over processes)."""
    bad = reduce_sum(torch.tensor([0.0 if torch.isfinite(loss.detach()).all() else 1.0], device=loss.device))
    if bad.item() > 0:
        raise FloatingPointError(f"step {step}: the {what} is non-finite on {int(bad.item())} process(es); it was not "
                                 f"backpropagated, so the weights are those of the last step. The logged reward/*, "
                                 f"actor/* and kl show which values grew; lower learning_rate.")


def check_finite_weights(models: dict, reduce_sum, device, where: str) -> None:
    """Raise, before anything is written to `where`, when a weight of any of `models` ({name: module}) holds NaN
    or inf on any process (under ZeRO-3 each process checks its own partition)."""
    bad = [name for name, model in models.items() if model is not None and not _finite(model)]
    count = reduce_sum(torch.tensor([float(len(bad))], device=device))
    if count.item() > 0:
        raise FloatingPointError(f"not writing {where}: the weights of {bad or 'a model on another process'} hold NaN "
                                 f"or inf. The checkpoints already written are intact; resume from the newest, with a "
                                 f"lower learning_rate.")


def _finite(model: torch.nn.Module) -> bool:
    for param in model.parameters():
        tensor = held_tensor(param)  # ZeRO-3: this process's partition; FSDP2: its shard
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return False
    return True
