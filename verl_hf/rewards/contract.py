"""What a reward or cost function is given: TRL's contract (`GRPOTrainer._calculate_rewards`, TRL 1.16), plus ours.

    f(prompts, completions, completion_ids, **kwargs) -> list[float | None]

- `prompts`: each row's prompt as the dataset gave it (text, or chat messages).
- `completions`: for a text prompt, the decoded text; for a chat prompt, the messages after it, as TRL gives
  them: `[{"role": "assistant", "content": text}]` for one turn; in a multi-turn row every message after the
  prompt up to its last assistant turn (assistant turns with their `tool_calls`, the tools' and the environment's
  replies between them; a reply after the last turn is in the `messages` column). `completion_text(c)` reads the answer's text from either form.
- `completion_ids`, and every dataset column by name.
- TRL's extras: `trainer_state` (a copy of the Trainer's `TrainerState`, to read: `global_step`, `max_steps`, ...;
  inside a Trainer only),
  `log_metric(name, value)` (a scalar, averaged over the logging step like every metric) and
  `log_extra(column, values)` (one value per sample, a column of CompletionSamplesCallback's rows). They reach a
  function that takes `**kwargs` or names them, so a function written before them keeps working.

Ours beside TRL's: `None` leaves a sample unscored (TRL turns it into NaN: the same), the reasoning split
(`reasoning`, `contents` with `reasoning_format`), and in multi-turn rows `messages` (the whole conversation),
`tool_statuses` and `turn_rewards`. Not yet: TRL's `environments`.

See it work: tests/test_reward_contract.py.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Callable

EXTRAS = ("trainer_state", "log_metric", "log_extra")


def is_conversational(prompt) -> bool:
    """A prompt given as chat messages (a list of {"role": ..., "content": ...} dicts), as TRL tells them apart."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def reward_completions(prompts: list, texts: list[str], messages: list | None = None) -> list:
    """Each sample's `completions` entry: its text after a text prompt; after a chat prompt its messages
    (`messages[i]`, a multi-turn row's messages after its prompt, where given) or one assistant message."""
    out = []
    for i, (prompt, text) in enumerate(zip(prompts, texts)):
        if not isinstance(text, str):  # given as messages already (a custom loop's own)
            out.append(text)
        elif not is_conversational(prompt):
            out.append(text)
        elif messages and messages[i] is not None:
            out.append(list(messages[i]))
        else:
            out.append([{"role": "assistant", "content": text}])
    return out


def completion_text(completion) -> str:
    """The answer's text from either form: a string as is; of messages, the last assistant message's content
    (text parts joined, for content given as parts)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion or []):
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):
                return "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return str(content)
    return ""


def completion_texts(completions: list) -> list[str]:
    return [completion_text(c) for c in completions]


def accepted_extras(func: Callable, extras: dict) -> dict:
    """The extras `func` can take: all of them with `**kwargs`, else those it names."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: give it only the batch
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(extras)
    named = {p.name for p in parameters}
    return {k: v for k, v in extras.items() if k in named}


def form_hint(completions: list, error: Exception) -> str:
    """Why a function that raised may have expected the other form of `completions` ("" unless the error is one
    that form gives: indexing a string as messages, or string methods on a message list)."""
    if not completions or not isinstance(error, (IndexError, TypeError, KeyError, AttributeError)):
        return ""
    text = str(error)
    if isinstance(completions[0], str) and "string ind" in text:  # "string index out of range", "... must be ..."
        return (" Its completions are strings because the prompts are text; TRL gives message lists "
                "([{'role': 'assistant', 'content': ...}]) only for chat-message prompts. Read the text directly, or "
                "use verl_hf.rewards.completion_text(c), which takes both forms.")
    if isinstance(completions[0], list) and ("'list'" in text or '"list"' in text or "list ind" in text):
        return (" Its completions are message lists ([{'role': 'assistant', 'content': ...}]) because the prompts are "
                "chat messages, as in TRL; read completion[-1]['content'] or verl_hf.rewards.completion_text(c).")
    return ""


class RewardLog:
    """Holds what each reward function logged during one scoring of `size` samples: scalars by name
    (`log_metric`, averaged over the values that are not NaN, as TRL logs them) and per-sample columns
    (`log_extra`), and any misuse of the two, raised by `check` after the calls (raised inside a function, it
    would read as the function's own failure, which reward_on_error='zero' scores 0). A function that raised is
    `ignore`d: what it logged is dropped, and so is what its per-sample re-runs log."""

    def __init__(self, size: int):
        self.size, self._logged, self._ignored, self._problems = size, {}, set(), []

    def for_function(self, name: str) -> dict:
        def log_metric(metric: str, value) -> None:
            if name in self._ignored:
                return
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                self._problems.append(f"reward function {name!r}: log_metric({metric!r}, {value!r}): log a number.")
                return
            self._logged.setdefault(name, ({}, {}))[0].setdefault(str(metric), []).append(float(value))

        def log_extra(column: str, values) -> None:
            if name in self._ignored:
                return
            values = list(values)
            if len(values) != self.size:
                self._problems.append(f"reward function {name!r}: log_extra({column!r}, ...) got {len(values)} "
                                      f"values for {self.size} samples; give one per sample.")
                return
            owners = [other for other, (_, columns) in self._logged.items() if column in columns]
            if owners:
                self._problems.append(f"reward function {name!r}: log_extra({column!r}, ...): that column was logged "
                                      f"already (by {owners[0]!r}) in this batch; give each column one name.")
                return
            self._logged.setdefault(name, ({}, {}))[1][str(column)] = values

        return {"log_metric": log_metric, "log_extra": log_extra}

    def ignore(self, name: str) -> None:
        self._ignored.add(name)
        self._logged.pop(name, None)

    def check(self) -> None:
        if self._problems:
            raise ValueError(self._problems[0])

    def metric_means(self) -> dict[str, float]:
        pooled: dict[str, list[float]] = {}
        for metrics, _ in self._logged.values():
            for key, values in metrics.items():
                pooled.setdefault(key, []).extend(values)
        means = {}
        for key, values in pooled.items():
            kept = [v for v in values if not math.isnan(v)]
            means[key] = sum(kept) / len(kept) if kept else math.nan
        return means

    def columns(self) -> dict[str, list]:
        return {k: v for _, columns in self._logged.values() for k, v in columns.items()}
