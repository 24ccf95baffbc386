"""GKD's mix of on-policy and dataset answers (`gkd_lambda`): which rounds train on the dataset's `completion`
column instead of the student's samples, and those answers as a RolloutBatch of the same layout as an engine's.

Agarwal et al. 2024 (GKD) draw, for each batch, the student's own answers with probability lambda and the
dataset's answers otherwise (TRL's `lmbda`); here the draw is per round, from the seed and the step, so every
process makes the same one and a resumed run makes it again.

See it work: tests/test_dataset_answers.py.
"""

from __future__ import annotations

import random

import torch

from .batch import RolloutBatch, row_columns
from .rollout.base import left_pad

ANSWER_COLUMN = "completion"


def samples_on_policy(gkd_lambda: float, seed: int, step: int) -> bool:
    """Whether the round of optimizer step `step` samples the student (probability gkd_lambda), else takes the
    dataset's answers. 1 and 0 decide without a draw."""
    if gkd_lambda >= 1.0 or gkd_lambda <= 0.0:
        return gkd_lambda >= 1.0
    return random.Random(f"gkd_lambda:{seed}:{step}").random() < gkd_lambda


def answer_text(completion, row_index: int) -> str:
    """The answer of one dataset row: a string, or TRL's conversational form, a list holding one assistant
    message ({"role": "assistant", "content": ...})."""
    if isinstance(completion, str):
        return completion
    if (isinstance(completion, list) and len(completion) == 1 and isinstance(completion[0], dict)
            and completion[0].get("role") == "assistant" and isinstance(completion[0].get("content"), str)):
        return completion[0]["content"]
    raise ValueError(f"gkd_lambda < 1 trains on the dataset's '{ANSWER_COLUMN}' column, but row {row_index} holds "
                     f"{completion!r}: give each row a string, or a list of one assistant message "
                     f"[{{'role': 'assistant', 'content': '...'}}].")


def dataset_answers(rows: list[dict], tokenizer, num_generations: int, max_response_length: int) -> RolloutBatch:
    """The rows' prompts with their dataset answers, each answer followed by EOS as the engine's samples end, cut
    to max_response_length (truncated, as a sample that hit the limit). Each row is repeated num_generations
    times, so the round has the shape a sampled one has. No rollout log-probs: no engine sampled these tokens.

    prompt_ids (B, Lp) left-padded; response_ids (B, Lr) right-padded with the pad id; B = len(rows) * n."""
    n, pad = num_generations, tokenizer.pad_token_id
    texts = [answer_text(row.get(ANSWER_COLUMN), i) for i, row in enumerate(rows)]
    answers = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        answers.append(ids[:max_response_length])
    prompt_ids, prompt_mask = left_pad([row["prompt_ids"] for row in rows for _ in range(n)], pad)
    width = max(len(a) for a in answers)
    response_ids = torch.full((len(rows) * n, width), pad, dtype=torch.long)
    response_mask = torch.zeros_like(response_ids)
    for row, ids in enumerate(a for a in answers for _ in range(n)):
        response_ids[row, : len(ids)], response_mask[row, : len(ids)] = torch.tensor(ids), 1
    truncated = torch.tensor([ids[-1] != tokenizer.eos_token_id for ids in answers]).repeat_interleave(n)
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        group_ids=torch.arange(len(rows)).repeat_interleave(n), truncated=truncated,
        prompts=[row.get("prompt", tokenizer.decode(row["prompt_ids"])) for row in rows for _ in range(n)],
        completions=tokenizer.batch_decode(response_ids, skip_special_tokens=True), columns=row_columns(rows, n))


def check_answer_column(dataset) -> None:
    """gkd_lambda < 1: the training dataset has the answers, each in a form `answer_text` reads (said before any
    model loads)."""
    if dataset is None or ANSWER_COLUMN not in dataset.column_names:
        have = None if dataset is None else dataset.column_names
        raise ValueError(f"gkd_lambda < 1 trains some rounds on the training dataset's answers, its "
                         f"'{ANSWER_COLUMN}' column, which it lacks (columns: {have}): add one (data_key_map can "
                         f"rename yours, e.g. '{{\"{ANSWER_COLUMN}\": \"response\"}}'), or set gkd_lambda=1.")
    for index, completion in enumerate(dataset[ANSWER_COLUMN]):
        answer_text(completion, index)
