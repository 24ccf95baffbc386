"""Hand-computed checks for the REINFORCE++, REINFORCE++-baseline, Pass@k GRPO, OPO and GPG estimators."""

import math

import pytest
import torch

import verl_hf.algorithms.advantages as adv_mod  # noqa: F401  (registers the estimators)
from verl_hf.algorithms import ADVANTAGE_ESTIMATORS, SINGLETON_ADVANTAGES, get_advantage_estimator

close = torch.testing.assert_close

NEW = ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg"]


def _rewards(scores, length=3):
    """Outcome reward on the last token: (B,) -> (B, length)."""
    r = torch.zeros(len(scores), length)
    r[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return r


def _call(name, rewards, mask, ids=None, **kw):
    """Call an estimator the way the trainer does: every common keyword, each takes what it needs."""
    b = rewards.shape[0]
    ids = torch.zeros(b, dtype=torch.long) if ids is None else ids
    common = dict(values=torch.zeros_like(rewards), reward_baselines=torch.zeros(b), gamma=1.0, lam=1.0,
                  norm_by_std=True, epsilon=1e-6)
    common.update(kw)
    return get_advantage_estimator(name)(token_level_rewards=rewards, response_mask=mask, group_ids=ids, **common)


def test_new_names_are_registered():
    for name in NEW:
        assert name in ADVANTAGE_ESTIMATORS
    assert get_advantage_estimator("gpg") is adv_mod.gpg_advantages
    assert get_advantage_estimator("opo") is adv_mod.opo_advantages
    assert get_advantage_estimator("grpo_passk") is adv_mod.grpo_passk_advantages
    assert get_advantage_estimator("reinforce_plus_plus") is adv_mod.reinforce_plus_plus_advantages
    assert get_advantage_estimator("reinforce_plus_plus_baseline") is adv_mod.reinforce_plus_plus_baseline_advantages


# ----------------------------------------------------------------------------- REINFORCE++


def test_reinforce_plus_plus_hand_discounted_and_padding():
    rewards = torch.tensor([[0.0, 0.0, 4.0], [0.0, 2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the 9 sits on padding: dropped
    adv, ret = _call("reinforce_plus_plus", rewards, mask, gamma=0.5)
    # gamma 0.5: row 0 G = (0 + .5*(0 + .5*4), 0 + .5*4, 4) = (1, 2, 4) ; row 1 G = (0 + .5*2, 2, pad 0) = (1, 2, 0)
    close(ret, torch.tensor([[1.0, 2.0, 4.0], [1.0, 2.0, 0.0]]))
    # valid G: 1, 2, 4, 1, 2 -> mean 2, deviations -1, 0, 2, -1, 0, unbiased var 6 / 4 = 1.5
    s = 1.0 / math.sqrt(1.5 + 1e-8)
    close(adv, torch.tensor([[-s, 0.0, 2 * s], [-s, 0.0, 0.0]]))


def test_reinforce_plus_plus_gamma_one_is_global_not_grouped():
    # gamma 1: G row 0 = (1, 1, 1), row 1 = (3, 3, 3); ids differ, but there is no group baseline:
    # batch mean 2, deviations -1 x3, +1 x3, unbiased var 6 / 5 = 1.2 -> A = -+1 / sqrt(1.2)
    adv, ret = _call("reinforce_plus_plus", _rewards([1.0, 3.0]), torch.ones(2, 3), torch.tensor([0, 1]))
    s = 1.0 / math.sqrt(1.2 + 1e-8)
    close(adv, torch.tensor([[-s] * 3, [s] * 3]))
    close(ret, torch.tensor([[1.0] * 3, [3.0] * 3]))


def test_reinforce_plus_plus_carries_return_through_masked_hole():
    # mask 1, 0, 1 (a tool output in the middle); reward 5 on the hole is dropped, gamma 0.5:
    # G = (.5 * .5 * 2, hole -> 0, 2) = (0.5, 0, 2) -- the first token still sees the final reward
    rewards = torch.tensor([[0.0, 5.0, 2.0]])
    _, ret = _call("reinforce_plus_plus", rewards, torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.5)
    close(ret, torch.tensor([[0.5, 0.0, 2.0]]))


# ----------------------------------------------------------------------------- REINFORCE++ with baseline


def test_reinforce_plus_plus_baseline_hand():
    # group 3 scores 1, 0 -> mean 0.5 -> 0.5, -0.5 ; group 9 scores 2, 2 (all equal) -> 0 ;
    # singleton 5 (verl): mean 0 -> 7.  tokens (T = 2, all valid): 0.5 x2, 0 x2, -0.5 x2, 0 x2, 7 x2 -> mean 1.4,
    # deviations -0.9, -1.4, -1.9, -1.4, 5.6 (x2 each), sum sq 2 (0.81 + 1.96 + 3.61 + 1.96 + 31.36) = 79.4,
    # unbiased var 79.4 / 9 -> std 2.970223 -> A = -0.303008, -0.471346, -0.639684, -0.471346, 1.885377
    ids = torch.tensor([3, 9, 3, 9, 5])
    rewards = _rewards([1.0, 2.0, 0.0, 2.0, 7.0], 2)
    adv, ret = _call("reinforce_plus_plus_baseline", rewards, torch.ones(5, 2), ids)
    std = math.sqrt(79.4 / 9 + 1e-8)
    expected = torch.tensor([-0.9, -1.4, -1.9, -1.4, 5.6]) / std
    close(adv, expected.unsqueeze(-1).expand(5, 2), atol=1e-5, rtol=1e-5)
    assert expected[0].item() == pytest.approx(-0.303008, abs=1e-6)
    assert torch.equal(ret, adv)
    # singleton_advantage="zero": singleton 5 -> 0 before whitening.
    # tokens: 0.5 x2, -0.5 x2, 0 x6 -> mean 0, sum sq 1, unbiased var 1 / 9 -> x 3
    adv, _ = _call("reinforce_plus_plus_baseline", rewards, torch.ones(5, 2), ids, singleton_advantage="zero")
    close(adv, torch.tensor([[1.5, 1.5], [0.0, 0.0], [-1.5, -1.5], [0.0, 0.0], [0.0, 0.0]]), atol=1e-5, rtol=1e-5)
    # group 0 scores 0.9 x3: in fp32 (0.9 + 0.9 + 0.9) / 3 != 0.9, so a naive mean leaks ~6e-8 ; it must be
    # exactly 0 before whitening. group 1 scores 1, 0 -> 0.5, -0.5. tokens (T = 1): 0, 0, 0, 0.5, -0.5 ->
    # mean 0, sum sq 0.5, unbiased var 0.5 / 4 = 0.125 -> rows 0-2 exactly 0, rows 3-4 -+0.5 / sqrt(0.125)
    rewards = _rewards([0.9, 0.9, 0.9, 1.0, 0.0], 1)
    adv, _ = _call("reinforce_plus_plus_baseline", rewards, torch.ones(5, 1), torch.tensor([0, 0, 0, 1, 1]))
    assert torch.equal(adv[:3], torch.zeros(3, 1))
    a = 0.5 / math.sqrt(0.125 + 1e-8)
    close(adv[3:, 0], torch.tensor([a, -a]))


def test_reinforce_plus_plus_baseline_whitening_is_token_weighted():
    # scores 1, 0 -> 0.5, -0.5 ; row 1 has one valid token: tokens 0.5, 0.5, -0.5 -> mean 1/6,
    # deviations 1/3, 1/3, -2/3, sum sq 6/9, unbiased var (6/9) / 2 = 1/3 -> A = dev * sqrt 3
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, _ = _call("reinforce_plus_plus_baseline", _rewards([1.0, 0.0], 2), mask, torch.tensor([0, 0]))
    r3 = math.sqrt(3.0)
    close(adv, torch.tensor([[r3 / 3, r3 / 3], [-2 * r3 / 3, 0.0]]), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- Pass@k GRPO


def test_grpo_passk_hand():
    # ids interleaved: group 4 = rows 0, 2, 3 ; group 9 = rows 1, 4, 5 ; group 7 = row 6 (singleton)
    rewards = _rewards([1.0, 3.0, 0.0, 2.0, 3.0, 1.0, 5.0])
    ids = torch.tensor([4, 9, 4, 4, 9, 9, 7])
    adv, ret = _call("grpo_passk", rewards, torch.ones(7, 3), ids, norm_by_std=False)
    # group 4 scores 1, 0, 2 -> best 2 (row 3), second 1 -> A = 0, 0, 1
    # group 9 scores 3, 3, 1 -> tie for best: first (row 1) is best, the tied row 4 is second -> gap 0 -> all 0
    # singleton -> 0
    close(adv[:, 0], torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
    assert torch.equal(ret, adv)
    # norm_by_std: group 4 mean 1, unbiased std sqrt((1 + 1 + 0) / 2) = 1 -> 1 / (1 + 1e-6)
    adv, _ = _call("grpo_passk", rewards, torch.ones(7, 3), ids)
    close(adv[:, 0], torch.tensor([0.0, 0.0, 0.0, 1.0 / (1.0 + 1e-6), 0.0, 0.0, 0.0]))
    # epsilon 0: an all-equal group (2, 2) and a singleton have gap 0 and std 0 -> 0, not 0 / 0 = nan
    adv, _ = _call("grpo_passk", _rewards([2.0, 2.0, 5.0]), torch.ones(3, 3), torch.tensor([0, 0, 1]), epsilon=0.0)
    assert torch.equal(adv, torch.zeros(3, 3))


def test_grpo_passk_std_and_padding():
    # scores 0, 0, 4, 1 -> best 4 (row 2), second 1 -> gap 3 ; mean 5/4, deviations -1.25, -1.25, 2.75, -0.25,
    # sum sq 1.5625 * 2 + 7.5625 + 0.0625 = 10.75, unbiased std sqrt(10.75 / 3) -> A = 3 / sqrt(10.75 / 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    adv, _ = _call("grpo_passk", _rewards([0.0, 0.0, 4.0, 1.0]), mask, epsilon=0.0)
    a = 3.0 / math.sqrt(10.75 / 3.0)
    close(adv, torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [a, a, 0.0], [0.0, 0.0, 0.0]]))


# ----------------------------------------------------------------------------- OPO


def test_opo_hand_length_weighted_baseline():
    # group 1: lengths 3, 1 ; scores 1, 5 -> b = (3*1 + 1*5) / (3 + 1) = 2 -> A = -1, 3
    #   (an unweighted mean 3 would give -2, 2)
    # group 2: lengths 0 (empty, reward on padding), 2, 2 ; scores 9, 1, 3 -> b = (0*9 + 2*1 + 2*3) / 4 = 2
    #   -> A = (masked), -1, 1
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0], [1, 1, 0]])
    ids = torch.tensor([1, 1, 2, 2, 2])
    adv, ret = _call("opo", _rewards([1.0, 5.0, 9.0, 1.0, 3.0]), mask, ids)
    expected = torch.tensor([[-1.0, -1.0, -1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-1.0, -1.0, 0.0], [1.0, 1.0, 0.0]])
    close(adv, expected)
    assert torch.equal(ret, adv)


def test_opo_singleton_all_equal_and_all_empty_group():
    # singleton (verl): baseline 0 -> its score 4 ; scores 0.3 x3, lengths 3, 2, 2: fp32 (3*.3 + 2*.3 + 2*.3) / 7
    # != 0.3 (not bit-exact) -> must be exactly 0 ; group of only empty responses (total length 0) -> finite, 0
    rewards = _rewards([4.0, 0.3, 0.3, 0.3, 1.0, 2.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]])
    ids = torch.tensor([0, 1, 1, 1, 2, 2])
    adv, _ = _call("opo", rewards, mask, ids)
    assert torch.equal(adv[0], torch.full((3,), 4.0)) and torch.equal(adv[1:], torch.zeros(5, 3))
    # singleton_advantage="zero": the singleton -> 0 too
    adv, _ = _call("opo", rewards, mask, ids, singleton_advantage="zero")
    assert torch.equal(adv, torch.zeros(6, 3))


