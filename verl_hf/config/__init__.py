"""`VerlConfig`: the one configuration object, a `TrainingArguments` with the RL fields added.

Users see one flat dataclass (YAML, `HfArgumentParser`, `verl-hf train --help`); its fields are declared by
the pipeline stage that reads them, each stage in its own module next to its own checks (generation.py,
vision.py, sync.py, asynchronous.py, rewards.py, multi_turn.py, safety.py, algorithm.py, kl.py, distill.py, critic.py,
evaluation.py, precision.py),
and documented once, in `metadata["help"]`. TRL's GRPOConfig names are taken too (trl_names.py). A field that takes effect only in some setups declares its
condition in its type (applies.py), and one check refuses it set where it cannot act.

`__post_init__` runs in three kinds of step, named so: `resolve_*` turns a value into the one it stands for
(bf16=None, rollout_engine='auto', a JSON string, one name for a list); `set_up_process` is the only step
that acts on the process (process.py says why it runs here); `check_*` only reads, and stops with the fix.
Everything runs before any model is loaded.

Batch vocabulary (per device, counted in completions as in TRL):
- `per_device_train_batch_size` completions go through one forward/backward (a micro-step);
- `gradient_accumulation_steps` micro-steps make an optimizer step;
- `generation_batch_size` completions are sampled in one rollout round (default: one optimizer step's worth),
  i.e. `generation_batch_size / num_generations` prompts; the round then feeds `ppo_epochs` passes of
  micro-steps, so one rollout serves every accumulation step instead of generating per micro-step.

See it work: tests/test_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import TrainingArguments

from .algorithm import AlgorithmFields, check_algorithm, resolve_algorithm
from .asynchronous import AsyncFields, check_async
from .applies import (COLOCATED_VLLM, Applies, TrainerInputs, conditional_fields, fields_set_away, parse_json_dict,
                      raise_first_failed, refuse_fields_that_cannot_apply)
from .critic import CriticFields, check_critic
from .distill import DistillFields, check_distill
from .evaluation import EvaluationFields, check_evaluation
from .generation import ROLLOUT_DTYPES, ROLLOUT_ENGINES, GenerationFields, check_generation, resolve_rollout_engine
from .kl import KLFields, check_kl
from .machine import bf16_is_fast, fsdp_version_wanted, wants_deepspeed
from .multi_turn import MultiTurnFields, check_multi_turn, resolve_multi_turn
from .parallel import check_parallel
from .precision import PrecisionFields, resolve_bf16
from .process import set_up_process
from .rewards import RewardFields, check_rewards, resolve_rewards
from .safety import SafetyFields, check_safety, resolve_safety
from .sync import SyncFields, check_sync
from .trainer_defaults import TrainerDefaultFields
from .trl_names import translate_trl_names
from .value_types import check_value_types
from .vision import VisionFields, check_vision

# The stages' checks in pipeline order, except that safety and the critic come after the algorithm (they ask the
# estimator's registry entry, whose name check_algorithm checks), and the conditional fields come last (their
# conditions read values the others have checked).
CHECKS = (check_parallel, check_generation, check_vision, check_sync, check_rewards, check_multi_turn, check_algorithm, check_kl,
          check_distill, check_safety, check_critic, check_async, check_evaluation, refuse_fields_that_cannot_apply)


class TakesTRLNames(type):
    """VerlConfig's metaclass: its keyword arguments may use TRL's GRPOConfig names (trl_names.py), translated
    before the dataclass's own __init__ sees them, for VerlConfig and every dataclass derived from it."""

    def __call__(cls, *args, **kwargs):
        return super().__call__(*args, **translate_trl_names(kwargs, where=cls.__name__))


# Bases from the last stage to the first: dataclasses collect fields from the end of the MRO, so the fields come
# in pipeline order after TrainingArguments' own (PrecisionFields' bf16 replaces the Trainer's, in its place).
@dataclass
class VerlConfig(EvaluationFields, CriticFields, DistillFields, KLFields, AlgorithmFields, SafetyFields,
                 MultiTurnFields, RewardFields, AsyncFields, SyncFields, VisionFields, GenerationFields,
                 PrecisionFields, TrainerDefaultFields, TrainingArguments, metaclass=TakesTRLNames):
    def __post_init__(self):
        check_value_types(self)  # "8" for a number: named here, before anything compares it
        # Rollout rows are raw dataset rows (reward functions read their columns): never drop columns.
        self.remove_unused_columns = False
        for name in ("data_key_map", "chat_template_kwargs"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, parse_json_dict(name, getattr(self, name)))
        for resolve in (resolve_algorithm, resolve_rewards, resolve_multi_turn, resolve_safety, resolve_bf16,
                        resolve_rollout_engine):
            resolve(self)
        set_up_process(self)
        super().__post_init__()
        _check_trainer_fields(self)
        for check in CHECKS:
            check(self)

    def to_dict(self) -> dict:
        """TrainingArguments' dict, JSON-safe: a function or object given where a "module:function" string may stand
        (reward_funcs, tools, ...) is written as its name (`to_json_string`, verl_config.json, the trackers)."""
        return {key: _named(value) for key, value in super().to_dict().items()}

    @property
    def rollout_generation_batch_size(self) -> int:
        """Completions per device per rollout round (generation_batch_size resolved)."""
        return self.generation_batch_size or self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def prompts_per_round(self) -> int:
        return self.rollout_generation_batch_size // self.num_generations

    @property
    def micro_steps_per_round(self) -> int:
        """Micro-steps (dataloader batches) one rollout round feeds, all ppo_epochs included."""
        return self.ppo_epochs * self.rollout_generation_batch_size // self.per_device_train_batch_size

    @property
    def optimizer_steps_per_round(self) -> int:
        """Optimizer steps one rollout round feeds (its micro-steps over gradient accumulation)."""
        return self.micro_steps_per_round // self.gradient_accumulation_steps

    @property
    def training_is_sharded(self) -> bool:
        """DeepSpeed or FSDP holds the training weights (the update's pieces are not counted there yet)."""
        return wants_deepspeed(self) or fsdp_version_wanted(self) is not None


def _named(value):
    if isinstance(value, (list, tuple)):
        return [_named(v) for v in value]
    if callable(value):
        function = getattr(value, "func", value)  # functools.partial: the function it wraps
        function = function if hasattr(function, "__qualname__") else type(function)
        return f"{function.__module__}:{function.__qualname__}"
    return value


def _check_trainer_fields(cfg: VerlConfig) -> None:
    """Trainer fields this library depends on, before torch.optim or a division meets them."""
    raise_first_failed(cfg, [
        ("learning_rate", cfg.learning_rate >= 0, "must be >= 0"),
        ("per_device_train_batch_size", cfg.per_device_train_batch_size >= 1, "must be >= 1"),
        ("gradient_accumulation_steps", cfg.gradient_accumulation_steps >= 1, "must be >= 1"),
    ])


FIELD_APPLIES = conditional_fields(VerlConfig)  # field name -> its Applies, for tools and tests

__all__ = ["VerlConfig", "Applies", "TrainerInputs", "FIELD_APPLIES", "COLOCATED_VLLM", "ROLLOUT_ENGINES",
           "ROLLOUT_DTYPES", "bf16_is_fast", "conditional_fields", "fields_set_away", "fsdp_version_wanted",
           "refuse_fields_that_cannot_apply"]
