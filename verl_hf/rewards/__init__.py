"""Rewards: string scorers, batch reward functions, and their combination.

scorers.py   -- pure per-string scorers (GSM8K answer extraction, exact match)
functions.py -- batch reward functions, built-ins, and config-string loading
combine.py   -- run several reward functions on a batch, weight and combine

See it work: tests/test_rewards.py
"""

from verl_hf.rewards.combine import RewardResult, score_completions
from verl_hf.rewards.functions import (
    BUILTIN_REWARDS,
    exact_match_reward,
    gsm8k_flexible_reward,
    gsm8k_format_reward,
    gsm8k_reward,
    resolve_reward_funcs,
)
from verl_hf.rewards.scorers import (
    exact_match_score,
    extract_gsm8k_answer,
    gsm8k_score,
)

__all__ = [
    "BUILTIN_REWARDS",
    "RewardResult",
    "exact_match_reward",
    "exact_match_score",
    "extract_gsm8k_answer",
    "gsm8k_flexible_reward",
    "gsm8k_format_reward",
    "gsm8k_reward",
    "gsm8k_score",
    "resolve_reward_funcs",
    "score_completions",
]
