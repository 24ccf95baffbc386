"""Batch reward functions and how to name them in a config.

A reward function has the signature users write themselves:

    f(prompts, completions, completion_ids, **columns) -> list[float | None]

`completions` are decoded strings, `completion_ids` their token ids, and
`columns` every dataset column as a list aligned with `completions`. Return
one float per completion, or None to say "this function does not score this
sample" (see combine.py for how None is handled).

`resolve_reward_funcs` turns config entries -- callables, built-in names,
"pkg.module:function" or "path/to/file.py:function" -- into named callables.

See it work: tests/test_rewards.py
"""

from __future__ import annotations

import hashlib
import re
import importlib
import importlib.util
import os
from typing import Callable

from verl_hf.rewards.columns import ground_truths as _ground_truths
from verl_hf.rewards.columns import score_each as _score_each
from verl_hf.rewards.sandbox import report_sandbox
from verl_hf.rewards.scorers import (
    exact_match_score, extract_gsm8k_answer, gsm8k_score)
from verl_hf.rewards.verifiers import code_reward, length_reward, math_verify_reward, regex_reward

def gsm8k_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the number after the last '#### ' equals the ground truth, else
    0.0 (strict GSM8K). Reads column `answer` or `ground_truth`."""
    truths = _ground_truths("gsm8k", columns)
    return _score_each(gsm8k_score, completions, truths, method="strict")


def gsm8k_flexible_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the last number anywhere in the completion equals the ground
    truth, else 0.0. Reads column `answer` or `ground_truth`."""
    truths = _ground_truths("gsm8k_flexible", columns)
    return _score_each(gsm8k_score, completions, truths, method="flexible")


def gsm8k_format_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the completion contains a strict '#### <number>' answer, else
    0.0, whatever the number. Needs no column."""
    return [0.0 if extract_gsm8k_answer(text, "strict") is None else 1.0
            for text in completions]


def exact_match_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the completion equals the ground truth after stripping,
    lowercasing and collapsing whitespace, else 0.0. Reads column `answer`
    or `ground_truth`."""
    truths = _ground_truths("exact_match", columns)
    return _score_each(exact_match_score, completions, truths)


BUILTIN_REWARDS: dict[str, Callable] = {
    "gsm8k": gsm8k_reward,
    "gsm8k_flexible": gsm8k_flexible_reward,
    "gsm8k_format": gsm8k_format_reward,
    "exact_match": exact_match_reward,
    "math_verify": math_verify_reward,
    "length": length_reward,
    "code": code_reward(),
}


def _unknown_spec_error(spec) -> ValueError:
    return ValueError(
        f"unknown reward function {spec!r}; use a built-in "
        f"({', '.join(sorted(BUILTIN_REWARDS))}), 'regex:<pattern>', 'pkg.module:function', "
        f"'path/to/file.py:function', or pass the callable itself")


def _load_file_module(path: str, spec: str):
    """Import a .py file by path under a unique, path-derived module name."""
    if not os.path.isfile(path):
        raise ValueError(
            f"reward function {spec!r}: file {path!r} does not exist "
            f"(cwd is {os.getcwd()!r}); give an absolute path or one "
            f"relative to the working directory")
    # Unique name so two files both called rewards.py do not collide.
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:10]
    name = f"_verl_hf_reward_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _load_string_spec(spec: str) -> tuple[str, Callable]:
    """Resolve a built-in name, 'pkg.module:fn' or 'file.py:fn'."""
    if spec in BUILTIN_REWARDS:
        return spec, BUILTIN_REWARDS[spec]
    if spec.startswith("regex:"):
        try:
            return "regex", regex_reward(spec[len("regex:"):])
        except re.error as exc:
            raise ValueError(f"reward function {spec!r}: invalid regular expression ({exc})") from exc
    # rpartition: a path may itself contain ':' (e.g. 'C:\\...').
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise _unknown_spec_error(spec)
    if target.endswith(".py"):
        module = _load_file_module(target, spec)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise ValueError(
                f"reward function {spec!r}: cannot import module {target!r} "
                f"({exc}); check it is installed or on PYTHONPATH, or use "
                f"'path/to/file.py:{attr}'") from exc
    func = getattr(module, attr, None)
    if func is None or not callable(func):
        raise ValueError(
            f"reward function {spec!r}: {target!r} has no callable named "
            f"{attr!r}; check the name after ':'")
    return attr, func


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
