"""Rewards: string scorers, batch reward functions, and their combination.

scorers.py   -- pure per-string scorers (GSM8K answer extraction, exact match)
verifiers.py -- math answers (math-verify), regex format, length, code run against tests
sandbox.py   -- running generated code in a limited subprocess, never in the trainer
                (sandbox_child.py: its child side, the kernel's filters and the audit hook)
functions.py -- batch reward functions, built-ins, and config-string loading
calling.py   -- sync and async functions, and what a raised exception becomes
contract.py  -- what a function is given (TRL's contract: message lists after chat prompts, trainer_state, ...)
combine.py   -- run several reward functions on a batch, weight and combine

See it work: tests/test_rewards.py
"""

from verl_hf.rewards.combine import RewardResult, score_completions
from verl_hf.rewards.contract import completion_text, completion_texts
from verl_hf.rewards.functions import (
    BUILTIN_REWARDS,
    exact_match_reward,
    gsm8k_flexible_reward,
    gsm8k_format_reward,
    gsm8k_reward,
    resolve_reward_funcs,
)
from verl_hf.rewards.sandbox import SandboxResult, report_sandbox, run_code, sandbox_guarantees, sandbox_layers
from verl_hf.rewards.verifiers import code_reward, length_reward, math_verify_reward, regex_reward
from verl_hf.rewards.scorers import (
    exact_match_score,
    extract_gsm8k_answer,
    gsm8k_score,
)

__all__ = [
    "BUILTIN_REWARDS",
    "RewardResult",
    "SandboxResult",
    "code_reward",
    "completion_text",
    "completion_texts",
    "length_reward",
    "math_verify_reward",
    "regex_reward",
    "report_sandbox",
    "run_code",
    "sandbox_guarantees",
    "sandbox_layers",
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
