"""The teacher of on-policy distillation, from what the user gave: `teacher=` on VerlTrainer (an id or path, a
model, or a `TeacherPolicy`) or `teacher_model_path`.

`check_teacher` runs before any model loads: the teacher's tokenizer and config (not its weights) against the
student's, through `vocabulary.shared_vocabulary`, which refuses a teacher that would score other tokens than the
student sampled. `make_teacher` then loads it and places it like the KL reference (Placement.place_frozen).

See it work: tests/test_distill_training.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .roles import TeacherPolicy
from .roles.scoring import output_head
from .vocabulary import shared_vocabulary


@dataclass(frozen=True)
class TeacherSource:
    """The teacher as given (an id or path, a model, or a TeacherPolicy), its tokenizer, and the ids [0,
    vocab_size) on which it scores the student's tokens."""
    given: object
    tokenizer: object
    vocab_size: int


def check_teacher(teacher, args, tokenizer, student) -> TeacherSource | None:
    """None without a teacher; else the teacher checked against the student's tokenizer and rows."""
    if teacher is not None and args.teacher_model_path:
        raise ValueError(f"teacher= and teacher_model_path={args.teacher_model_path!r} both name the teacher; give one.")
    teacher = args.teacher_model_path if teacher is None else teacher
    if teacher is None:
        return None
    if isinstance(teacher, os.PathLike):
        teacher = str(teacher)
    if isinstance(teacher, str):  # check_model_paths said already if a local path is missing
        name, teacher_tokenizer, rows = teacher, AutoTokenizer.from_pretrained(teacher), _rows(AutoConfig.from_pretrained(teacher))
    else:
        model = teacher.model if isinstance(teacher, TeacherPolicy) else teacher
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"teacher must be an id, a path, a causal LM or a TeacherPolicy, got {type(teacher).__name__}.")
        name, rows = getattr(model.config, "_name_or_path", "") or "teacher", _rows(model.config)
        teacher_tokenizer = getattr(teacher, "tokenizer", None) or _tokenizer_of(model)
    shared = shared_vocabulary(tokenizer, teacher_tokenizer, _student_rows(student), rows, teacher_name=f"teacher {name}")
    return TeacherSource(teacher, teacher_tokenizer, shared)


def make_teacher(placement, source: TeacherSource | None, args, student) -> TeacherPolicy | None:
    """The TeacherPolicy, loaded if given by path and placed where the actor's weights are (a given
    TeacherPolicy is used as it is, placed by its owner); for GKD both heads checked to be computable in chunks."""
    if source is None:
        return None
    role = _placed_teacher(placement, source, args)
    if args.distill_loss == "gkd":
        for who, model in (("student", student), ("teacher", role.model)):
            if output_head(model) is None:
                raise ValueError(f"distill_loss='gkd' reads the {who}'s LM head in chunks, but its logits cannot be "
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

        model = load_checkpoint(AutoModelForCausalLM, model, "teacher_model_path")
    model, engine = placement.place_frozen(model) if placement.shards_weights else (model.to(placement.device), None)
    role = TeacherPolicy(model, source.tokenizer, temperature=args.temperature,
                         logits_chunk_size=args.logits_chunk_size, vocab_size=source.vocab_size)
    role.engine = engine  # under ZeRO-3: keeps DeepSpeed's hooks and buffers alive
    return role


def _rows(config) -> int:
    """The LM head's rows: the text model's vocab_size (a vision-language config nests it)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def _student_rows(student) -> int:
    if isinstance(student, str):
        return _rows(AutoConfig.from_pretrained(student))
    base = getattr(student, "get_base_model", lambda: student)()
    return _rows(base.config)


def _tokenizer_of(model):
    path = getattr(model.config, "_name_or_path", None)
    if not path:
        raise ValueError("the teacher model has no path to load its tokenizer from (needed to check it shares the "
                         "student's vocabulary); pass teacher=TeacherPolicy(model, tokenizer=...).")
    return AutoTokenizer.from_pretrained(path)
