"""`CompletionSamplesCallback`: what the policy actually writes, at every logging step.

Writes prompt, completion (with `reasoning_format`: also its reasoning and content apart), reward (and each
reward function's score), advantage and cost (Safe-RLHF) of the
first `num_samples` rows of the latest rollout round (multi-turn: also the whole conversation, the tool
calls' outcomes and the environment's turn rewards, and the reward counts them; and every column the reward
functions added with `log_extra`) to `<output_dir>/completions/`: one JSONL file appended
at every log (`samples.jsonl`) and/or one parquet file per logging step. When the run reports to tensorboard,
wandb or trackio, the same rows go there as a table.

See it work: tests/test_callbacks.py.
"""

from __future__ import annotations

import json
import os

import torch
from transformers import TrainerCallback

FORMATS = ("jsonl", "parquet")


class CompletionSamplesCallback(TrainerCallback):
    def __init__(self, num_samples: int = 8, formats: tuple[str, ...] = ("jsonl",)):
        bad = sorted(set(formats) - set(FORMATS))
        if bad or not formats:
            raise ValueError(f"CompletionSamplesCallback formats {list(formats)}: choose from {FORMATS}.")
        if num_samples < 1:
            raise ValueError(f"CompletionSamplesCallback num_samples={num_samples} must be >= 1.")
        self.num_samples, self.formats, self.trainer = num_samples, tuple(formats), None

    def bind(self, trainer) -> None:
        """Called by VerlTrainer: the rows come from its latest rollout round."""
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        batch = getattr(self.trainer, "last_round", None)
        if batch is None or not logs or "reward/mean" not in logs or not state.is_world_process_zero:
            return
        rows = sample_rows(batch, [name for name, _ in self.trainer.reward_funcs], state.global_step, self.num_samples,
                           getattr(args, "reasoning_format", None))
        folder = os.path.join(args.output_dir, "completions")
        os.makedirs(folder, exist_ok=True)
        if "jsonl" in self.formats:
            with open(os.path.join(folder, "samples.jsonl"), "a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        if "parquet" in self.formats:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows, schema=parquet_schema(rows)),
                           os.path.join(folder, f"step_{state.global_step}.parquet"))
        _to_trackers(self.trainer, args, rows, state.global_step)


def sample_rows(batch, reward_names: list[str], step: int, count: int,
                reasoning_format: str | None = None) -> list[dict]:
    """The first `count` rows of a scored RolloutBatch as plain dicts (advantage: mean over the response;
    with a `reasoning_format`, each completion's `reasoning` and `content` apart too)."""
    from verl_hf.rewards.reasoning import reasoning_columns

    split = reasoning_columns(batch.completions[:count], reasoning_format)
    mask = batch.response_mask.float()
    advantage = ((batch.advantages * mask).sum(1) / mask.sum(1).clamp(min=1)).tolist() \
        if batch.advantages is not None else [None] * len(batch)
    rows = []
    for i in range(min(count, len(batch))):
        per_function = batch.reward_per_function[i].tolist() if batch.reward_per_function is not None else []
        row = {"step": step, "prompt": _text(batch.prompts[i]), "completion": batch.completions[i],
               "reward": float(batch.rewards[i]), "advantage": advantage[i],
               **{f"reward/{n}": (None if torch.isnan(torch.tensor(v)) else v) for n, v in zip(reward_names, per_function)}}
        if split:
            row.update(reasoning=split["reasoning"][i], content=split["contents"][i])
        if batch.costs is not None:
            row["cost"] = float(batch.costs[i])
        # the columns reward functions added with log_extra (TRL's contract); ours win a clash of names
        logged = {k: _cell(v[i]) for k, v in getattr(batch, "logged_columns", {}).items() if k not in row}
        rows.append({**logged, **row, **_conversation_fields(batch, i)})
    return rows


def parquet_schema(rows: list[dict]):
    """One schema for every step's file, whatever its rows hold (a step whose rows called no tool, or whose
    scores are all None, would otherwise get null columns that no reader can join with the other steps')."""
    import pyarrow as pa

    types = {"step": pa.int64(), "prompt": pa.string(), "completion": pa.string(), "conversation": pa.string(),
             "reasoning": pa.string(), "content": pa.string(),
             "tool_statuses": pa.list_(pa.string()), "turn_rewards": pa.list_(pa.float64())}
    text = {name for row in rows for name, value in row.items() if isinstance(value, str)}  # log_extra's text
    return pa.schema([(name, types.get(name, pa.string() if name in text else pa.float64())) for name in rows[0]])


def _cell(value):
    """A log_extra value as a table cell: a number as float, text as is, anything else as JSON text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return float(value)
    return _json(value)


def _conversation_fields(batch, i: int) -> dict:
    """Multi-turn rows: the whole conversation (JSON, as the prompt is), the tool calls' outcomes, the
    environment's per-turn rewards, and the episode's reward with them (what the advantages were computed on)."""
    if "messages" not in batch.columns:
        return {}
    from verl_hf.sample_and_score import with_turn_rewards

    return {"conversation": _json(batch.columns["messages"][i]),
            "tool_statuses": list(batch.columns["tool_statuses"][i]),
            "turn_rewards": list(batch.columns["turn_rewards"][i]),
            "reward": float(with_turn_rewards(batch.rewards, batch)[i])}


def _text(prompt) -> str:
    return prompt if isinstance(prompt, str) else _json(prompt)


def _json(messages) -> str:
    """Chat messages as JSON; the images in them (an environment's or a tool's) as "<image WxH>" ("<N bytes>")."""
    def name(value) -> str:
        if isinstance(value, (bytes, bytearray)):
            return f"<{len(value)} bytes>"
        return f"<image {value.width}x{value.height}>" if hasattr(value, "width") and hasattr(value, "height") \
            else str(value)

    return json.dumps(messages, default=name)


def _to_trackers(trainer, args, rows: list[dict], step: int) -> None:
    """The rows as a table in each enabled tracker: tensorboard (markdown text), wandb and trackio (tables)."""
    report_to = args.report_to or []
    if "tensorboard" in report_to:
        for callback in trainer.callback_handler.callbacks:
            writer = getattr(callback, "tb_writer", None)
            if writer is not None:
                columns = list(rows[0])
                lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                lines += ["| " + " | ".join(str(r[c]).replace("|", "\\|").replace("\n", " ") for c in columns) + " |"
                          for r in rows]
                writer.add_text("completions", "\n".join(lines), step)
    if "wandb" in report_to:
        import wandb

        if wandb.run is not None:
            # no step=: WandbCallback owns wandb's step counter; the table's rows carry the step
            wandb.log({"completions": wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])})
    if "trackio" in report_to:
        import pandas as pd
        import trackio

        trackio.log({"completions": trackio.Table(dataframe=pd.DataFrame(rows))}, step=step)
