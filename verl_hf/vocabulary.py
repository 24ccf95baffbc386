"""Can a teacher and a student be compared token by token? Checked once, at start-up, before any training.

On-policy distillation hands the student's sampled token ids to the teacher, and its losses compare the two
models' next-token distributions id by id. Both only mean something if id 17 is the same token for both models.
Nothing fails at run time when it is not: the teacher scores different tokens than the student sampled, and
the distillation is silently wrong (TRL issue #4562). So `shared_vocabulary` refuses such a pair by name, and
returns the number of leading ids [0, n) on which the two distributions are compared.

What it checks: the two tokenizers' token -> id maps (added tokens included) are equal; their eos ids agree;
every id a tokenizer can produce lies inside both models' embedding rows. Models may carry padding rows
beyond their tokenizer (Qwen2.5 shares one tokenizer of 151665 tokens between 0.5B with 151936 rows and 7B with
152064): n is the smaller row count, and the larger model's trailing rows, which no token uses, are left out.
What it leaves alone: chat templates. The teacher scores token ids, not text, so a teacher with another chat
template (or none) is fine.

See it work: tests/test_vocabulary.py.
"""

from __future__ import annotations

# Only eos: with equal token maps every id is the same token for both, and which token a tokenizer calls pad or
# bos changes nothing the teacher scores (pad positions are masked; a bos is an ordinary token of the prompt).
SPECIAL_IDS = ("eos_token_id",)
FIX = "use a teacher of the same tokenizer family as the student, or load both with the same tokenizer"
EXAMPLES = 3  # differing tokens named in an error; enough to recognise the mismatch, short enough to read


def shared_vocabulary(student_tokenizer, teacher_tokenizer, student_vocab_size: int, teacher_vocab_size: int,
                      teacher_name: str = "teacher") -> int:
    """The number n of leading ids [0, n) on which the student's and the teacher's distributions are compared.

    `*_vocab_size` are the models' embedding / LM-head row counts (`config.vocab_size`), which may exceed the
    tokenizer's length by padding rows; n = the smaller of the two. Raises ValueError, naming the tokens, ids or
    sizes that differ and what to do, when the teacher cannot score the student's tokens id by id.

    The token maps must be equal, not merely agree on the student's tokens: a teacher with extra tokens puts
    probability on ids the student cannot represent, and a loss over [0, n) would then compare distributions
    that do not sum over the same tokens. Equal maps is the simple rule that has no such case.
    """
    student_vocab, teacher_vocab = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if student_vocab != teacher_vocab:
        raise ValueError(_token_map_message(student_vocab, teacher_vocab, teacher_name))
    _check_special_ids(student_tokenizer, teacher_tokenizer, teacher_name)
    ids_used = max(len(student_tokenizer), len(teacher_tokenizer), max(student_vocab.values(), default=-1) + 1)
    return _shared_rows(ids_used, student_vocab_size, teacher_vocab_size, teacher_name)


def _token_map_differences(student_vocab: dict[str, int], teacher_vocab: dict[str, int],
                           teacher_name: str = "teacher") -> list[str]:
    """Each token whose id differs between the two maps, or that only one map has, as a sentence; by id."""
    lines = []
    for token in student_vocab.keys() | teacher_vocab.keys():
        s_id, t_id = student_vocab.get(token), teacher_vocab.get(token)
        if s_id == t_id:
            continue
        if s_id is None:
            lines.append((t_id, f"token {token!r} (id {t_id}) exists for the {teacher_name} only"))
        elif t_id is None:
            lines.append((s_id, f"token {token!r} (id {s_id}) exists for the student only"))
        else:
            lines.append((min(s_id, t_id), f"token {token!r} is id {s_id} for the student and {t_id} for the "
                                           f"{teacher_name}"))
    return [line for _, line in sorted(lines)]


def _token_map_message(student_vocab: dict[str, int], teacher_vocab: dict[str, int], teacher_name: str) -> str:
    """The refusal for unequal token maps: a few concrete differences, why it matters, and the fix."""
    differences = _token_map_differences(student_vocab, teacher_vocab, teacher_name)
    more = f"; and {len(differences) - EXAMPLES} more" if len(differences) > EXAMPLES else ""
    return (f"the student's and the {teacher_name}'s tokenizers map tokens to different ids "
            f"({len(student_vocab)} vs {len(teacher_vocab)} tokens, {len(differences)} differing): "
            f"{'; '.join(differences[:EXAMPLES])}{more}. The {teacher_name} would score other tokens than the "
            f"student sampled (or put probability on ids the student cannot represent), and the distillation would "
            f"be silently wrong (TRL issue #4562). Fix: {FIX}.")


def _check_special_ids(student_tokenizer, teacher_tokenizer, teacher_name: str) -> None:
    """eos ids must be equal (SPECIAL_IDS; a name both tokenizers leave unset is not compared).

    eos matters because a response ends at the student's eos: a teacher whose eos is another token scores the
    student's stop as an ordinary token and teaches it not to stop where it should.
    """
    for name in SPECIAL_IDS:
        s_id, t_id = getattr(student_tokenizer, name, None), getattr(teacher_tokenizer, name, None)
        both_set = s_id is not None and t_id is not None
        if s_id != t_id and (name == "eos_token_id" or both_set):
            token = name.removesuffix("_id")
            raise ValueError(
                f"{name} differs: {s_id} ({getattr(student_tokenizer, token, None)!r}) for the student, {t_id} "
                f"({getattr(teacher_tokenizer, token, None)!r}) for the {teacher_name}; both must mark the same "
                f"token for the {teacher_name} to score the student's responses as the student ends and pads them. "
                f"Fix: set the {teacher_name} tokenizer's {token} to the student's, or {FIX}.")


def _shared_rows(ids_used: int, student_vocab_size: int, teacher_vocab_size: int, teacher_name: str) -> int:
    """min(rows), once every id the tokenizers can produce lies below it; padding rows past it are left out."""
    for who, rows in (("student", student_vocab_size), (teacher_name, teacher_vocab_size)):
        if not isinstance(rows, int) or rows <= 0:
            raise ValueError(f"the {who}'s vocab size (embedding rows) is {rows!r}; pass a positive int, "
                             f"the model's config.vocab_size or get_output_embeddings().weight.shape[0].")
    shared = min(student_vocab_size, teacher_vocab_size)
    if ids_used > shared:
        short = " and the ".join(who for who, rows in (("student", student_vocab_size),
                                                       (teacher_name, teacher_vocab_size)) if rows < ids_used)
        raise ValueError(
            f"the tokenizer produces ids up to {ids_used - 1} ({ids_used} tokens) but the models share only "
            f"{shared} embedding rows (student {student_vocab_size}, {teacher_name} {teacher_vocab_size}): ids "
            f"{shared}..{ids_used - 1} have no row in the {short}. Fix: check both checkpoints go with this "
            f"tokenizer, or grow the {short}'s rows with model.resize_token_embeddings({ids_used}).")
    return shared
