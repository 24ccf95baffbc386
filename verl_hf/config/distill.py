"""On-policy distillation: the teacher that scores the student's own samples, and the loss that moves the student
towards it (verl_hf/algorithms/distill.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from .applies import TEACHER, _help, one_of, raise_first_failed

DISTILL_LOSSES = ("reverse_kl",)


@dataclass
class DistillFields:
    teacher_model_path: str | None = field(
        default=None,
        metadata=_help("The teacher of on-policy distillation (an id or path), or VerlTrainer(teacher=...) with a "
                       "model or a TeacherPolicy: a frozen causal LM with the student's tokenizer (checked at start-up; "
                       "trailing padding rows may differ) that scores every token the student samples. Placed like "
                       "the KL reference: a whole copy per process, partitioned under ZeRO-3, sharded under FSDP2."),
    )
    distill_loss: Annotated[str | None, TEACHER] = field(
        default=None,
        metadata=_help("None: 'reverse_kl' once a teacher is given. 'reverse_kl': each sampled token gets the advantage -distill_coef * (log p_student - log "
                       "p_teacher), added to the task advantages (if any reward is given) and trained through the "
                       "policy loss with its rollout_is corrections; in expectation over the student's own samples its "
                       "gradient is that of KL(student || teacher) (Thinking Machines' on-policy distillation, "
                       "tinker-cookbook's train_on_policy.py). The student's log-probs are the ratio's old ones (one "
                       "update per round: the live ones, detached; no extra forward)."),
    )
    distill_coef: Annotated[float, TEACHER] = field(
        default=1.0, metadata=_help("Weight of the distillation advantage against the task advantages."),
    )


def check_distill(cfg) -> None:
    if cfg.distill_loss is not None:
        one_of("distill_loss", cfg.distill_loss, DISTILL_LOSSES)
    raise_first_failed(cfg, [("distill_coef", cfg.distill_coef > 0, "must be > 0 (the teacher's pull on the student)")])
