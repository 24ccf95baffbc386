"""Rewards: reward functions and models, their weights and errors, DAPO's overlong penalty and dynamic sampling."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

from ..rewards.calling import ON_ERROR
from ..rewards.reasoning import REASONING_FORMATS
from .applies import DYNAMIC_SAMPLING, OVERLONG, REWARD_MODELS, _help, one_of, raise_first_failed


@dataclass
class RewardFields:
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=_help(
            "Reward functions by name: a built-in (gsm8k, gsm8k_lenient, gsm8k_flexible, gsm8k_format, exact_match, "
            "math_verify, length, code), 'regex:<pattern>', 'pkg.module:function' or 'path/to/file.py:function' (sync "
            "or async). VerlTrainer(reward_funcs=...) also takes callables."
        ),
    )
    reward_model_path: list[str] | None = field(
        default=None,
        metadata=_help("Sequence-classification reward models (ids or paths), each scored on the decoded text with "
                       "its own tokenizer and chat template, as more reward functions named 'reward_model', "
                       "'reward_model_1', ... (after reward_funcs; their weights come last)."),
    )
    reward_model_label_index: Annotated[int | None, REWARD_MODELS] = field(
        default=None,
        metadata=_help("Which logit of a reward model with num_labels > 1 is the reward (e.g. 1 for a two-label "
                       "classifier's 'good' class); required for such models."),
    )
    reward_on_error: str = field(
        default="raise",
        metadata=_help("A reward function that raises: 'raise' = stop with the function's name and the failing "
                       "sample's index; 'zero' = score those samples 0 and count them (reward/<name>/errors)."),
    )
    reward_timeout_s: float | None = field(
        default=300.0,
        metadata=_help("Seconds one call of a reward or cost function may take (a sync one is interrupted, an async "
                       "one cancelled); past it the call fails as if it had raised, and reward_on_error applies "
                       "(costs always stop). None: no limit."),
    )
    reasoning_format: str | None = field(
        default=None,
        metadata=_help("'think': completions hold their thinking in <think>...</think> before the answer (Qwen3); "
                       "'deepseek_r1': the same, the prompt opening the block (DeepSeek-R1's and QwQ's templates), so "
                       "a completion cut off before </think> is all thinking. Reward functions then also get "
                       "`reasoning` and `contents` (the thinking and the answer after it; multi-turn: of the last "
                       "turn), and the samples callback writes them apart. `completions` stays the whole text. None: "
                       "no split."),
    )
    reward_weights: list[float] | None = field(
        default=None, metadata=_help("One weight per reward function (default 1.0 each).")
    )
    overlong_buffer_len: int = field(
        default=0,
        metadata=_help("DAPO soft overlong punishment: responses longer than max_response_length - this lose reward "
                       "linearly, down to -overlong_penalty_factor at max_response_length; 0 disables it."),
    )
    overlong_penalty_factor: Annotated[float, OVERLONG] = field(default=1.0, metadata=_help("Largest overlong penalty (DAPO)."))
    dynamic_sampling: bool = field(
        default=False,
        metadata=_help("DAPO dynamic sampling: drop prompt groups whose rewards are all equal (no signal) and "
                       "sample more prompts until the round is full."),
    )
    dynamic_sampling_max_rounds: Annotated[int, DYNAMIC_SAMPLING] = field(
        default=4, metadata=_help("Most extra sampling rounds per step for dynamic_sampling; then the round is "
                                  "filled with the dropped groups (zero advantage) and a warning is logged."),
    )


def resolve_rewards(cfg) -> None:
    """A single name given where a list is expected becomes a list of it (not of its characters)."""
    for name in ("reward_funcs", "reward_model_path"):
        if isinstance(getattr(cfg, name), str):
            setattr(cfg, name, [getattr(cfg, name)])


def check_rewards(cfg) -> None:
    one_of("reward_on_error", cfg.reward_on_error, ON_ERROR)
    if cfg.reasoning_format is not None:
        one_of("reasoning_format", cfg.reasoning_format, REASONING_FORMATS)
    raise_first_failed(cfg, [
        ("reward_weights", cfg.reward_weights is None or all(math.isfinite(w) for w in cfg.reward_weights),
         "must all be finite numbers"),
        ("reward_timeout_s", cfg.reward_timeout_s is None or cfg.reward_timeout_s > 0, "must be > 0 (None: no limit)"),
        ("overlong_buffer_len", 0 <= cfg.overlong_buffer_len < cfg.max_response_length,
         "must be in [0, max_response_length)"),
        ("dynamic_sampling_max_rounds", cfg.dynamic_sampling_max_rounds >= 0, "must be >= 0"),
    ])
    if cfg.dynamic_sampling and cfg.num_generations < 2:
        raise ValueError("dynamic_sampling drops groups whose rewards are all equal; it needs num_generations >= 2.")
