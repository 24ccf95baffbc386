"""Turn-level credit for multi-turn rollouts: MT-GRPO (Zeng et al. 2025, "Reinforcing Multi-Turn Reasoning in
LLM Agents via Turn-Level Credit Assignment", arXiv:2505.11821).

An environment's per-turn rewards (`Step.reward`, on the last token of their turn: `turn_rewards`) judge a turn
itself, e.g. whether its tool call ran. GRPO adds them to the outcome and gives every token of a sample the
same advantage, so a good first turn is blamed for a wrong final answer. MT-GRPO gives each turn's tokens the
outcome's advantage plus the group-normalised rewards of that turn and of the turns after it.

Where we generalise the paper (two turns, a reward on the first: A = A^T + lambda A^O on its tokens, A^O on the
second's): with K turns a turn's tokens get the normalised rewards of every later turn too (reward-to-go, so a
turn is credited for what it leads to), and `turn_coef` weighs the turn terms where the paper's lambda weighs
the outcome. With two turns, a reward on the first only and the default turn_coef = lambda = 1, both are the
same. Early turns sum more terms, so their advantages grow with the number of rewarded turns. verl has no
turn-level estimator.

A turn the environment did not reward (a turn cut by the token budget, a step without a reward) counts as
reward 0 among the group's samples that reached that turn. With `use_kl_in_reward`, the KL penalty is part of
the outcome (as in GRPO), spread over every turn.

See it work: tests/test_turn_credit.py
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from .advantages import grpo_advantages, wide_float
from .groups import group_all_equal, group_stats
from .registry import register_advantage


def turn_index(response_mask: torch.Tensor) -> torch.Tensor:
    """The model turn each position belongs to (0, 1, ...), counting a turn's tool or environment tokens and
    the padding after it as that turn's; -1 before the first turn.  (B, T) -> (B, T) long.

    Formula: a turn is a run of response tokens; index(t) = #(run starts at or before t) - 1. (Two model turns
    are never adjacent: the template's tokens for the next turn, mask 0, always lie between them.)
    """
    mask = response_mask.bool()
    starts = mask & ~F.pad(mask[:, :-1], (1, 0), value=False)
    return starts.long().cumsum(-1) - 1


def per_turn_rewards(turn_rewards: torch.Tensor, response_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each sample's reward of each turn and whether it reached that turn.  (B, T) x2 -> ((B, K), (B, K) bool),
    K = the most turns of any sample; in fp64 (fp32 on MPS)."""
    index, mask = turn_index(response_mask), response_mask.bool()
    num_turns = int(index.max()) + 1 if mask.any() else 0
    wide, slot = wide_float(turn_rewards.device), index.clamp(min=0)
    rewards = torch.zeros(len(index), num_turns, dtype=wide, device=index.device).scatter_add(
        1, slot, torch.where(index >= 0, turn_rewards.to(wide), 0.0))
    reached = torch.zeros_like(rewards).scatter_add(1, slot, mask.to(wide)) > 0
    return rewards, reached


def _turn_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, reached: torch.Tensor, norm_by_std: bool,
                    epsilon: float) -> torch.Tensor:
    """GRPO's advantage of one turn's rewards among each group's samples that reached it; 0 for the others, and
    for a turn fewer than two of the group reached (no baseline: a lone raw reward would dwarf the rest) or
    all rewarded alike.  (B,) x3 -> (B,)."""
    stats = group_stats(rewards, group_ids, reached)
    dev = rewards - stats.mean
    if norm_by_std:
        dev = dev / (stats.std + epsilon)
    signal = reached & (stats.count >= 2) & ~group_all_equal(rewards, group_ids, reached)
    return torch.where(signal, dev, torch.zeros_like(dev))


def turn_rewards_differ(turn_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor,
                        valid: torch.Tensor | None = None) -> torch.Tensor:
    """Whether the row's group has some turn whose rewards differ among its (valid) samples that reached it:
    a group MT-GRPO learns from even when its episodes' totals are equal.  (B, T) x2, (B,) x2 -> (B,) bool."""
    rewards, reached = per_turn_rewards(turn_rewards, response_mask)
    if valid is not None:
        reached = reached & valid.to(reached.device).unsqueeze(1)
    differ = torch.zeros(len(rewards), dtype=torch.bool, device=rewards.device)
    for k in range(rewards.shape[1]):  # K is the few turns of a conversation
        differ |= ~group_all_equal(rewards[:, k], group_ids.to(rewards.device), reached[:, k])
    return differ


@register_advantage("mt_grpo", display_name="MT-GRPO", needs_groups=True, needs_turn_rewards=True)
def mt_grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    turn_rewards: torch.Tensor | None = None,
    outcome_rewards: torch.Tensor | None = None,
    *,
    turn_coef: float = 1.0,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    singleton_advantage: str = "score",
    **unused,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """MT-GRPO turn-level advantage.  (B, T), (B, T), (B,), (B, T), (B, T) -> (advantages (B, T), returns (B, T)).

    Formula: A_it = A^O_i + turn_coef * sum_{j >= k(t)} A^T_ij, k(t) the turn of token t, A^O GRPO's advantage of
    the outcome (`outcome_rewards`: the rewards without the turn rewards; default token_level_rewards -
    turn_rewards) and A^T_ij GRPO's advantage of turn j's reward among the group's samples that reached turn j.
    Without turn rewards (None or all 0) it is GRPO. `singleton_advantage` applies to the outcome term.
    """
    if turn_rewards is None:
        turn_rewards = torch.zeros_like(token_level_rewards)
    if outcome_rewards is None:  # exact when the round gives it; subtracting back may round
        outcome_rewards = token_level_rewards - turn_rewards.to(token_level_rewards)
    outcome, _ = grpo_advantages(outcome_rewards, response_mask, group_ids, norm_by_std=norm_by_std, epsilon=epsilon,
                                 singleton_advantage=singleton_advantage)
    rewards, reached = per_turn_rewards(turn_rewards, response_mask)
    if rewards.shape[1] == 0:
        return outcome, outcome.clone()
    group_ids = group_ids.to(rewards.device)
    normalised = torch.stack([_turn_advantage(rewards[:, k], group_ids, reached[:, k], norm_by_std, epsilon)
                              for k in range(rewards.shape[1])], dim=1)
    to_go = normalised.flip(-1).cumsum(-1).flip(-1)  # this turn's and the later turns'
    index = turn_index(response_mask)
    credit = torch.where(response_mask.bool(), to_go.gather(1, index.clamp(min=0)), 0.0).to(outcome.dtype)
    advantages = outcome + turn_coef * credit
    return advantages, advantages.clone()
