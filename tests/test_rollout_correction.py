"""Importance-sampling correction of the rollout/training mismatch, against hand-computed weights."""

import math

import pytest
import torch

from verl_hf.algorithms import LossNorm, get_policy_loss, rollout_is_weights

OLD = torch.tensor([[0.0, -1.0, -2.0], [-0.5, -0.5, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_token_truncate_caps_each_token_weight():
    w, metrics = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", mode="truncate", threshold=2.0)
    # exp(old - rollout): e^1 -> capped at 2, e^0 = 1, e^-1; row 2: 1, e^-0.5, masked.
    expected = torch.tensor([[2.0, 1.0, math.exp(-1)], [1.0, math.exp(-0.5), 0.0]])
    torch.testing.assert_close(w, expected)
    assert metrics["rollout_is/rejected_frac"] == pytest.approx(1 / 5)
    assert metrics["rollout_is/max"] == pytest.approx(math.e, rel=1e-6)
    assert metrics["rollout_is/logprob_gap_max"] == pytest.approx(1.0)  # |0 - (-1)| and |-2 - (-1)|; masked 0.0 ignored


def test_token_mask_zeroes_tokens_outside_the_band():
    w, _ = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", mode="mask", threshold=2.0)  # band [0.5, 2]
    expected = torch.tensor([[0.0, 1.0, 0.0], [1.0, math.exp(-0.5), 0.0]])
    torch.testing.assert_close(w, expected)


def test_sequence_level_uses_the_product_over_the_response():
    w, _ = rollout_is_weights(OLD, ROLLOUT, MASK, level="sequence", mode="truncate", threshold=10.0)
    # row 1: exp(1 + 0 - 1) = 1 on every token; row 2: exp(0 - 0.5) on its two tokens.
    expected = torch.tensor([[1.0, 1.0, 1.0], [math.exp(-0.5), math.exp(-0.5), 0.0]])
    torch.testing.assert_close(w, expected)
    w, _ = rollout_is_weights(OLD, ROLLOUT, MASK, level="sequence", mode="mask", threshold=1.5, threshold_low=0.9)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_weights_carry_no_gradient_and_bad_names_fail():
    old = OLD.clone().requires_grad_(True)
    w, _ = rollout_is_weights(old, ROLLOUT, MASK)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="level must be one of"):
        rollout_is_weights(OLD, ROLLOUT, MASK, level="batch")


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "gpg", "sapo", "reinforce"])
def test_weighting_the_advantages_weights_each_token_gradient(name):
    """The correction scales advantages: for losses linear in the advantage that equals weighting each token's
    gradient. Checked per token: the gradient with weighted advantages = weight x the unweighted gradient."""
    torch.manual_seed(0)
    loss_fn = get_policy_loss(name)
    old = torch.randn(1, 4) * 0.1 - 1.0
    adv = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    mask = torch.ones(1, 4)
    weights = torch.tensor([[2.0, 1.0, 0.5, 0.0]])
    grads = []
    for a in (adv, adv * weights):
        logp = old.clone().requires_grad_(True)
        loss, _ = loss_fn(old, logp, a, mask, LossNorm("seq-mean-token-sum", num_tokens=4.0, num_seqs=1.0, constant=4))
        loss.backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[1], grads[0] * weights)


def test_trainer_applies_the_correction_with_the_engines_logprobs(tmp_path, warm_start_dir, addition):
    """End to end with the HF engine in bfloat16 (an inference copy): a real rollout/training mismatch, so the
    weights differ from 1; the run trains and logs the correction's metrics."""
    from conftest import small_config
    from verl_hf import VerlTrainer

    args = small_config(tmp_path, max_steps=2, rollout_hf_weights="copy", rollout_dtype="bfloat16",
                        rollout_is="token", rollout_is_mode="mask", rollout_is_threshold=1.5)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rollout_is/mean" in h]
    assert len(logs) == 2
    assert all(h["rollout_is/mismatch_k1"] != 0 and h["rollout_is/max"] > 1.0 for h in logs), logs
    with pytest.raises(ValueError, match="rollout_is='tokens' is unknown"):
        small_config(tmp_path, rollout_is="tokens")
