"""Prompts from `datasets`: column mapping, chat templates, length filtering, and the round sampler.

A dataset needs a `prompt` column holding text or chat messages (a list of {"role", "content"} dicts);
`data_key_map={"prompt": "question"}` renames columns so that any dataset fits. Every other column is kept
and handed to the reward functions. Prompts longer than `max_prompt_length` tokens are dropped and counted:
cutting them would silently change the task.

See it work: tests/test_data.py.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch.utils.data import DataLoader

logger = logging.getLogger(__name__)

PROMPT_IDS = "prompt_ids"


def check_is_dataset(dataset, split: str) -> None:
    """A `datasets.Dataset` (or IterableDataset) with at least one row, or a clear error naming what was given."""
    if not hasattr(dataset, "column_names") or not hasattr(dataset, "map"):
        raise TypeError(f"the {split} dataset is a {type(dataset).__name__}; give a datasets.Dataset (e.g. "
                        f"datasets.Dataset.from_list(rows) for a list of dicts, or load_dataset(...)['{split}']).")
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(f"the {split} dataset has no rows.")


def apply_key_map(dataset, data_key_map: dict | None, split: str):
    """Rename dataset columns as `data_key_map` ({our name: their column}) says; check `prompt` exists."""
    check_is_dataset(dataset, split)
    columns = list(dataset.column_names)
    renames = {}
    for ours, theirs in (data_key_map or {}).items():
        if theirs not in columns:
            raise ValueError(
                f"data_key_map maps {ours!r} to column {theirs!r}, but the {split} dataset has columns {columns}."
            )
        if ours in columns and ours != theirs:
            raise ValueError(
                f"data_key_map maps {ours!r} to {theirs!r}, but the {split} dataset already has a {ours!r} column; "
                f"drop it first (dataset.remove_columns({ours!r}))."
            )
        if ours != theirs:
            renames[theirs] = ours
    dataset = dataset.rename_columns(renames) if renames else dataset
    if "prompt" not in dataset.column_names:
        raise ValueError(
            f"the {split} dataset has no 'prompt' column (columns: {list(dataset.column_names)}). Rename one with "
            f"VerlConfig(data_key_map={{'prompt': '<your column>'}})."
        )
    return dataset


def tokenize_prompt(tokenizer, prompt, tools: list[dict] | None = None, chat_only: bool = False) -> list[int]:
    """Token ids of one prompt: text as is, chat messages through the tokenizer's chat template (which shows
    `tools`). `chat_only` (multi-turn rollouts): text is refused."""
    if isinstance(prompt, str):
        if chat_only:
            refuse_text_prompt(prompt)
        return tokenizer(prompt).input_ids
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        for i, message in enumerate(prompt):
            if not isinstance(message.get("content"), (str, list)) and not message.get("tool_calls"):
                raise ValueError(f"chat message {i} ({message.get('role')!r}) of a prompt has no text 'content' "
                                 f"(got {message.get('content')!r}): {str(prompt)[:120]!r}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the prompts are chat messages but the tokenizer has no chat_template; set "
                "tokenizer.chat_template, or give plain-text prompts."
            )
        ids = tokenizer.apply_chat_template(prompt, tools=tools or None, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    raise ValueError(
        f"a prompt must be text or a list of chat messages ({{'role': ..., 'content': ...}}), got {type(prompt).__name__}: "
        f"{str(prompt)[:80]!r}"
    )


def refuse_text_prompt(prompt: str):
    raise ValueError("multi-turn rollouts (tools= / environment=) need chat prompts, a list of "
                     "{'role', 'content'} messages, to continue the conversation with the chat template; "
                     f"got text {prompt[:60]!r}. Map it to [{{'role': 'user', 'content': text}}].")


def _tokenized_row(tokenizer, row: dict, index: int, split: str, images=None, **kwargs) -> list[int]:
    try:
        if images is None:
            return tokenize_prompt(tokenizer, row["prompt"], **kwargs)
        if kwargs.get("chat_only") and isinstance(row["prompt"], str):
            refuse_text_prompt(row["prompt"])
    except ValueError as e:
        raise ValueError(f"{split} row {index}: {e}") from None
    # a vision-language policy's processor expands each image's placeholder (its errors name the row)
    return images.prompt_ids(row, f"{split} row {index}", kwargs.get("tools"))


MULTI_TURN_COLUMNS = {"messages": "the whole conversation", "tool_statuses": "each tool call's outcome",
                      "turn_rewards": "the environment's rewards per turn"}


def prepare_prompts(dataset, tokenizer, data_key_map: dict | None, max_prompt_length: int, split: str,
                    given_columns: dict[str, str] | None = None, images=None, **prompt_kwargs):
    """Map columns, add `prompt_ids`, drop over-long prompts (logged). Returns the new dataset.
    `images`: a vision-language policy's `vision.ImagePrompts` (the rows' images expanded in their ids).
    `given_columns`: name -> what it holds, of the columns the run adds for reward functions (multi-turn's
    are added with `chat_only`), which the dataset must not have. `prompt_kwargs`: `tools` and `chat_only`
    of tokenize_prompt."""
    dataset = apply_key_map(dataset, data_key_map, split)
    given = {**(MULTI_TURN_COLUMNS if prompt_kwargs.get("chat_only") else {}), **(given_columns or {})}
    taken = sorted(set(given) & set(dataset.column_names))
    if taken:
        raise ValueError(f"{split}: the run gives reward functions the columns "
                         f"{', '.join(f'{name!r} ({given[name]})' for name in given)}; the dataset has {taken} "
                         f"already. Rename them (data_key_map or Dataset.rename_column).")
    if PROMPT_IDS in dataset.column_names:
        dataset = dataset.remove_columns(PROMPT_IDS)
    dataset = dataset.map(lambda row, i: {PROMPT_IDS: _tokenized_row(tokenizer, row, i, split, images,
                                                                      **prompt_kwargs)},
                          with_indices=True, desc="tokenize prompts")
    before = len(dataset)
    # Empty: no tokens, or no text (a tokenizer may still add its BOS token to "").
    lengths = [0 if isinstance(text, str) and not text.strip() else len(ids)
               for text, ids in zip(dataset["prompt"], dataset[PROMPT_IDS])]
    empty, long = sum(n == 0 for n in lengths), sum(n > max_prompt_length for n in lengths)
    if empty == before:
        raise ValueError(f"every {split} prompt is empty (no tokens after the chat template); check the prompt "
                         f"column (data_key_map maps another column to 'prompt').")
    if long + empty == before:
        raise ValueError(f"every {split} prompt is longer than max_prompt_length={max_prompt_length} tokens"
                         f"{f' or empty ({empty})' if empty else ''}; raise max_prompt_length.")
    if long or empty:
        dataset = dataset.filter(lambda row, i: 0 < lengths[i] <= max_prompt_length, with_indices=True,
                                 desc="filter prompt length")
        logger.warning(f"{split}: dropped {long} of {before} prompts longer than max_prompt_length="
                       f"{max_prompt_length} tokens and {empty} empty ones.")
    return dataset


def prompt_options(multi_turn) -> dict:
    """prepare_prompts' `tools` and `chat_only` for a run with `multi_turn` (an agent.MultiTurnRollout, or
    None): its prompts must be chat and show its tools."""
    return {} if multi_turn is None else {"tools": multi_turn.tools_schema, "chat_only": True}


def reasoning_given(args) -> dict[str, str]:
    """The columns `reasoning_format` gives reward functions (none without it)."""
    from .rewards.reasoning import REASONING_COLUMNS

    return REASONING_COLUMNS if args.reasoning_format is not None else {}


def prepare_datasets(train_dataset, eval_dataset, tokenizer, args, multi_turn=None, images=None):
    """(train, eval) prepared with `prepare_prompts` (either may be None; eval may be a dict of named sets),
    with the prompt options of `multi_turn` (prompt_options) and a vision-language policy's `images`."""
    extra = {**prompt_options(multi_turn), "given_columns": reasoning_given(args), "images": images}

    def prepare(ds, split):
        return prepare_prompts(ds, tokenizer, args.data_key_map, args.max_prompt_length, split, **extra)

    if args.gkd_lambda < 1.0 and train_dataset is not None:  # on the rows as given: an error names the user's row
        from .dataset_answers import check_answer_column

        check_is_dataset(train_dataset, "train")
        check_answer_column(train_dataset, args.data_key_map)
    train = prepare(train_dataset, "train") if train_dataset is not None else None
    if isinstance(eval_dataset, dict):
        return train, {k: prepare(v, f"eval[{k}]") for k, v in eval_dataset.items()}
    return train, prepare(eval_dataset, "eval") if eval_dataset is not None else None


