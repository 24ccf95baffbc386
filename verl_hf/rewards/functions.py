"""Batch reward functions and how to name them in a config.

A reward function has the signature users write themselves:

    f(prompts, completions, completion_ids, **kwargs) -> list[float | None]

TRL's contract (contract.py): `completions` are decoded strings after text prompts and message lists after
chat prompts, `completion_ids` their token ids, every dataset column comes as a list aligned with
`completions`, and `trainer_state`, `log_metric`, `log_extra` come to functions that take them. Return one
float per completion, or None to say "this function does not score this sample" (see combine.py for how None
is handled). The built-ins read both forms of completions.

`resolve_reward_funcs` turns config entries -- callables, built-in names,
"pkg.module:function" or "path/to/file.py:function" -- into named callables.

See it work: tests/test_rewards.py
"""

from __future__ import annotations

import re
from typing import Callable

from verl_hf.loading import load_callable
from verl_hf.rewards.columns import ground_truths as _ground_truths
from verl_hf.rewards.columns import score_each as _score_each
from verl_hf.rewards.contract import completion_texts
from verl_hf.rewards.sandbox import report_sandbox
from verl_hf.rewards.scorers import (
    exact_match_score, extract_gsm8k_answer, gsm8k_score)
from verl_hf.rewards.verifiers import code_reward, length_reward, math_verify_reward, regex_reward

def gsm8k_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the number after the last '#### ' equals the ground truth, else
    0.0 (strict GSM8K, read as verl reads it: '#### $18' and '#### 18.' score
    0). Reads column `answer` or `ground_truth`."""
    truths = _ground_truths("gsm8k", columns)
    return _score_each(gsm8k_score, completions, truths, method="strict")


def gsm8k_lenient_reward(prompts, completions, completion_ids, **columns):
    """As `gsm8k`, but '$' and a trailing full stop after the marker are
    allowed ('#### $18.' reads 18). Reads column `answer` or `ground_truth`."""
    truths = _ground_truths("gsm8k_lenient", columns)
    return _score_each(gsm8k_score, completions, truths, method="lenient")


def gsm8k_flexible_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the last number anywhere in the completion equals the ground
    truth, else 0.0. Reads column `answer` or `ground_truth`."""
    truths = _ground_truths("gsm8k_flexible", columns)
    return _score_each(gsm8k_score, completions, truths, method="flexible")


def gsm8k_format_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the completion contains a strict '#### <number>' answer, else
    0.0, whatever the number. Needs no column."""
    return [0.0 if extract_gsm8k_answer(text, "strict") is None else 1.0
            for text in completion_texts(completions)]


def exact_match_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the completion equals the ground truth after stripping,
    lowercasing and collapsing whitespace, else 0.0. Reads column `answer`
    or `ground_truth`."""
    truths = _ground_truths("exact_match", columns)
    return _score_each(exact_match_score, completions, truths)


def no_task_reward(prompts, completions, completion_ids, **columns):
    """0.0 for every sample: the reward of a distillation run that names none (the teacher's signal is the only
    one). Its weight is 0; it is there so that every row counts as scored."""
    return [0.0] * len(completions)


BUILTIN_REWARDS: dict[str, Callable] = {
    "gsm8k": gsm8k_reward,
    "gsm8k_flexible": gsm8k_flexible_reward,
    "gsm8k_lenient": gsm8k_lenient_reward,
    "gsm8k_format": gsm8k_format_reward,
    "exact_match": exact_match_reward,
    "math_verify": math_verify_reward,
    "length": length_reward,
    "code": code_reward(),
}


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _unknown_spec_error(spec) -> ValueError:
    # TRL loads a Hub id (or a local model folder) in reward_funcs as a sequence-classification reward model
    model = isinstance(spec, str) and ":" not in spec and not spec.endswith(".py") and _HUB_ID.fullmatch(spec)
    hint = (f" {spec!r} looks like a model id: TRL's reward_funcs take reward models too, ours take them as "
            f"reward_model_path={spec!r} (VerlConfig; several: a list, weighted with reward_weights)") if model else ""
    return ValueError(
        f"unknown reward function {spec!r}; use a built-in "
        f"({', '.join(sorted(BUILTIN_REWARDS))}), 'regex:<pattern>', 'pkg.module:function', "
        f"'path/to/file.py:function', or pass the callable itself.{hint}")


def _load_string_spec(spec: str) -> tuple[str, Callable]:
    """Resolve a built-in name, 'regex:<pattern>', 'pkg.module:fn' or 'file.py:fn'."""
    if spec in BUILTIN_REWARDS:
        return spec, BUILTIN_REWARDS[spec]
    if spec.startswith("regex:"):
        try:
            return "regex", regex_reward(spec[len("regex:"):])
        except re.error as exc:
            raise ValueError(f"reward function {spec!r}: invalid regular expression ({exc})") from exc
    return load_callable(spec, "reward function", _unknown_spec_error)


def _unique(name: str, taken: set) -> str:
    """`name`, or `name_1`, `name_2`, ... if already used."""
    if name not in taken:
        return name
    i = 1
    while f"{name}_{i}" in taken:
        i += 1
    return f"{name}_{i}"


def resolve_reward_funcs(specs) -> list[tuple[str, Callable]]:
    """Turn reward specs into [(name, callable), ...].

    Each spec is a callable (named by its __name__), a key of
    BUILTIN_REWARDS, "pkg.module:function", or "path/to/file.py:function".
    A single spec may be passed without a list. Repeated names get the
    suffixes _1, _2, ... so metrics stay distinct.
    """
    if isinstance(specs, str) or callable(specs):
        specs = [specs]
    resolved, taken = [], set()
    for spec in specs:
        if isinstance(spec, str):
            name, func = _load_string_spec(spec)
        elif callable(spec):
            # functools.partial and callable objects have no __name__.
            name = getattr(spec, "__name__", type(spec).__name__)
            func = spec
        else:
            raise _unknown_spec_error(spec)
        name = _unique(name, taken)
        taken.add(name)
        resolved.append((name, func))
    if not resolved:
        raise ValueError("resolve_reward_funcs: got no reward functions; "
                         "pass at least one, e.g. ['gsm8k']")
    if any(getattr(func, "uses_sandbox", False) for _, func in resolved):
        report_sandbox()  # what this kernel enforces, said at start-up rather than discovered later
    return resolved
