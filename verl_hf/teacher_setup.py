"""The teacher of on-policy distillation, from what the user gave: `teacher=` on VerlTrainer (an id or path, a
model, or a `TeacherPolicy`) or `teacher_model_path`.

`check_teacher` runs before any model loads: the teacher's tokenizer and config (not its weights) against the
student's, through `vocabulary.shared_vocabulary`, which refuses a teacher that would score other tokens than the
student sampled. `make_teacher` then loads it and places it like the KL reference (Placement.place_frozen).

See it work: tests/test_distill_training.py.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .roles import TeacherPolicy
from .roles.served_teacher import ServedTeacher
from .roles.scoring import logits_postprocessing, output_head
from .config.distill import THROUGH_THE_HEAD
from .vocabulary import shared_vocabulary

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeacherSource:
    """The teacher as given (an id or path, a model, or a TeacherPolicy; or the ServedTeacher answering at
    teacher_server_url), its tokenizer, and the ids [0, vocab_size) on which it scores the student's tokens."""
    given: object
    tokenizer: object
    vocab_size: int


def check_teacher(teacher, args, tokenizer, student) -> TeacherSource | None:
    """None without a teacher; else the teacher checked against the student's tokenizer and rows, and against
    the settings it cannot serve, before any model loads."""
    if teacher is not None and args.teacher_model_path:
        raise ValueError(f"teacher= and teacher_model_path={args.teacher_model_path!r} both name the teacher; give "
                         f"one.")
    teacher = args.teacher_model_path if teacher is None else teacher
    if teacher is None:
        return None
    _refuse_settings_with_a_teacher(args)
    teacher = str(teacher) if isinstance(teacher, os.PathLike) else teacher
    name, config, teacher_tokenizer = _teacher_parts(teacher)
    student_config = _student_config(student)
    if args.distill_loss in THROUGH_THE_HEAD:  # a served teacher's head is the server's: only the student's here
        read = [("student", student_config)] + ([] if args.teacher_server_url else [(f"teacher {name}", config)])
        for who, each in read:
            rescaled = logits_postprocessing(each)
            if rescaled:
                raise ValueError(f"distill_loss={args.distill_loss!r} reads the {who}'s LM head in chunks, but its "
                                 f"forward changes the logits after the head ({rescaled}); use "
                                 f"distill_loss='reverse_kl'.")
    student_rows, teacher_rows = _rows(student_config), _rows(config)
    if student_rows > teacher_rows:
        raise ValueError(f"the student has {student_rows} embedding rows and the teacher {name} {teacher_rows}: the "
                         f"student can sample an id the teacher has no row for, and the teacher could not read that "
                         f"response. Use a teacher with at least the student's rows (the larger member of a family "
                         f"as teacher), or resize the student's embeddings to {teacher_rows} rows.")
    shared = shared_vocabulary(tokenizer, teacher_tokenizer, student_rows, teacher_rows, teacher_name=f"teacher {name}")
    if isinstance(teacher, TeacherPolicy):
        _check_given_role(teacher, args, shared)
    if args.teacher_server_url:  # asked now, before any model loads: the server answers with the teacher
        teacher = _served(teacher, args, shared, teacher_rows)
    return TeacherSource(teacher, teacher_tokenizer, shared)


def _served(teacher, args, shared: int, teacher_rows: int) -> ServedTeacher:
    if not isinstance(teacher, str):
        raise ValueError(f"teacher_server_url={args.teacher_server_url!r} serves the teacher, so it is named by its id "
                         f"or path (teacher_model_path, or teacher= as a string), not given as a "
                         f"{type(teacher).__name__}.")
    if teacher_rows > shared:
        logger.warning("the served teacher %s has %d rows and shares %d with the student: vLLM normalises its "
                       "log-probs over all of them (the padding rows' share, if any, stays in), and top-k ids beyond "
                       "%d are dropped", teacher, teacher_rows, shared, shared)
    topk = args.distill_topk if args.distill_loss == "topk_forward_kl" else 0
    return ServedTeacher(args.teacher_server_url, teacher, shared, topk, args.teacher_server_timeout_s,
                         args.max_prompt_length + args.max_response_length)


def _refuse_settings_with_a_teacher(args) -> None:
    """What distillation does not combine with yet, each with the reason."""
    if args.dynamic_sampling:
        raise ValueError("dynamic_sampling=True with a distillation teacher: it drops prompt groups whose task rewards "
                         "are all equal, but they still carry the teacher's per-token signal (without a task reward "
                         "every group would be dropped). Set dynamic_sampling=False.")
    if args.safe_rl:
        raise ValueError("a distillation teacher with Safe-RLHF (cost_funcs or cost_model_path): the constraint "
                         "rescales the advantages by 1 + lambda, and the teacher's share would move with lambda; "
                         "they do not combine yet. Drop one of them.")