# ----------------------------------------------------------------------------- GPG


def test_gpg_hand_alpha():
    # B = 6. group 0 scores 1, 0, 0 -> mean 1/3 -> 2/3, -1/3, -1/3 ; group 1 scores 1, 1 (all equal: invalid) ;
    # singleton group 2 (verl: mean 0 -> score 1, a valid sample).  M = 2 invalid -> alpha = 6 / 4 = 1.5
    # -> 1, -0.5, -0.5, 0, 0, 1.5
    rewards = _rewards([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    ids = torch.tensor([0, 0, 0, 1, 1, 2])
    adv, ret = _call("gpg", rewards, torch.ones(6, 3), ids)
    close(adv[:, 0], torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, 1.5]))
    assert torch.equal(ret, adv)
    # singleton_advantage="zero": the singleton is invalid too.  M = 3 -> alpha = B / (B - M) = 6 / 3 = 2
    # -> 4/3, -2/3, -2/3, 0, 0, 0   (verl's B / count_nonzero(scores) = 6 / 4 would give 1, -0.5, -0.5)
    adv, _ = _call("gpg", rewards, torch.ones(6, 3), ids, singleton_advantage="zero")
    close(adv[:, 0], torch.tensor([4 / 3, -2 / 3, -2 / 3, 0.0, 0.0, 0.0]))
    # F_norm = 1: the trainer's GRPO std flag does not change GPG
    adv_nostd, _ = _call("gpg", rewards, torch.ones(6, 3), ids, norm_by_std=False, singleton_advantage="zero")
    assert torch.equal(adv_nostd, adv)
    # a masked-out singleton (an unscored row) carries no gradient: invalid as under "zero", M = 3, alpha = 2
    mask = torch.ones(6, 3)
    mask[5] = 0
    adv, _ = _call("gpg", rewards, mask, ids)
    close(adv[:, 0], torch.tensor([4 / 3, -2 / 3, -2 / 3, 0.0, 0.0, 0.0]))