def keep_rows(rows: list[dict]) -> list[dict]:
    """Collate function: a batch is the list of dataset rows (reward functions need every column)."""
    return rows


class RoundBatchSampler:
    """Yields, for each rollout round, this process's prompt indices, `repeats` times in a row.

    The trainer samples once at the first repeat and uses the later ones only to count micro-steps, so the
    Trainer's own step, epoch and resume arithmetic stays true. Each process gets disjoint prompts; the
    order depends only on (seed, epoch), so a resumed run walks the same path.
    """

    def __init__(self, num_rows, prompts_per_round, repeats, num_processes=1, process_index=0, seed=0, shuffle=True):
        self.num_rows, self.prompts_per_round, self.repeats = num_rows, prompts_per_round, repeats
        self.num_processes, self.process_index = num_processes, process_index
        self.seed, self.shuffle, self.epoch = seed, shuffle, 0
        if self.num_rounds == 0:
            raise ValueError(
                f"the train dataset has {num_rows} prompts but one rollout round takes {prompts_per_round} prompts "
                f"on each of {num_processes} processes; add prompts or lower generation_batch_size."
            )

    @property
    def num_rounds(self) -> int:
        return self.num_rows // (self.prompts_per_round * self.num_processes)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = self._order(self.epoch)
        for r in range(self.num_rounds):
            indices = self._indices(order, r)
            for _ in range(self.repeats):
                yield indices

    def round_indices(self, round_number: int) -> list[int]:
        """This process's prompt indices of round `round_number`, counted over epochs from the run's start (what
        iterating epoch `round_number // num_rounds` yields there): asynchronous training samples rounds ahead."""
        epoch, r = divmod(round_number, self.num_rounds)
        return self._indices(self._order(epoch), r)

    def _order(self, epoch: int) -> torch.Tensor:
        if self.shuffle:
            return torch.randperm(self.num_rows, generator=torch.Generator().manual_seed(self.seed + epoch))
        return torch.arange(self.num_rows)

    def _indices(self, order: torch.Tensor, r: int) -> list[int]:
        start = (r * self.num_processes + self.process_index) * self.prompts_per_round
        return order[start : start + self.prompts_per_round].tolist()

    def __len__(self) -> int:
        return self.num_rounds * self.repeats


