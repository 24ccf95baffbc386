"""Off-policy math for asynchronous training against hand-computed examples: per-token staleness, AReaL's
log-linear proximal log-probs, and the decoupled PPO loss as rollout_is weights times the PPO loss."""

import math

import pytest
import torch

from verl_hf.algorithms import ppo_clip_loss, rollout_is_weights
from verl_hf.algorithms.off_policy import (loglinear_proximal_logprobs, partial_fraction, staleness_metrics,
                                            token_staleness)

VERSIONS = torch.tensor([[3, 2, 1], [3, 3, 9]])  # 9 sits in padding: never read
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_staleness_counts_steps_since_sampling_and_ignores_padding():
    torch.testing.assert_close(token_staleness(VERSIONS, MASK, 3), torch.tensor([[0, 1, 2], [0, 0, 0]]))
    metrics = staleness_metrics(VERSIONS, MASK, 3)
    # row 0 spans versions 3, 2, 1 (a partial rollout); row 1's 9 is padding, so it has one version
    assert metrics == {"async/staleness_mean": pytest.approx(3 / 5), "async/staleness_max": 2.0,
                       "async/partial_frac": 0.5}


def test_partial_fraction_counts_rows_with_more_than_one_version_among_rows_with_tokens():
    versions = torch.tensor([[1, 1, 2], [4, 4, 4], [7, 0, 0], [5, 6, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 0, 0]])  # row 2 has no token: not counted
    assert partial_fraction(versions, mask) == pytest.approx(1 / 3)
    assert partial_fraction(versions, torch.zeros_like(mask)) == 0.0


def test_a_token_from_a_future_policy_is_an_error():
    with pytest.raises(ValueError, match="policy version 3, newer than the trainer's version 2"):
        token_staleness(VERSIONS, MASK, 2)


def test_loglinear_proximal_moves_stale_tokens_towards_the_current_policy():
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -0.1, 0.0]])
    current = torch.tensor([[-0.5, -1.0, -0.2], [-0.3, -0.4, 5.0]], requires_grad=True)
    proximal = loglinear_proximal_logprobs(behaviour, current, VERSIONS, 3, MASK)
    # alpha = s / (s + 1) for staleness s = 0, 1, 2: 0, 1/2, 2/3; fresh tokens keep their behaviour log-prob
    expected = torch.tensor([[-1.0, -2.0 + 0.5 * 1.0, -0.5 + (2 / 3) * 0.3], [-0.7, -0.1, 0.0]])
    torch.testing.assert_close(proximal, expected)
    assert not proximal.requires_grad  # the proximal policy is a constant of the loss


def test_decoupled_loss_is_the_behaviour_weight_times_the_clipped_ratio_to_the_proximal_policy():
    """AReaL's decoupled PPO: l = min(pi_prox / pi_behave, cap) * max(-A r, -A clip(r)), r = pi_theta / pi_prox."""
    behaviour = torch.tensor([[-1.0, -1.0]])
    proximal = behaviour + torch.tensor([[math.log(1.5), math.log(3.0)]])  # weights 1.5 and 3 (capped at 2)
    theta = (proximal + torch.tensor([[math.log(1.1), math.log(1.5)]])).requires_grad_()  # r = 1.1, 1.5
    advantages, mask = torch.ones(1, 2), torch.ones(1, 2)
    weights, _ = rollout_is_weights(proximal, behaviour, mask, level="token", mode="truncate", threshold=2.0)
    loss, metrics = ppo_clip_loss(proximal, theta, advantages * weights, mask)
    # token 1: 1.5 * max(-1.1, -1.1) = -1.65; token 2: 2 * max(-1.5, -1.2) = -2.4 (clipped); token mean
    assert loss.item() == pytest.approx((-1.65 - 2.4) / 2, rel=1e-6)
    loss.backward()
    # d/dlogp of -w A r is -w A r on the unclipped token (/ 2 tokens); the clipped token has no gradient
    torch.testing.assert_close(theta.grad, torch.tensor([[-1.65 / 2, 0.0]]))
    assert metrics["clip_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize("proximal", ["recompute", "loglinear"])
def test_the_update_takes_the_proximal_policy_the_config_names(tmp_path, proximal):
    """proximal_logprobs='loglinear' gives the ratio AReaL's interpolation from each token's version (the hand
    example above); 'recompute' the live log-probs detached (one update per round: the weights at the step's start)."""
    from types import SimpleNamespace

    from conftest import small_config
    from verl_hf.update import PolicyUpdate, UpdateSettings

    config = small_config(tmp_path, rollout_engine="vllm_server", vllm_server_url="http://127.0.0.1:1", max_staleness=2,
                          rollout_is="token", proximal_logprobs=proximal)
    update = PolicyUpdate(UpdateSettings.of(config), kl_controller=None)
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -0.1, 0.0]])
    current = torch.tensor([[-0.5, -1.0, -0.2], [-0.3, -0.4, 5.0]], requires_grad=True)
    mb = SimpleNamespace(rollout_logprobs=behaviour, rollout_versions=VERSIONS, response_mask=MASK, old_logprobs=None)
    expected = torch.tensor([[-1.0, -1.5, -0.3], [-0.7, -0.1, 0.0]]) if proximal == "loglinear" else current.detach()
    torch.testing.assert_close(update.proximal_logprobs(mb, current, 3), expected)
    with pytest.raises(ValueError, match="proximal_logprobs='exact' is unknown; valid: loglinear, recompute"):
        small_config(tmp_path, rollout_engine="vllm_server", vllm_server_url="http://127.0.0.1:1", max_staleness=1,
                     rollout_is="token", proximal_logprobs="exact")