def test_gpg_no_valid_group_is_zero():
    # every group all-equal, or a singleton scoring 0 (advantage 0 either way): B - M = 0 -> guarded, all 0
    ids = torch.tensor([0, 0, 1, 1, 2])
    adv, _ = _call("gpg", _rewards([1.0, 1.0, 0.0, 0.0, 0.0]), torch.ones(5, 3), ids)
    assert torch.equal(adv, torch.zeros(5, 3))
    # a singleton scoring 3 is the one valid sample (verl's mean 0): alpha = 5 / 1 -> 5 * 3 = 15
    adv, _ = _call("gpg", _rewards([1.0, 1.0, 0.0, 0.0, 3.0]), torch.ones(5, 3), ids)
    close(adv[:, 0], torch.tensor([0.0, 0.0, 0.0, 0.0, 15.0]))
    # singleton_advantage="zero": every group all-equal or singleton -> all 0
    adv, _ = _call("gpg", _rewards([1.0, 1.0, 0.0, 0.0, 3.0]), torch.ones(5, 3), ids, singleton_advantage="zero")
    assert torch.equal(adv, torch.zeros(5, 3))


# ----------------------------------------------------------------------------- shared edge cases


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("singleton", SINGLETON_ADVANTAGES)
def test_edge_cases_finite_and_masked(name, singleton):
    # singleton (row 0), all-equal group (rows 1-3; fp32 mean of 0.9 x3 != 0.9), zero-length response (row 4),
    # padded rows
    rewards = _rewards([2.0, 0.9, 0.9, 0.9, 1.0, 0.0, 3.0])
    ids = torch.tensor([5, 6, 6, 6, 7, 7, 7])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 1], [1, 0, 0]]).float()
    adv, ret = _call(name, rewards, mask, ids, singleton_advantage=singleton)
    assert adv.shape == ret.shape == (7, 3)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.equal(adv * (1 - mask), torch.zeros(7, 3)) and torch.equal(adv[4], torch.zeros(3))
    if name not in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):  # whitened ones shift zeros
        assert torch.equal(adv[1:4], torch.zeros(3, 3))  # all-equal group: exactly 0
        if singleton == "zero" or name == "grpo_passk":  # pass@k: no best of one, always 0
            assert torch.equal(adv[0], torch.zeros(3))
        else:  # verl: baseline 0, so the singleton's advantage has its score's sign (score 2)
            assert (adv[0] > 0).all()
        assert adv[6, 0] > 0  # group 7: best score 3 gets a positive advantage