class RoundDataLoader(DataLoader):
    """A DataLoader whose epoch reaches the round sampler (the Trainer calls `set_epoch`)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class RLHFDataset:
    """Prompts ready for the roles: `RLHFDataset(dataset, tokenizer, ...).dataloader(batch_size)` yields dicts
    with `prompt_ids` (lists of token ids), `rows` (the dataset rows, for reward functions) and every column
    as a list. `actor.generate_sequences(batch)` takes such a batch as it is. Chat prompts (single or
    multi-turn message lists) go through the tokenizer's chat template.
    """

    def __init__(self, dataset, tokenizer, max_prompt_length: int = 512, max_response_length: int = 512,
                 data_key_map: dict | None = None, split: str = "train"):
        self.dataset = prepare_prompts(dataset, tokenizer, data_key_map, max_prompt_length, split)
        self.tokenizer, self.max_response_length = tokenizer, max_response_length

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def dataloader(self, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True) -> DataLoader:
        generator = torch.Generator().manual_seed(seed)
        collate = functools.partial(prompt_batch, max_response_length=self.max_response_length)
        return DataLoader(self.dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                          generator=generator, collate_fn=collate)


def round_dataloader(dataset, args, collate_fn) -> "RoundDataLoader":
    """The training dataloader: each round's prompt rows, repeated once per micro-step the round feeds, this
    process's share of them."""
    return RoundDataLoader(dataset, batch_sampler=round_sampler(len(dataset), args), collate_fn=collate_fn,
                           num_workers=args.dataloader_num_workers)


def round_sampler(num_rows: int, args) -> RoundBatchSampler:
    """The training dataloader's round sampler (asynchronous training asks it for rounds ahead)."""
    return RoundBatchSampler(num_rows, args.prompts_per_round, args.micro_steps_per_round,
                             num_processes=args.world_size, process_index=args.process_index,
                             seed=args.data_seed or args.seed)


def prompt_batch(rows: list[dict], max_response_length: int | None = None) -> dict:
    """Collate rows into {"prompt_ids": [...], "rows": rows, <column>: [...], "max_response_length": n}."""
    batch = {key: [row[key] for row in rows] for key in rows[0]}
    batch["rows"] = rows
    batch["max_response_length"] = max_response_length
    return batch
