"""Built-in reward functions that verify rather than match: math answers (math-verify), a regex format,
response length, and code run against tests in the sandbox (sandbox.py).

All have the reward-function signature `f(prompts, completions, completion_ids, **columns)` and read
completions in both forms (text, or TRL's messages after chat prompts: rewards/contract.py).

See it work: tests/test_verifiers.py.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from verl_hf.rewards.columns import ground_truths, score_each
from verl_hf.rewards.contract import completion_texts
from verl_hf.rewards.sandbox import run_code

MATH_HINT = "math_verify needs the math-verify package: pip install 'verl-hf[math]' (or pip install math-verify)."


def _math_equal(completion: str, truth, parse, verify) -> float | None:
    gold = parse(str(truth)) or parse(f"${truth}$")  # plain answers and LaTeX both parse
    if not gold:
        return None  # an unreadable ground truth cannot judge: the sample is left out (reward/excluded_frac)
    return 1.0 if verify(gold, parse(completion)) else 0.0


def math_verify_reward(prompts, completions, completion_ids, **columns):
    """1.0 if the completion's final answer (\\boxed{}, LaTeX or a plain expression) is mathematically equal
    to the ground truth (column `answer` or `ground_truth`), by HuggingFace's math-verify; else 0.0."""
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise ImportError(MATH_HINT) from e
    if threading.current_thread() is not threading.main_thread():
        # math-verify's own time limits are signal.alarm, which works on the main thread only (elsewhere it raises
        # ValueError): off it (the asynchronous producer) reward_timeout_s bounds the call (rewards/calling.py).
        parse, verify = functools.partial(parse, parsing_timeout=None), functools.partial(verify, timeout_seconds=None)
    truths = ground_truths("math_verify", columns)
    return score_each(_math_equal, completions, truths, parse=parse, verify=verify)


def regex_reward(pattern: str, full_match: bool = False) -> Callable:
    """A format reward: 1.0 if the completion matches `pattern` (re.search, DOTALL; `full_match`: the whole
    text), else 0.0. In configs: `regex:<pattern>`, e.g. `regex:^<think>.*</think>\\s*<answer>.*</answer>$`."""
    compiled = re.compile(pattern, re.DOTALL)
    match = compiled.fullmatch if full_match else compiled.search

    def regex(prompts, completions, completion_ids, **columns):
        return [1.0 if match(text) else 0.0 for text in completion_texts(completions)]

    return regex


def length_reward(prompts, completions, completion_ids, **columns):
    """The response's length in tokens (weight it with reward_weights; for a penalty use a negative weight or
    DAPO's overlong_buffer_len)."""
    return [float(len(ids)) for ids in completion_ids]


_FENCE = re.compile(r"```(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str:
    """The last fenced code block (```python ... ```), else the whole completion."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def code_reward(timeout_s: float = 5.0, memory_mb: int = 512, workers: int | None = None) -> Callable:
    """1.0 if the completion's code, followed by the row's tests (column `tests`: test code, or a list of
    assert statements), exits cleanly in the sandbox within `timeout_s`; else 0.0. Rows without tests: None.
    In configs: `code`. Programs run in parallel subprocesses, never in the trainer's process."""
    def run_one(completion: str, tests) -> float | None:
        if tests is None:
            return None
        tests = "\n".join(tests) if isinstance(tests, (list, tuple)) else str(tests)
        return 1.0 if run_code(extract_code(completion) + "\n\n" + tests, timeout_s=timeout_s, memory_mb=memory_mb,
                               as_main=False).passed else 0.0

    def code(prompts, completions, completion_ids, **columns):
        if "tests" not in columns:
            raise ValueError(f"reward 'code' needs a column 'tests' (test code or a list of asserts); the batch has "
                             f"{sorted(columns)} (map one with data_key_map).")
        # One core per program, shared among the training processes of this machine.
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        with ThreadPoolExecutor(workers or max(1, (os.cpu_count() or 1) // local)) as pool:
            return list(pool.map(run_one, completion_texts(completions), columns["tests"]))

    code.uses_sandbox = True  # resolve_reward_funcs reports what the sandbox guarantees on this machine
    return code