@pytest.mark.parametrize("name", NEW)
def test_all_empty_batch_and_single_sample(name):
    adv, ret = _call(name, _rewards([1.0, 2.0]), torch.zeros(2, 3), torch.tensor([0, 0]))
    assert torch.isfinite(ret).all() and torch.equal(adv, torch.zeros(2, 3))
    adv, ret = _call(name, _rewards([1.0]), torch.ones(1, 3), torch.tensor([0]), singleton_advantage="zero")
    assert torch.isfinite(ret).all() and torch.equal(adv, torch.zeros(1, 3))
    # verl's singleton rule: opo's baseline 0 -> 1 ; gpg alpha 1 / 1 -> 1 ; whitening one value and pass@k -> 0
    adv, ret = _call(name, _rewards([1.0]), torch.ones(1, 3), torch.tensor([0]))
    expected = 1.0 if name in ("opo", "gpg") else 0.0
    assert torch.isfinite(ret).all() and torch.equal(adv, torch.full((1, 3), expected))


@pytest.mark.parametrize("name", ["reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg"])
def test_permutation_invariance(name):
    rewards = _rewards([1.0, 0.0, 3.0, -1.0, 2.0, 5.0])
    ids = torch.tensor([10, 10, 20, 10, 20, 30])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 1]]).float()
    adv, _ = _call(name, rewards, mask, ids)
    assert adv.abs().sum() > 0
    perm = torch.tensor([5, 3, 0, 4, 1, 2])
    adv_p, _ = _call(name, rewards[perm], mask[perm], ids[perm])
    close(adv_p, adv[perm])


@pytest.mark.parametrize("name", NEW)
def test_bf16_output_dtype(name):
    adv, ret = _call(name, _rewards([1.0, 0.0, 2.0]).bfloat16(), torch.ones(3, 3), torch.tensor([0, 0, 0]))
    assert adv.dtype == ret.dtype == torch.bfloat16 and torch.isfinite(adv.float()).all()
