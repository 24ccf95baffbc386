"""TrainingArguments' defaults that RL changes, and those it keeps, each with the reason in its help.

Changed: `learning_rate` 5e-5 -> 1e-6 (TRL's and verl's GRPO rate; 5e-5 moves a policy far from its sampler in
one step: the demo's own config measured 3e-4 destroying a policy) and `logging_steps` 500 -> 10 (TRL's: an RL run
is hundreds of steps, and a run that logs nothing for 500 of them cannot be watched). A config that sets them
behaves as before. Kept, and why: `max_grad_norm` 1.0 (TRL's and verl's), `weight_decay` 0.0 (TRL's; verl's
actor uses 0.01), `warmup_steps` 0 (TRL's and verl's), `gradient_checkpointing` False (TRL turns it on; here
it is a memory setting to choose: it costs a second forward), `save_steps` 500 (a checkpoint holds the policy,
its optimizer and the RL state). Also kept: `lr_scheduler_type` linear (TRL's), `eval_strategy` no,
`report_to` none (TrainingArguments' own).

See it work: tests/test_trl_names.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .applies import _help


@dataclass
class TrainerDefaultFields:
    learning_rate: float = field(default=1e-6, metadata=_help(
        "The policy's AdamW learning rate. 1e-6 (TRL's and verl's GRPO default; TrainingArguments' 5e-5 moves a "
        "policy far from the one that sampled its data in one step). Tiny demo models train at 1e-4."))
    logging_steps: float = field(default=10, metadata=_help(
        "Log every this many optimizer steps (a float below 1: that share of the run). 10, TRL's (TrainingArguments' "
        "500 would log nothing in most RL runs)."))
    max_grad_norm: float = field(default=1.0, metadata=_help("Gradient clipping norm. 1.0, TRL's and verl's."))
    weight_decay: float = field(default=0.0, metadata=_help(
        "AdamW weight decay. 0.0, TRL's (verl's actor uses 0.01)."))
    warmup_steps: float = field(default=0, metadata=_help(
        "Learning-rate warmup steps (a float below 1: that share of the run). 0, TRL's and verl's."))
    gradient_checkpointing: bool = field(default=False, metadata=_help(
        "Recompute activations in the backward: less memory, a second forward's time. Off (TRL turns it on): choose "
        "it where memory is short."))
    save_steps: float = field(default=500, metadata=_help(
        "Save a checkpoint every this many steps (with save_strategy='steps'). 500: a checkpoint holds the policy, "
        "its optimizer and the RL state, so saving often costs time and disk."))
