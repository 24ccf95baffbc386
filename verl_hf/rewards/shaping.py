"""Reward shaping that depends on the response, not on its content: DAPO's soft overlong punishment.

See it work: tests/test_rewards.py.
"""

from __future__ import annotations

import torch


def overlong_penalty(response_lengths: torch.Tensor, max_response_length: int, buffer_len: int,
                     penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13).  (B,) lengths -> (B,) penalties <= 0.

    Formula: R = factor * min(0, ((L_max - L_buf) - |y|) / L_buf): zero up to L_max - L_buf, then linear
    down to -factor at L_max.
    """
    if buffer_len <= 0:
        return torch.zeros_like(response_lengths, dtype=torch.float32)
    exceed = response_lengths.float() - (max_response_length - buffer_len)
    return (-exceed / buffer_len * penalty_factor).clamp(max=0.0)