def _teacher_parts(teacher) -> tuple[str, object, object]:
    """(its name for messages, its config, its tokenizer), without loading weights for an id or path."""
    if isinstance(teacher, str):  # check_model_paths said already if a local path is missing
        return teacher, AutoConfig.from_pretrained(teacher), AutoTokenizer.from_pretrained(teacher)
    model = teacher.model if isinstance(teacher, TeacherPolicy) else teacher
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"teacher must be an id, a path, a causal LM or a TeacherPolicy, got {type(teacher).__name__}.")
    name = getattr(model.config, "_name_or_path", "") or "(given in memory)"
    return name, model.config, getattr(teacher, "tokenizer", None) or _tokenizer_of(model)


def _check_given_role(role: TeacherPolicy, args, shared: int) -> None:
    """A TeacherPolicy the user built scores at the run's temperature and on the shared ids at most."""
    if role.temperature != args.temperature:
        raise ValueError(f"the given TeacherPolicy scores at temperature={role.temperature}, the student samples and "
                         f"scores at temperature={args.temperature}: the two distributions would not compare. Build "
                         f"it with TeacherPolicy(..., temperature={args.temperature}).")
    if role.vocab_size is not None and role.vocab_size > shared:
        raise ValueError(f"the given TeacherPolicy has vocab_size={role.vocab_size}, more than the {shared} ids it "
                         f"shares with the student; leave vocab_size=None (set to {shared} here) or set it to "
                         f"{shared}.")


def make_teacher(placement, source: TeacherSource | None, args, student) -> TeacherPolicy | None:
    """The TeacherPolicy, loaded if given by path and placed where the actor's weights are (a given
    TeacherPolicy is used as it is, placed by its owner); for GKD both heads checked to be computable in chunks."""
    if source is None:
        return None
    served = isinstance(source.given, ServedTeacher)
    role = source.given if served else _placed_teacher(placement, source, args)
    if args.distill_loss in THROUGH_THE_HEAD:
        for who, model in [("student", student)] + ([] if served else [("teacher", role.model)]):
            if output_head(model) is None:
                raise ValueError(f"distill_loss={args.distill_loss!r} reads the {who}'s LM head in chunks, but its "
                                 f"logits cannot be "
                                 f"computed that way (a LoRA-adapted or non-Linear head, or a forward that rescales "
                                 f"the logits: see the log); use distill_loss='reverse_kl'.")
    return role


def _placed_teacher(placement, source: TeacherSource, args) -> TeacherPolicy:
    if isinstance(source.given, TeacherPolicy):
        source.given.vocab_size = source.given.vocab_size or source.vocab_size
        return source.given
    model = source.given
    if isinstance(model, str):
        from .trainer_setup import load_checkpoint  # noqa: PLC0415

        model = load_checkpoint(AutoModelForCausalLM, model, "teacher")
    model, engine = placement.place_frozen(model) if placement.shards_weights else (model.to(placement.device), None)
    role = TeacherPolicy(model, source.tokenizer, temperature=args.temperature,
                         logits_chunk_size=args.logits_chunk_size, vocab_size=source.vocab_size)
    role.engine = engine  # under ZeRO-3: keeps DeepSpeed's hooks and buffers alive
    return role


def _rows(config) -> int:
    """The LM head's rows: the text model's vocab_size (a vision-language config nests it)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def _student_config(student):
    if isinstance(student, str):
        return AutoConfig.from_pretrained(student)
    return getattr(student, "get_base_model", lambda: student)().config


def _tokenizer_of(model):
    path = getattr(model.config, "_name_or_path", None)
    if not path:
        raise ValueError("the teacher model has no path to load its tokenizer from (needed to check it shares the "
                         "student's vocabulary); pass teacher=TeacherPolicy(model, tokenizer=...).")
    return AutoTokenizer.from_pretrained(path)


def distill_divergence(teacher, batch, args):
    """The per-token divergence the student's forward computes against the teacher (`scored_responses(divergence=
    ...)`): GKD's against the teacher's forward run now, the top-k forward KL against the served teacher's top-k
    scored into the round; None for the reverse-KL advantage (or without a teacher)."""
    if args.distill_loss == "gkd":
        return teacher.divergence_against(batch, args.gkd_beta)
    if args.distill_loss == "topk_forward_kl":
        return teacher.topk_divergence(batch, args.logits_chunk_size)
    return None
