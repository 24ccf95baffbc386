"""Safe-RLHF (Dai et al., ICLR 2024) as one constraint component that the round builder and the update call
at fixed points: costs per response, the safety filter, the cost critic (PPO), the Lagrange multiplier, and the
evaluation figures. Without costs configured, `NoConstraint` stands in and does nothing at each point.

Costs come from cost functions (the reward-function signature; cost > 0 marks a response unsafe) and/or a cost
model (a score model loaded like a reward model). Every process keeps the same window of the latest episode
costs (all processes' costs are gathered into it), so lambda stays identical across ranks without being sent.
The math is in verl_hf.algorithms.lagrangian.

See it work: tests/test_safety.py, examples/safe_rlhf/.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass

import torch

from .algorithms import group_all_equal, lagrange_multiplier_step, lagrangian_advantages, masked_mean
from .algorithms import place_outcome_rewards, unsafe_rate
from .rewards import score_completions
from .rewards.reasoning import reasoning_columns
from .settings import Settings

SAFETY_FILE = "safety.json"
COST_CRITIC_DIR = "cost_critic"


class NoConstraint:
    """The constraint of a run without costs: every fixed point passes its value through."""

    enabled = False
    cost_critic = None
    cost_funcs: tuple = ()

    def score(self, batch, metrics):
        return batch

    def flat_groups(self, batch, flat_by_reward: torch.Tensor) -> torch.Tensor:
        return flat_by_reward

    def add_values(self, batch, micro_batch_size):
        return batch

    def observe_round(self, batch, step: int, metrics) -> None:
        return None

    def advantages(self, batch, reward_advantages, token_rewards, estimate, metrics):
        return reward_advantages, None

    def critics(self) -> list:
        return []

    def eval_costs(self, batch) -> list[float]:
        return []

    def save(self, output_dir: str, main_process: bool) -> None:
        return None

    def load(self, checkpoint: str) -> None:
        return None


@dataclass(frozen=True)
class SafetySettings(Settings):
    cost_limit: float
    lambda_init: float
    lambda_lr: float
    lambda_max: float | None
    lambda_update_delay_steps: int
    episode_cost_window_size: int
    safety_filter_threshold: float | None
    reward_timeout_s: float | None
    world_size: int
    reasoning_format: str | None


class SafetyConstraint:
    """Holds: log(lambda), the window of the latest episode costs (every process's), the cost functions and,
    under PPO, the cost critic. It answers at the same fixed points as NoConstraint."""

    enabled = True

    def __init__(self, cost_funcs: list, settings: SafetySettings, cost_critic=None):
        self.cost_funcs, self.settings, self.cost_critic = cost_funcs, settings, cost_critic
        self.log_lambda = math.log(settings.lambda_init)
        self.window: deque[float] = deque(maxlen=settings.episode_cost_window_size)

    @property
    def lagrange_lambda(self) -> float:
        return math.exp(self.log_lambda)

    def costs(self, prompts, completions, completion_ids, columns,
              completion_messages=None) -> tuple[torch.Tensor, dict[str, float], dict[str, list]]:
        """(costs (B,): the sum of the cost functions, 0 where none judged a response; metrics; the columns they
        passed to log_extra). A cost function
        that raises always stops training (reward_on_error does not apply): a failed check must not read as safe.
        Cost functions get what reward functions get (rewards/contract.py), but no `trainer_state`."""
        result = score_completions(self.cost_funcs, None, prompts=prompts, completions=completions,
                                   completion_ids=completion_ids, columns=columns, on_error="raise",
                                   require_scored=False, timeout_s=self.settings.reward_timeout_s,
                                   completion_messages=completion_messages)
        costs = torch.nan_to_num(result.rewards, nan=0.0)
        metrics = {**result.logged_metrics,  # what the cost functions logged, by their own names (ours win a clash)
                   "cost/mean": costs.mean().item(), "cost/unsafe_rate": unsafe_rate(costs)}
        metrics.update({k.replace("reward/", "cost/", 1): v for k, v in result.metrics().items()
                        if k.count("/") == 2 and k not in result.logged_metrics})  # per-function means, errors
        return costs, metrics, result.logged_columns

    # ---------------------------------------------------------------- the round builder's fixed points
    def score(self, batch, metrics):
        """Costs of a scored batch; the safety filter marks responses over its threshold as unscored (no
        gradient, no share in their group's baseline)."""
        with metrics.timer("cost"):
            costs, cost_metrics, logged = self.costs(batch.prompts, batch.completions, batch.completion_ids(),
                                                     self._columns(batch), batch.completion_messages or None)
        clash = sorted(set(logged) & set(batch.logged_columns))
        if clash:
            raise ValueError(f"log_extra column(s) {clash} were logged by a reward function and a cost function; give "
                             f"each column one name.")
        batch.logged_columns = {**batch.logged_columns, **logged}
        batch.costs = costs.to(batch.response_mask.device)
        metrics.record(cost_metrics)
        if self.settings.safety_filter_threshold is not None:
            keep = batch.costs <= self.settings.safety_filter_threshold
            batch.valid = batch.valid & keep
            metrics.record({"safety/filtered_frac": 1.0 - keep.float().mean().item()})
        return batch

    def flat_groups(self, batch, flat_by_reward: torch.Tensor) -> torch.Tensor:
        """A group also informs when only its costs differ (its cost advantages are not zero)."""
        return flat_by_reward & group_all_equal(batch.costs.to(batch.rewards.device), batch.group_ids, batch.valid)

    def add_values(self, batch, micro_batch_size):
        if self.cost_critic is not None:
            batch.cost_values = self.cost_critic.compute_values(batch, micro_batch_size)
        return batch

    def observe_round(self, batch, step: int, metrics) -> None:
        """Once per round, on the round that trains (after dynamic sampling): every process adds every process's
        costs to its window, so lambda agrees everywhere without being sent; then one multiplier step."""
        everyone = batch.costs.tolist()
        if self.settings.world_size > 1:
            from accelerate.utils import gather_object

            everyone = gather_object(everyone)
        self.observe(everyone)
        metrics.record(self.update_lambda(step))

    def advantages(self, batch, reward_advantages, token_rewards, estimate, metrics):
        """(A_r - lambda A_c) / (1 + lambda) and the cost returns. Cost advantages come from the same estimator
        (GAE with the cost critic, or group-normalised). KL in the reward enters the cost with the opposite sign,
        so its weight stays kl_coef whatever lambda (Safe-RLHF's code puts half in each; the same up to kl_coef)."""
        mask = batch.response_mask.float()
        kl_in_reward = token_rewards - place_outcome_rewards(batch.rewards, mask)  # -beta * KL, or zeros
        if batch.turn_rewards is not None:  # an environment's per-turn rewards are rewards, not KL
            kl_in_reward = kl_in_reward - batch.turn_rewards.to(kl_in_reward)
        cost_advantages, cost_returns = estimate(place_outcome_rewards(batch.costs, mask) - kl_in_reward,
                                                 batch.cost_values)
        metrics.record({"advantages/reward_mean": masked_mean(reward_advantages, mask).item(),
                        "advantages/cost_mean": masked_mean(cost_advantages, mask).item()})
        return lagrangian_advantages(reward_advantages, cost_advantages, self.lagrange_lambda), cost_returns

    # ---------------------------------------------------------------- the update and evaluation
    def critics(self) -> list:
        """(critic, old-values field, returns field, metric prefix) for each critic the update trains."""
        return [] if self.cost_critic is None else [(self.cost_critic, "cost_values", "cost_returns", "cost_critic")]

    def eval_costs(self, batch) -> list[float]:
        return self.costs(batch.prompts, batch.completions, batch.completion_ids(), self._columns(batch),
                          batch.completion_messages or None)[0].tolist()

    def _columns(self, batch) -> dict:
        """The batch's columns and, with a reasoning format, its completions' reasoning and contents apart."""
        return {**batch.columns, **reasoning_columns(batch.completions, self.settings.reasoning_format)}

    # ---------------------------------------------------------------- lambda and its state
    def observe(self, episode_costs: list[float]) -> None:
        """Costs of this round from every process, in rank order."""
        self.window.extend(episode_costs)

    def update_lambda(self, step: int) -> dict[str, float]:
        """One multiplier step on the windowed mean episode cost (after `lambda_update_delay_steps`)."""
        episode_cost = sum(self.window) / max(len(self.window), 1)
        if step >= self.settings.lambda_update_delay_steps and self.window:
            self.log_lambda = lagrange_multiplier_step(self.log_lambda, episode_cost, self.settings.cost_limit,
                                                       self.settings.lambda_lr, self.settings.lambda_max)
        return {"safety/lambda": self.lagrange_lambda, "safety/episode_cost": episode_cost}

    def state_dict(self) -> dict:
        return {"log_lambda": self.log_lambda, "window": list(self.window)}

    def load_state_dict(self, state: dict) -> None:
        self.log_lambda = state["log_lambda"]
        self.window = deque(state["window"], maxlen=self.settings.episode_cost_window_size)

    def save(self, output_dir: str, main_process: bool) -> None:
        if main_process:
            with open(os.path.join(output_dir, SAFETY_FILE), "w") as f:
                json.dump(self.state_dict(), f)
        if self.cost_critic is not None:
            self.cost_critic.save_checkpoint(os.path.join(output_dir, COST_CRITIC_DIR), main_process=main_process)

    def load(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, SAFETY_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{checkpoint} has no {SAFETY_FILE}: it was not saved by a Safe-RLHF run "
                                    f"(cost_funcs / cost_model_path).")
        with open(path) as f:
            self.load_state_dict(json.load(f))
        if self.cost_critic is not None:
            self.cost_critic.load_checkpoint(os.path.join(checkpoint, COST_CRITIC_DIR))
