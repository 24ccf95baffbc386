"""What a training round, evaluation and the samples callback share: sampling arguments, sampling rows
(one turn or whole conversations), the reward stage, and each row's whole reward.

See it work: tests/test_round.py, tests/test_callbacks.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import RolloutBatch
from .rewards import score_completions
from .rewards.reasoning import reasoning_columns
from .rewards.shaping import overlong_penalty
from .settings import Settings


@dataclass(frozen=True)
class SamplingSettings(Settings):
    max_response_length: int
    temperature: float
    top_p: float
    top_k: int
    num_generations: int
    eval_num_generations: int
    eval_do_sample: bool
    rollout_is: str | None
    routing_replay: bool


def sampling_kwargs(sampling: SamplingSettings, train: bool) -> dict:
    """Sampling arguments of `Actor.generate_sequences` for training rollouts or evaluation."""
    s = sampling
    return dict(max_new_tokens=s.max_response_length, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                num_return_sequences=s.num_generations if train else s.eval_num_generations,
                do_sample=True if train else s.eval_do_sample, return_logprobs=train and s.rollout_is is not None,
                return_routes=train and s.routing_replay)


def generate(actor, rows: list[dict], multi_turn=None, **sampling):
    """(RolloutBatch, rollout metrics) for these dataset rows: one response each, or with `multi_turn` (an
    agent.MultiTurnRollout) whole conversations; `sampling` as `sampling_kwargs` gives it. Training rounds,
    ReMax's greedy baselines and evaluation all sample through here."""
    if multi_turn is not None:
        return actor.generate_conversations(multi_turn, rows, **sampling)
    return actor.generate_sequences(prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, **sampling), {}


@dataclass(frozen=True)
class RewardSettings(Settings):
    reward_on_error: str
    reward_timeout_s: float | None
    max_response_length: int
    overlong_buffer_len: int
    overlong_penalty_factor: float
    reasoning_format: str | None


class RewardStage:
    """Holds: the reward functions with their weights, the settings of calling them and of shaping (the
    overlong penalty), and where the Trainer's state is read (`trainer_state`: a function returning it, or None
    outside a Trainer): each call gives the functions a copy of it (TRL's contract)."""

    def __init__(self, reward_funcs: list, reward_weights: list[float], settings: RewardSettings,
                 trainer_state=None):
        self.funcs, self.weights, self.settings = reward_funcs, reward_weights, settings
        self.trainer_state = trainer_state

    def run(self, batch: RolloutBatch):
        """The functions' `RewardResult` for a batch (its columns, and the completions' reasoning split)."""
        columns = {**batch.columns, **reasoning_columns(batch.completions, self.settings.reasoning_format)}
        return score_completions(self.funcs, self.weights, prompts=batch.prompts, completions=batch.completions,
                                 completion_ids=batch.completion_ids(), columns=columns,
                                 on_error=self.settings.reward_on_error, timeout_s=self.settings.reward_timeout_s,
                                 trainer_state=state_copy(self.trainer_state),
                                 completion_messages=batch.completion_messages or None)

    def rewards(self, batch: RolloutBatch):
        """(rewards (B,) with shaping, the functions' RewardResult, overlong penalty (B,))."""
        result = self.run(batch)
        s = self.settings
        penalty = overlong_penalty(batch.response_mask.sum(dim=1), s.max_response_length, s.overlong_buffer_len,
                                   s.overlong_penalty_factor)
        return torch.nan_to_num(result.rewards.to(penalty.device), nan=0.0) + penalty, result, penalty


def state_copy(trainer_state):
    """A copy of the Trainer's state for reward functions (None without one), to read: its fields and its lists
    (log_history, the callbacks' states) are the function's own to change, the logged dicts inside are shared
    (a deep copy of a long run's log_history at every scoring would cost more than the scoring)."""
    import copy

    if trainer_state is None:
        return None
    state = copy.copy(trainer_state())
    state.log_history = list(state.log_history)
    state.stateful_callbacks = dict(state.stateful_callbacks or {})
    return state


def with_turn_rewards(rewards: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """(B,) each row's whole reward as the estimators see it: `rewards` plus, in multi-turn rows, the sum of
    the environment's per-turn rewards."""
    return rewards if batch.turn_rewards is None else rewards + batch.turn_rewards.sum(dim=1).to(rewards)
