"""PPO-Lagrangian math against hand-computed values."""

import math

import pytest
import torch

from verl_hf.algorithms import lagrange_multiplier_step, lagrangian_advantages, unsafe_rate


def test_lambda_step_by_hand():
    # lambda = 1 (log 0), J_C = 0.5 over a limit of 0.1, lr = 0.2: log_lambda' = 0 + 0.2 * 0.4 * 1 = 0.08.
    assert lagrange_multiplier_step(0.0, 0.5, 0.1, 0.2) == pytest.approx(0.08)
    # lambda = 2, J_C = 0.0 under a limit of 0.3, lr = 0.5: log 2 + 0.5 * (-0.3) * 2 = log 2 - 0.3.
    assert lagrange_multiplier_step(math.log(2), 0.0, 0.3, 0.5) == pytest.approx(math.log(2) - 0.3)
    # The cap: lambda_max = 1.05 < exp(0.08).
    assert lagrange_multiplier_step(0.0, 0.5, 0.1, 0.2, lambda_max=1.05) == pytest.approx(math.log(1.05))
    # At the limit nothing moves.
    assert lagrange_multiplier_step(-1.0, 0.25, 0.25, 3.0) == -1.0


def test_combined_advantage_by_hand():
    a_r = torch.tensor([[1.0, 2.0], [-1.0, 0.0]])
    a_c = torch.tensor([[0.5, -1.0], [2.0, 0.0]])
    # lambda = 3: (A_r - 3 A_c) / 4 = [[(1-1.5)/4, (2+3)/4], [(-1-6)/4, 0]].
    expected = torch.tensor([[-0.125, 1.25], [-1.75, 0.0]])
    assert torch.allclose(lagrangian_advantages(a_r, a_c, 3.0), expected)
    assert torch.equal(lagrangian_advantages(a_r, a_c, 0.0), a_r)


def test_unsafe_rate():
    assert unsafe_rate(torch.tensor([0.0, 1.0, -2.0, 0.5])) == 0.5
    assert unsafe_rate(torch.tensor([])) == 0.0


def test_lambda_without_a_cap_stays_finite():
    """A limit that is never met: lambda grows each step, up to the ceiling instead of past float range."""
    from verl_hf.algorithms.lagrangian import LAMBDA_CEILING

    log_lambda = 0.0
    for _ in range(200):
        log_lambda = lagrange_multiplier_step(log_lambda, 0.3, 0.0, 0.5)
    assert log_lambda == pytest.approx(math.log(LAMBDA_CEILING))
