"""Run several reward functions on one batch and combine their scores.

Each function is called once per batch. A None score means "this function
does not judge this sample": the sample's reward is the weighted sum over
only the functions that did score it (so None is *not* 0). A sample that no
function scored gets reward NaN and valid=False, for the trainer to drop.

See it work: tests/test_rewards.py
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from .calling import ON_ERROR, call_all, recover
from .contract import EXTRAS, RewardLog, accepted_extras, reward_completions

_RESERVED = ("prompts", "completions", "completion_ids", *EXTRAS)


@dataclass
class RewardResult:
    """Scores for one batch of B completions from F reward functions.

    rewards:      (B,) float32, weighted sum over the functions that scored
                  each sample; NaN where none did.
    valid:        (B,) bool, False where no function scored the sample.
    per_function: (B, F) float32 raw scores, NaN where a function gave None.
    names:        the F function names, in column order.
    errors:       {name: samples whose call raised and were scored 0} (reward_on_error='zero' only).
    logged_metrics: {name: mean} of what the functions passed to `log_metric` (TRL's contract, contract.py).
    logged_columns: {column: B values} the functions passed to `log_extra`.
    """
    rewards: torch.Tensor
    valid: torch.Tensor
    per_function: torch.Tensor
    names: list[str]
    errors: dict[str, int] = field(default_factory=dict)
    logged_metrics: dict[str, float] = field(default_factory=dict)
    logged_columns: dict[str, list] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """reward/mean and reward/std (population) over valid samples, and
        reward/<name>/mean and /std over each function's non-None scores. Functions
        with no scores this batch are left out so every value is finite."""
        out = {}
        valid_rewards = self.rewards[self.valid]
        if valid_rewards.numel():
            out["reward/mean"] = valid_rewards.mean().item()
            # Population std: one valid sample gives 0, not NaN.
            out["reward/std"] = valid_rewards.std(unbiased=False).item()
        for j, name in enumerate(self.names):
            column = self.per_function[:, j]
            scored = column[~torch.isnan(column)]
            if scored.numel():
                out[f"reward/{name}/mean"] = scored.mean().item()
                out[f"reward/{name}/std"] = scored.std(unbiased=False).item()
        for name, count in self.errors.items():
            out[f"reward/{name}/errors"] = float(count)
        return {**self.logged_metrics, **out}


def _as_list(name: str, output, n: int) -> list:
    """Accept list/tuple/1-D tensor/1-D ndarray of length n; return a list."""
    if isinstance(output, torch.Tensor) or type(output).__name__ == "ndarray":
        # ndarray checked by name: numpy is optional for this package.
        if output.ndim != 1:
            raise ValueError(
                f"reward function {name!r} returned a {output.ndim}-D "
                f"{type(output).__name__} of shape {tuple(output.shape)}; "
                f"return one score per completion (a list or 1-D array)")
        output = output.tolist()
    if not isinstance(output, (list, tuple)):
        raise TypeError(
            f"reward function {name!r} returned {type(output).__name__} "
            f"{output!r:.80}; return a list with one float (or None) per "
            f"completion")
    if len(output) != n:
        raise ValueError(
            f"reward function {name!r} returned {len(output)} scores for {n} "
            f"completions; return exactly one score (or None) per completion")
    return list(output)


def _check_score(name: str, index: int, value) -> float:
    """A finite number (bool counts as 0/1) as float, or NaN for None."""
    if value is None:
        return math.nan
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise TypeError(
            f"reward function {name!r} returned {value!r} "
            f"({type(value).__name__}) for sample {index}; return a float, "
            f"or None to leave the sample unscored")
    if not math.isfinite(float(value)):
        raise ValueError(
            f"reward function {name!r} returned {value!r} for sample {index}; "
            f"scores must be finite -- return None (not NaN) to leave a "
            f"sample unscored")
    if abs(float(value)) > torch.finfo(torch.float32).max:  # scores are held in float32: it would become inf
        raise ValueError(
            f"reward function {name!r} returned {value!r} for sample {index}, "
            f"beyond float32's range (|x| <= 3.4e38); scale the score down")
    return float(value)


def _check_inputs(reward_funcs, weights, completions, prompts,
                  completion_ids, columns) -> list[float]:
    """Validate batch alignment and weights; return the weights as floats."""
    if not reward_funcs:
        raise ValueError("score_completions: reward_funcs is empty; pass at "
                         "least one (name, function) pair")
    n = len(completions)
    if n == 0:
        raise ValueError("score_completions: got 0 completions; pass a "
                         "non-empty batch")
    aligned = {"prompts": prompts, "completion_ids": completion_ids, **columns}
    for key, values in aligned.items():
        if key in _RESERVED and key in columns:
            raise ValueError(
                f"dataset column {key!r} clashes with a reward-function "
                f"argument of the same name; rename the column")
        if not hasattr(values, "__len__"):
            raise TypeError(
                f"{key!r} is a {type(values).__name__}, not a list; pass "
                f"each column as a list aligned with completions")
        if len(values) != n:
            raise ValueError(
                f"{key!r} has {len(values)} entries for {n} completions; "
                f"every column must be aligned with completions")
    check_reward_weights(weights, [name for name, _ in reward_funcs])
    return [1.0] * len(reward_funcs) if weights is None else [float(w) for w in weights]


def check_reward_weights(weights, names: list[str]) -> None:
    """One weight per reward function, or none (each weighs 1.0). The one check of that count: VerlTrainer
    calls it before any reward model loads, score_completions for direct callers."""
    if weights is not None and len(weights) != len(names):
        raise ValueError(f"reward_weights has {len(weights)} entries {list(weights)} for {len(names)} reward "
                         f"functions {names}; give one weight per function (or none: 1.0 each).")


def score_completions(reward_funcs: list[tuple[str, Callable]],
                      weights: list[float] | None, *, prompts, completions,
                      completion_ids, columns: dict[str, list],
                      on_error: str = "raise", require_scored: bool = True,
                      timeout_s: float | None = None, trainer_state=None,
                      completion_messages: list | None = None) -> RewardResult:
    """Call every reward function once on the batch and combine the scores.

    Each function gets what contract.py lists (TRL's contract): prompts=, completions= (text, or for chat
    prompts messages: `completion_messages[i]` where given, else one assistant message of `completions[i]`),
    completion_ids=, the dataset columns, and where it takes them `trainer_state`, `log_metric`, `log_extra`;
    async functions run concurrently (calling.py).
    reward[i] = sum over functions j that scored sample i of weights[j] *
    score[i, j] (weights default to 1.0). A function that raises: see
    calling.recover (on_error 'raise' or 'zero'); one that runs past `timeout_s`
    seconds fails the same way. `require_scored=False` accepts a
    batch that no function scored (costs: a cost that judges only some prompts).
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"reward_on_error={on_error!r} must be one of {ON_ERROR}")
    w = _check_inputs(reward_funcs, weights, completions, prompts,
                      completion_ids, columns)
    n = len(completions)
    batch = dict(prompts=list(prompts), completions=reward_completions(list(prompts), list(completions),
                                                                       completion_messages),
                 completion_ids=list(completion_ids), **{k: list(v) for k, v in columns.items()})
    log = RewardLog(n)
    state = {} if trainer_state is None else {"trainer_state": trainer_state}  # a Trainer's run only
    bound = [(name, _with_extras(func, {**state, **log.for_function(name)})) for name, func in reward_funcs]
    per_function = torch.empty(n, len(reward_funcs), dtype=torch.float32)
    errors = {}
    for j, ((name, func), output) in enumerate(zip(bound, call_all(bound, batch, timeout_s))):
        if isinstance(output, Exception):
            log.ignore(name)  # what it logged before raising, and in its per-sample re-runs, is dropped
            singles = recover(name, func, batch, n, output, on_error, timeout_s)
            scores = [0.0 if one is None else _as_list(name, one, 1)[0] for one in singles]
            errors[name] = sum(one is None for one in singles)
        else:
            scores = _as_list(name, output, n)
            if on_error == "zero":
                errors[name] = 0
        per_function[:, j] = torch.tensor(
            [_check_score(name, i, v) for i, v in enumerate(scores)],
            dtype=torch.float32)
    log.check()
    scored = ~torch.isnan(per_function)
    valid = scored.any(dim=1)
    if require_scored and not valid.any():
        raise ValueError(
            f"every reward function returned None for all {n} samples of this "
            f"batch ({[name for name, _ in reward_funcs]}); make at least one "
            f"function score each batch, e.g. add a fallback reward that "
            f"never returns None")
    result = RewardResult(rewards=_weighted_sum(per_function, scored, valid, w, reward_funcs), valid=valid,
                          per_function=per_function, names=[name for name, _ in reward_funcs], errors=errors,
                          logged_metrics=log.metric_means(), logged_columns=log.columns())
    _warn_if_statistics_overflow(result)
    return result


