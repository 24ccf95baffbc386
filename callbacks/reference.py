"""`SyncRefModelCallback`: move the KL reference towards the policy every `sync_steps` optimizer steps.

ref <- alpha * policy + (1 - alpha) * ref (TR-DPO's soft update, Gorbatovski et al. 2024; alpha = 1 copies
the policy). A run that drifts far can so keep a useful KL anchor. Checkpoints then carry the moved reference
(reference.safetensors), and a resume restores it.

See it work: tests/test_callbacks.py.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback


class SyncRefModelCallback(TrainerCallback):
    def __init__(self, sync_steps: int = 64, alpha: float = 0.6):
        if sync_steps < 1 or not 0 < alpha <= 1:
            raise ValueError(f"SyncRefModelCallback needs sync_steps >= 1 and 0 < alpha <= 1 (got {sync_steps}, "
                             f"{alpha}).")
        self.sync_steps, self.alpha, self.trainer, self.syncs = sync_steps, alpha, None, 0

    def bind(self, trainer) -> None:
        ref = trainer.ref_policy
        if ref is None:
            raise ValueError("SyncRefModelCallback needs a KL reference: set kl_coef > 0.")
        if ref.adapter_model is not None:
            raise ValueError("SyncRefModelCallback: with PEFT the reference is the base model with adapters off "
                             "(no copy to move); merge the adapter or train without PEFT.")
        if ref.engine is not None or trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
            raise ValueError("SyncRefModelCallback does not support DeepSpeed- or FSDP-sharded references yet; "
                             "train with DDP (or one process) to move the reference, or drop the callback.")
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.sync_steps:
            return
        policy = dict(self.trainer.accelerator.unwrap_model(self.trainer.model).named_parameters())
        reference = self.trainer.ref_policy
        with torch.no_grad():
            for name, ref_param in reference.model.named_parameters():
                param = policy.get(name)
                if param is None or param.shape != ref_param.shape:
                    raise ValueError(f"SyncRefModelCallback: the reference's {name!r} has no counterpart of the same "
                                     f"shape in the policy; it needs a reference of the policy's architecture.")
                ref_param.mul_(1 - self.alpha).add_(param.to(ref_param.device, ref_param.dtype), alpha=self.alpha)
        reference.moved = True  # checkpoints now save the reference, so a resume keeps it
        self.syncs += 1
