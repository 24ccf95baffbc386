"""On-policy distillation: the teacher that scores the student's own samples, and the loss that moves the student
towards it (verl_hf/algorithms/distill.py).

See it work: tests/test_distill_training.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from .applies import TEACHER, Applies, _help, one_of, raise_first_failed

DISTILL_LOSSES = ("reverse_kl", "gkd")
GKD = Applies("distill_loss='gkd'", lambda c, g: c.distill_loss == "gkd", ("distill_loss",))


@dataclass
class DistillFields:
    teacher_model_path: str | None = field(
        default=None,
        metadata=_help("The teacher of on-policy distillation (an id or path), or VerlTrainer(teacher=...) with a "
                       "model or a TeacherPolicy: a frozen causal LM with the student's tokenizer (checked at "
                       "start-up; trailing padding rows may differ) that scores every token the student samples. "
                       "Placed like the KL reference: a whole copy per process, partitioned under ZeRO-3, sharded "
                       "under FSDP2."),
    )
    distill_loss: Annotated[str | None, TEACHER] = field(
        default=None,
        metadata=_help("None: 'reverse_kl' once a teacher is given. 'reverse_kl': each sampled token gets the "
                       "advantage -distill_coef * (log p_student - log p_teacher), added to the task advantages (if "
                       "any reward is given) and trained through the policy loss with its rollout_is corrections; in "
                       "expectation over the student's own samples its gradient is that of the per-token KL(student "
                       "|| teacher) at each sampled prefix, no credit from later tokens (Thinking Machines' on-policy "
                       "distillation, tinker-cookbook's train_on_policy.py, a discount of 0). The "
                       "student's log-probs are the ratio's old ones (one update per round: the live ones, detached; "
                       "no extra forward). 'gkd': GKD's generalized Jensen-Shannon divergence between the student's "
                       "and the teacher's whole next-token distributions at every response position of the student's "
                       "samples (Agarwal et al. 2024), gkd_beta between them, added to the loss times distill_coef "
                       "(token-level, aggregated like the policy loss); computed through both LM heads a chunk of rows "
                       "at a time, so neither model's logits are held whole."),
    )
    distill_coef: Annotated[float, TEACHER] = field(
        default=1.0, metadata=_help("Weight of the distillation signal: of the reverse-KL advantage against the task "
                                    "advantages, or of the GKD loss term."),
    )
    gkd_beta: Annotated[float, GKD] = field(
        default=0.5, metadata=_help("GKD's beta: 0 the forward KL(teacher || student), 1 the reverse KL(student || "
                                    "teacher), between them the generalized JSD with the mixture beta * p_teacher + "
                                    "(1 - beta) * p_student (TRL's convention and default)."),
    )


def check_distill(cfg) -> None:
    if cfg.distill_loss is not None:
        one_of("distill_loss", cfg.distill_loss, DISTILL_LOSSES)
    raise_first_failed(cfg, [
        ("distill_coef", cfg.distill_coef > 0, "must be > 0 (the teacher's pull on the student)"),
        ("gkd_beta", 0.0 <= cfg.gkd_beta <= 1.0, "must be in [0, 1] (0: forward KL, 1: reverse KL, between: the JSD)"),
        ("distill_loss", cfg.distill_loss != "gkd" or not cfg.training_is_sharded,
         "is not available under DeepSpeed or FSDP yet (under ZeRO-3 and FSDP2 both heads are sharded, and the "
         "chunked divergence reads them whole; ZeRO-1/2 are not tested with it): use one process or DDP, or "
         "distill_loss='reverse_kl'"),
        ("logits_chunk_size", cfg.distill_loss != "gkd" or cfg.logits_chunk_size != 0,
         "cannot hold with distill_loss='gkd', which goes through both LM heads in chunks (0 asks for the full "
         "logits); leave logits_chunk_size at None or set a chunk size"),
    ])
