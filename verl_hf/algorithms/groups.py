"""Per-prompt group statistics: the one place where "the samples of one prompt" is computed.

``group_ids (B,)`` marks samples of one prompt with a shared id (any integers, any order); ``valid (B,)`` bool,
when given, leaves rows out of their group's statistics (unscored rows).  Results are gathered back per row,
so ``stats.mean[i]`` is the mean of row i's group.  Vectorised with ``torch.unique(return_inverse=True)`` and
``index_add`` / ``scatter_reduce``: no Python loop over samples.

See it work: tests/test_registry.py (group_stats, group_all_equal), tests/test_algorithms.py (estimators).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch


def group_index(group_ids: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """Dense group index per sample.  group_ids (B,) any ints -> (inverse (B,) in [0, G), G)."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, uniq.numel()


def group_sum(values: torch.Tensor, inverse: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Sum of values over each sample's group, gathered back per sample.  (B,) -> (B,)."""
    return values.new_zeros(num_groups).index_add(0, inverse, values)[inverse]


class GroupStats(NamedTuple):
    """Statistics of each row's group over its valid rows, all (B,): count, sum, mean, unbiased std."""

    count: torch.Tensor
    total: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


def group_stats(scores: torch.Tensor, group_ids: torch.Tensor, valid: Optional[torch.Tensor] = None) -> GroupStats:
    """Count, sum, mean and unbiased std of each row's group.  (B,), (B,), (B,) bool | None -> GroupStats of (B,).

    Formula: n_g = #valid rows of g, mean_g = sum_g s / n_g, std_g = sqrt(sum_g (s - mean_g)^2 / (n_g - 1));
    mean 0 for a group with no valid row, std 0 for a group of fewer than two.
    """
    keep = torch.ones_like(scores, dtype=torch.bool) if valid is None else valid.bool()
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    inverse, num_groups = group_index(group_ids)
    count = group_sum(keep.to(scores.dtype), inverse, num_groups)
    total = group_sum(torch.where(keep, scores, zero), inverse, num_groups)
    mean = total / count.clamp(min=1)
    # Unbiased (n - 1), as torch.std in verl / TRL; the clamp keeps singletons finite (their std is 0).
    sq = group_sum(torch.where(keep, (scores - mean).square(), zero), inverse, num_groups)
    return GroupStats(count, total, mean, (sq / (count - 1).clamp(min=1)).sqrt())


def group_all_equal(scores: torch.Tensor, group_ids: torch.Tensor,
                    valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Whether the row's group has fewer than two distinct scores among its valid rows.  (B,) x3 -> (B,) bool.

    Formula: max_g(s) <= min_g(s) over the valid rows of g; a group with no valid row counts as all equal.
    """
    # Tested as max == min rather than (score - mean) == 0: the mean of equal floats is not always
    # bit-exact (0.1 + 0.1 + 0.1) / 3 != 0.1, which would leak tiny nonzero advantages.
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    keep = torch.ones_like(s, dtype=torch.bool) if valid is None else valid.bool().to(s.device)
    inverse, num_groups = group_index(group_ids.to(s.device))
    inf = torch.tensor(float("inf"), dtype=s.dtype, device=s.device)
    high = torch.full((num_groups,), -inf, dtype=s.dtype, device=s.device).scatter_reduce(
        0, inverse, torch.where(keep, s, -inf), "amax")
    low = torch.full((num_groups,), inf, dtype=s.dtype, device=s.device).scatter_reduce(
        0, inverse, torch.where(keep, s, inf), "amin")
    return (high <= low)[inverse]
