"""TRL's names (GRPOTrainer, TRL 1.16) for the metrics both report, logged beside ours when
`VerlConfig.trl_metric_names` is on (the default), so that dashboards made for TRL runs read ours.

Ours stay under their own names too: our callbacks, the run summary and the README use them. Where TRL and we
compute a metric differently it is not mapped (TRL's `sampling/*` importance ratios against our `rollout_is/*`,
its `tools/*` frequencies against our `tool_calls/*`).

See it work: tests/test_metric_names.py.
"""

from __future__ import annotations

import re

# ours -> TRL's
TRL_NAMES = {
    "reward/mean": "reward",
    "reward/std": "reward_std",
    "reward/frac_zero_std": "frac_reward_zero_std",
    "response_length/mean": "completions/mean_length",
    "response_length/max": "completions/max_length",
    "response_length/min": "completions/min_length",
    "response_length/truncated_frac": "completions/clipped_ratio",
    "actor/entropy": "entropy",
    "actor/clip_frac": "clip_ratio/region_mean",
    "actor/clip_frac_below": "clip_ratio/low_mean",
    "actor/clip_frac_above": "clip_ratio/high_mean",
    "eval_response_length": "eval_completions/mean_length",
}
# Per reward function: ours reward/<name>/mean and /std, eval_reward/<name>; TRL's rewards/<name>/mean and /std.
_PATTERNS = ((re.compile(r"reward/(?!turns/)(.+)/(mean|std)"), r"rewards/\1/\2"),
             (re.compile(r"eval_reward/(.+)"), r"eval_rewards/\1/mean"))


def trl_name(ours: str) -> str | None:
    """TRL's name for one of our metrics, None where TRL has none (or the same name already: `kl`, `loss`)."""
    if ours in TRL_NAMES:
        return TRL_NAMES[ours]
    for pattern, replacement in _PATTERNS:
        if pattern.fullmatch(ours):
            return pattern.sub(replacement, ours)
    return None


def with_trl_names(logs: dict) -> dict:
    """`logs` with TRL's name beside each of ours that has one (ours kept; a key TRL's name already holds wins)."""
    extra = {name: value for key, value in logs.items() if (name := trl_name(key)) is not None}
    return {**logs, **{k: v for k, v in extra.items() if k not in logs}}
