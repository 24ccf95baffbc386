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
from .rollout.base import left_pad, mask_after_eos

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


def dataset_answers(rows: list[dict], tokenizer, eos_ids: list[int], num_generations: int,
                    max_response_length: int) -> RolloutBatch:
    """The rows' prompts with their dataset answers, ended as the engines end a sample: the tokenizer's EOS is
    appended, the response stops at its first id in `eos_ids` (an answer holding one is cut there), and one cut
    at max_response_length without any is truncated. Each answer stands for the num_generations samples of its
    prompt (repeated), so the round keeps a sampled round's shape. No rollout log-probs: no engine sampled these.

    prompt_ids (B, Lp) left-padded; response_ids (B, Lr) right-padded with the pad id; B = len(rows) * n."""
    n, pad = num_generations, tokenizer.pad_token_id
    texts = [answer_text(row.get(ANSWER_COLUMN), i) for i, row in enumerate(rows)]
    answers = [(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[:max_response_length]
               for text in texts]
    prompt_ids, prompt_mask = left_pad([row["prompt_ids"] for row in rows for _ in range(n)], pad)
    response = torch.full((len(rows) * n, max(len(a) for a in answers)), pad, dtype=torch.long)
    for row, ids in enumerate(a for a in answers for _ in range(n)):
        response[row, : len(ids)] = torch.tensor(ids)
    # a truncated answer is the widest row (the limit), so no padding follows it that could read as an EOS
    response_ids, response_mask, truncated = mask_after_eos(response, eos_ids, pad)
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        group_ids=torch.arange(len(rows)).repeat_interleave(n), truncated=truncated, from_dataset=True,
        prompts=[row.get("prompt", tokenizer.decode(row["prompt_ids"])) for row in rows for _ in range(n)],
        completions=tokenizer.batch_decode(response_ids, skip_special_tokens=True), columns=row_columns(rows, n))


def check_answer_column(dataset, data_key_map: dict | None = None) -> None:
    """gkd_lambda < 1: the training dataset as given has the answers (data_key_map may name another column for
    them), each in a form `answer_text` reads; said before any model loads, naming the dataset's own row."""
    column = (data_key_map or {}).get(ANSWER_COLUMN, ANSWER_COLUMN)
    if column not in dataset.column_names:
        raise ValueError(f"gkd_lambda < 1 trains some rounds on the training dataset's answers, its "
                         f"'{ANSWER_COLUMN}' column, which it lacks (columns: {dataset.column_names}): add one, or "
                         f"name yours with data_key_map={{'{ANSWER_COLUMN}': '<your column>'}} (the evaluation "
                         f"dataset then needs that column too), or set gkd_lambda=1.")
    for index, completion in enumerate(dataset[column]):
        answer_text(completion, index)