def _warn_if_statistics_overflow(result: RewardResult) -> None:
    """Finite scores whose mean or spread overflows float32 (3.4e38 each, say): the logged statistics and the
    advantages (normalised by the group's std) would be inf or NaN. Named here, with the function that gave the
    largest score; the update's own non-finite guard (on_nonfinite) keeps the weights finite."""
    stats = result.metrics()
    bad = sorted(k for k, v in stats.items() if k.startswith("reward/") and not math.isfinite(v))
    rewards = result.rewards[result.valid]
    if not bad and (not rewards.numel() or torch.isfinite(torch.stack([rewards.mean(),
                                                                        rewards.std(unbiased=False)])).all()):
        return
    largest = torch.nan_to_num(result.per_function.abs(), nan=0.0).max(dim=0).values
    name = result.names[int(largest.argmax())]
    warnings.warn(f"reward function {name!r} returned scores up to {largest.max().item():.3g}: the batch's reward "
                  f"statistics overflow float32 ({', '.join(bad) or 'reward mean/std'} not finite), so advantages "
                  f"would be NaN; scale the scores down (rewards of order 1 train best).", stacklevel=3)


def _with_extras(func: Callable, extras: dict) -> Callable:
    """`func` with the extras it takes bound (the batch's aligned lists come at call time); what the callers
    read off a reward function (`runs_collectives`) stays readable."""
    accepted = accepted_extras(func, extras)
    if not accepted:
        return func
    bound = functools.partial(func, **accepted)
    bound.runs_collectives = getattr(func, "runs_collectives", False)
    return bound


def _weighted_sum(per_function, scored, valid, w: list[float], reward_funcs) -> torch.Tensor:
    """(B,) float32: each sample's weighted sum over the functions that scored it, NaN where none did."""
    # Summed in fp64: a weighted sum of large finite scores must not turn into inf on the way.
    weighted = torch.where(scored, per_function.double() * torch.tensor(w, dtype=torch.float64), 0.0)
    rewards = weighted.sum(dim=1)
    if (rewards.abs() > torch.finfo(torch.float32).max).any():
        row = int((rewards.abs() > torch.finfo(torch.float32).max).nonzero()[0])
        raise ValueError(f"sample {row}'s weighted reward {rewards[row].item():.3g} (weights {w} over "
                         f"{[name for name, _ in reward_funcs]}) is beyond float32's range; scale the rewards or "
                         f"the weights down.")
    rewards = rewards.float()
    rewards[~valid] = math.nan
    return rewards
