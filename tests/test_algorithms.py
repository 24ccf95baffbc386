"""Hand-computed checks for verl_hf.algorithms (registries, masked utils, KL, losses, advantages)."""

import math

import pytest
import torch

from verl_hf.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_KINDS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    LossNorm,
    agg_loss,
    entropy_from_logits,
    get_advantage_estimator,
    get_policy_loss,
    grpo_advantages,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    policy_loss_spec,
    ppo_clip_loss,
    register_advantage,
    register_policy_loss,
    reinforce_loss,
    rloo_advantages,
)

close = torch.testing.assert_close


# ----------------------------------------------------------------------------- registry


def test_builtins_are_registered():
    assert get_advantage_estimator("grpo") is grpo_advantages
    assert get_advantage_estimator("rloo") is rloo_advantages
    assert get_policy_loss("vanilla") is ppo_clip_loss
    assert get_policy_loss("reinforce") is reinforce_loss


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError) as e:
        get_advantage_estimator("x")
    valid = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
    assert str(e.value) == (
        f"unknown advantage estimator 'x'; valid: {valid}. Register your own with @register_advantage('x')."
    )
    assert all(name in valid for name in ("gae", "grpo", "remax", "rloo"))
    pattern = r"unknown policy loss 'y'; valid: .*reinforce.*vanilla.*@register_policy_loss\('y'\)"
    with pytest.raises(ValueError, match=pattern):
        get_policy_loss("y")


def test_user_registration_duplicate_and_override():
    try:
        @register_advantage("my_adv")
        def my_adv(token_level_rewards, response_mask, group_ids, **kw):
            return token_level_rewards, token_level_rewards

        assert get_advantage_estimator("my_adv") is my_adv
        with pytest.raises(ValueError, match="already registered"):
            register_advantage("my_adv")(lambda *a, **k: None)
        replacement = register_advantage("my_adv", override=True)(lambda *a, **k: None)
        assert get_advantage_estimator("my_adv") is replacement

        @register_policy_loss("my_loss")
        def my_loss(old_logprobs, logprobs, advantages, response_mask, **kw):
            return logprobs.sum(), {}

        assert get_policy_loss("my_loss") is my_loss
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("vanilla")(my_loss)  # built-ins are protected too
        assert get_policy_loss("vanilla") is ppo_clip_loss
    finally:
        ADVANTAGE_ESTIMATORS.pop("my_adv", None)
        POLICY_LOSSES.pop("my_loss", None)


# ----------------------------------------------------------------------------- utils


def test_masked_mean_sum_hand_and_empty():
    x = torch.tensor([[1.0, 2.0, float("nan")], [float("inf"), 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # valid values 1, 2 -> sum 3, mean 1.5; the nan/inf in padding must not leak
    close(masked_sum(x, m), torch.tensor(3.0))
    close(masked_mean(x, m), torch.tensor(1.5))
    # per row: [1, 2] -> 1.5 ; empty row -> 0 (not nan)
    close(masked_mean(x, m, dim=-1), torch.tensor([1.5, 0.0]))
    close(masked_mean(x, torch.zeros_like(m)), torch.tensor(0.0))


def test_masked_var_and_whiten_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # 1, 2, 3 -> mean 2, squared devs 1 + 0 + 1 = 2, unbiased var 2/2 = 1, biased 2/3
    close(masked_var(x, m), torch.tensor(1.0))
    close(masked_var(x, m, unbiased=False), torch.tensor(2.0 / 3.0))
    # whiten: (x - 2) / sqrt(1) -> -1, 0, 1 ; padding -> 0
    close(masked_whiten(x, m, epsilon=0.0), torch.tensor([-1.0, 0.0, 1.0, 0.0]))
    # empty / single-element masks stay finite
    assert torch.isfinite(masked_whiten(x, torch.zeros(4))).all()
    close(masked_var(x, torch.tensor([1.0, 0, 0, 0])), torch.tensor(0.0))


def test_entropy_from_logits_hand_and_stable():
    # uniform over 4 -> log 4 ; one live logit (rest -inf) -> 0 ; huge logits stay finite
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [3.0, -float("inf"), -float("inf"), -float("inf")],
                            [1000.0, 1000.0, -1000.0, -1000.0]]], requires_grad=True)
    ent = entropy_from_logits(logits)
    assert ent.shape == (1, 3)
    # two logits tied at 1000 -> log 2 ; absolute error of the lse - E[z] form is ~ eps * |z| = 1e-4 here
    close(ent.detach(), torch.tensor([[math.log(4), 0.0, math.log(2)]]), atol=2e-4, rtol=0)
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()
    z = torch.randn(2, 3, 7)
    close(entropy_from_logits(z), torch.distributions.Categorical(logits=z).entropy())


def test_logprobs_from_logits_hand():
    # logits [0, ln 3] -> softmax [1/4, 3/4] ; label 1 -> ln 0.75, label 0 -> ln 0.25
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    expected = torch.tensor([[math.log(0.75), math.log(0.25)]])
    close(logprobs_from_logits(logits, torch.tensor([[1, 0]])), expected)
    z, y = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    close(logprobs_from_logits(z, y), torch.distributions.Categorical(logits=z).log_prob(y))


# ----------------------------------------------------------------------------- KL


def test_kl_kinds_hand():
    ln2 = math.log(2.0)
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    # d = logp - ref = +ln2, -ln2
    close(kl_penalty(logp, ref, "k1"), torch.tensor([[ln2, -ln2]]))
    # k2 = d^2 / 2 = 0.2402 both
    close(kl_penalty(logp, ref, "k2"), torch.tensor([[ln2**2 / 2, ln2**2 / 2]]))
    # k3 = exp(-d) + d - 1: 0.5 + ln2 - 1 = 0.1931 ; 2 - ln2 - 1 = 0.3069
    close(kl_penalty(logp, ref, "k3"), torch.tensor([[0.5 + ln2 - 1, 2 - ln2 - 1]]))
    close(kl_penalty(logp, ref, "abs"), torch.tensor([[ln2, ln2]]))
    for alias, canon in [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")]:
        close(kl_penalty(logp, ref, alias), kl_penalty(logp, ref, canon))
    assert KL_KINDS == ("k1", "k2", "k3", "abs")


def test_kl_extreme_log_ratios_finite_and_k3_clamped():
    logp = torch.tensor([[100.0, -100.0, 0.0]], requires_grad=True)
    ref = torch.zeros(1, 3)
    for kind in list(KL_KINDS) + [k + "+" for k in KL_KINDS]:
        out = kl_penalty(logp, ref, kind)
        (g,) = torch.autograd.grad(out.sum(), logp)
        assert torch.isfinite(out).all() and torch.isfinite(g).all(), kind
    # d = +100 -> log ratio clamped to -20 -> e^-20 + 20 - 1 = 19 -> clamp 10 ; d = -100 -> e^20 - 21 -> 10
    close(kl_penalty(logp, ref, "k3").detach(), torch.tensor([[10.0, 10.0, 0.0]]))


@pytest.mark.parametrize("kind", ["k1+", "k3+", "abs+", "low_var_kl+", "k2+"])
def test_kl_straight_through_value_of_kind_grad_of_k2(kind):
    logp = torch.tensor([[0.3, -1.2, 2.0]], requires_grad=True)
    ref = torch.tensor([[0.1, 0.5, 0.0]])
    out = kl_penalty(logp, ref, kind)
    close(out.detach(), kl_penalty(logp, ref, kind[:-1]).detach())
    (g,) = torch.autograd.grad(out.sum(), logp)
    # d/dlogp of k2 = d = logp - ref = 0.2, -1.7, 2.0
    close(g, torch.tensor([[0.2, -1.7, 2.0]]))


def test_kl_unknown_kind_lists_valid():
    with pytest.raises(ValueError, match=r"unknown KL kind 'k4'; valid: k1, k2, k3, abs"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    with pytest.raises(ValueError, match="valid: k1, k2, k3, abs"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "+")


# ----------------------------------------------------------------------------- agg_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    "mode, kw, expected",
    [
        ("token-mean", {}, 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", {}, 3.5),  # (3 + 4) / 2 seqs
        ("seq-mean-token-mean", {}, 2.75),  # (1.5 + 4) / 2 seqs
        ("seq-mean-token-sum-norm", {}, 7.0 / 6.0),  # 7 / (2 seqs * L=3)
        ("seq-mean-token-sum-norm", {"norm_constant": 7}, 0.5),  # 7 / (2 * 7)
        ("token-mean", {"num_tokens": 14}, 0.5),  # 7 / 14 (whole-step count)
        ("seq-mean-token-sum", {"num_seqs": 7}, 1.0),  # 7 / 7
    ],
)
def test_agg_loss_hand(mode, kw, expected):
    close(agg_loss(LOSS, MASK, mode, **kw), torch.tensor(expected))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_empty_mask_is_zero(mode):
    loss = torch.tensor([[float("nan"), float("inf")]], requires_grad=True)
    out = agg_loss(loss, torch.zeros(1, 2), mode)
    out.backward()
    assert out.item() == 0.0 and torch.isfinite(loss.grad).all()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_microbatch_sum_equals_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(4, 5, generator=g, requires_grad=True)
    # lengths 5, 1, 0 (empty response), 3 -> 9 tokens, 3 seqs with a token (verl leaves the empty one out);
    # halves hold 6 and 3 tokens
    mask = (torch.arange(5) < torch.tensor([5, 1, 0, 3])[:, None]).float()
    full = agg_loss(loss, mask, mode)
    (g_full,) = torch.autograd.grad(full, loss)
    step = LossNorm(mode, num_tokens=mask.sum(), num_seqs=3)
    micro = sum(agg_loss(loss[i:i + 2], mask[i:i + 2], step) for i in (0, 2))
    (g_micro,) = torch.autograd.grad(micro, loss)
    close(micro, full)
    close(g_micro, g_full)
    # Without the whole-step counts the sum would be wrong (each half normalised by itself):
    naive = sum(agg_loss(loss[i:i + 2], mask[i:i + 2], mode) for i in (0, 2))
    assert not torch.allclose(naive, full)


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match="valid: token-mean, seq-mean-token-sum, seq-mean-token-mean"):
        agg_loss(LOSS, MASK, "sum")


# ----------------------------------------------------------------------------- policy losses


def _ppo_example():
    # tokens a..d valid, e padding with an absurd ratio; clip low 0.2, high 0.28, c 3
    ratio = torch.tensor([[1.5, 0.5, 0.5, 5.0, 1.0]])
    logp = torch.cat([ratio[:, :4].log(), torch.tensor([[100.0]])], -1).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    return torch.zeros(1, 5), logp, adv, mask


def test_ppo_clip_hand():
    old, logp, adv, mask = _ppo_example()
    loss, metrics = ppo_clip_loss(old, logp, adv, mask,
                                  clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    # a: r 1.5, A +1: max(-1.5, -1.28) = -1.28 (clipped)
    # b: r 0.5, A +1: max(-0.5, -0.8)  = -0.5
    # c: r 0.5, A -1: max(0.5, 0.8) = 0.8 (clipped), min(0.8, 3) = 0.8
    # d: r 5,   A -1: max(5, 1.28) = 5, dual min(5, 3) = 3 (dual-clip)
    # token-mean: (-1.28 - 0.5 + 0.8 + 3) / 4 = 0.505
    close(loss.detach(), torch.tensor(0.505))
    loss.backward()
    # only b is unclipped: d/dlogp (-A r) = -1 * 0.5 / 4 tokens = -0.125 ; the rest have zero gradient
    close(logp.grad, torch.tensor([[0.0, -0.125, 0.0, 0.0, 0.0]]))
    assert metrics["clip_frac"] == pytest.approx(0.5)  # a, c
    assert metrics["clip_frac_lower"] == pytest.approx(0.25)  # d
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 0.5 + 5.0) / 4)
    kl = 0.5 * (math.log(1.5) ** 2 + 2 * math.log(0.5) ** 2 + math.log(5.0) ** 2) / 4
    assert metrics["ppo_kl"] == pytest.approx(kl, rel=1e-5)
    assert all(type(v) is float for v in metrics.values())


def test_ppo_clip_symmetric_default_and_undeclared_kwargs():
    old, logp, adv, mask = _ppo_example()
    # default clip 0.2 both sides: a -> -1.2 ; (-1.2 - 0.5 + 0.8 + 3) / 4 = 0.525 ; None = the loss's default
    loss, _ = policy_loss_spec("vanilla").bind(clip_ratio_low=None, clip_ratio_high=None)(old, logp, adv, mask,
                                                                                         LossNorm())
    close(loss.detach(), torch.tensor(0.525))
    # a keyword the loss does not declare is an error, not silently ignored
    with pytest.raises(ValueError, match=r"policy loss 'vanilla' has no hyper-parameter \['kl_coef'\]"):
        policy_loss_spec("vanilla").bind(kl_coef=0.1)


def test_ppo_dual_clip_must_exceed_one():
    old, logp, adv, mask = _ppo_example()
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        ppo_clip_loss(old, logp, adv, mask, clip_ratio_c=1.0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_ppo_extreme_log_ratios_and_empty_masks_are_finite(mode):
    logp = torch.tensor([[100.0, -100.0, 50.0], [-100.0, 100.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-100.0, 100.0, 0.0], [100.0, -100.0, 0.0]])
    adv = torch.tensor([[5.0, -5.0, 1e3], [-1e3, 2.0, -1.0]])
    for mask in (torch.ones(2, 3), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), torch.zeros(2, 3)):
        loss, metrics = ppo_clip_loss(old, logp, adv, mask, mode)
        (g,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(g).all()
        assert all(math.isfinite(v) for v in metrics.values())
    assert loss.item() == 0.0 and metrics["clip_frac"] == 0.0  # all-zero mask


def test_reinforce_hand_and_equals_ppo_gradient_on_policy():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 4.0]])
    mask = torch.tensor([[1, 1, 0]])
    # -A * logp = 1, -2 (third is padding) -> token-mean -0.5 ; grad -A / 2 = -0.5, 0.5, 0
    loss, metrics = reinforce_loss(None, logp, adv, mask)
    close(loss.detach(), torch.tensor(-0.5))
    (g_rf,) = torch.autograd.grad(loss, logp)
    close(g_rf, torch.tensor([[-0.5, 0.5, 0.0]]))
    assert metrics == {}
    # At ratio 1 (old == new) PPO's gradient is the REINFORCE gradient.
    ppo, _ = ppo_clip_loss(logp.detach(), logp, adv, mask)
    close(torch.autograd.grad(ppo, logp)[0], g_rf)


# ----------------------------------------------------------------------------- advantages


def _rewards(scores, length=3):
    """Outcome reward on the last token: (B,) -> (B, length)."""
    r = torch.zeros(len(scores), length)
    r[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return r


def test_grpo_hand_unsorted_ids_singleton_and_padding():
    # ids are arbitrary and interleaved: group 7 = rows 0, 2, 3 ; group -3 = row 1 (singleton)
    rewards = _rewards([1.0, 9.0, 0.0, 2.0])
    ids = torch.tensor([7, -3, 7, 7])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    adv, ret = grpo_advantages(rewards, mask, ids)
    # group 7 scores 1, 0, 2 -> mean 1, unbiased std 1 -> (0, -1, 1) / (1 + 1e-6)
    # singleton -3 (verl): mean 0, std 1 -> 9 / (1 + 1e-6) = 8.999991
    s = 1.0 / (1.0 + 1e-6)
    close(adv, torch.tensor([[0.0, 0.0, 0.0], [9 * s, 9 * s, 9 * s], [-s, -s, 0.0], [s, 0.0, 0.0]]))
    assert torch.equal(ret, adv)
    # singleton_advantage="zero": the singleton has no baseline -> 0 ; the group is unchanged
    adv, _ = grpo_advantages(rewards, mask, ids, singleton_advantage="zero")
    close(adv, torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-s, -s, 0.0], [s, 0.0, 0.0]]))
    # Dr.GRPO singleton: mean 0, no std -> exactly the score 9
    adv, _ = grpo_advantages(rewards, mask, ids, norm_by_std=False)
    assert torch.equal(adv[1], torch.full((3,), 9.0))


def test_grpo_std_is_unbiased_and_dr_grpo():
    mask = torch.ones(2, 3)
    # scores 0, 2 -> mean 1, unbiased std sqrt(((-1)^2 + 1^2) / 1) = sqrt 2 -> -0.7071, 0.7071
    # (the biased std 1 would give -1, 1)
    adv, _ = grpo_advantages(_rewards([0.0, 2.0]), mask, torch.tensor([0, 0]), epsilon=0.0)
    close(adv[:, 0], torch.tensor([-(0.5**0.5), 0.5**0.5]))
    # Dr.GRPO: scores 0, 1, 5 -> mean 2 -> -2, -1, 3 (no std division)
    grpo = get_advantage_estimator("grpo")
    adv, _ = grpo(_rewards([0.0, 1.0, 5.0]), torch.ones(3, 3), torch.tensor([4, 4, 4]),
                  norm_by_std=False, unused_option=1)
    close(adv, torch.tensor([[-2.0] * 3, [-1.0] * 3, [3.0] * 3]))


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_all_equal_group_is_exactly_zero(fn):
    # 0.1 + 0.1 + 0.1 = 0.3000000119 in fp32 and / 3 != 0.1: a naive mean would leak tiny advantages
    rewards = _rewards([0.1, 0.1, 0.1, 0.7, 0.7])
    adv, _ = fn(rewards, torch.ones(5, 3), torch.tensor([1, 1, 1, 2, 2]))
    assert torch.equal(adv, torch.zeros(5, 3))


def test_rloo_hand():
    # group 5 scores 1, 0, 2: A = 1 - (0+2)/2 = 0 ; 0 - (1+2)/2 = -1.5 ; 2 - (1+0)/2 = 1.5
    # singleton 8 (verl): no other sample, baseline 0 -> its score 3
    rloo = get_advantage_estimator("rloo")
    adv, ret = rloo(_rewards([1.0, 0.0, 2.0, 3.0]), torch.ones(4, 3), torch.tensor([5, 5, 5, 8]))
    close(adv[:, 0], torch.tensor([0.0, -1.5, 1.5, 3.0]))
    assert torch.equal(ret, adv)
    # singleton_advantage="zero": singleton 8 -> 0
    adv, _ = rloo(_rewards([1.0, 0.0, 2.0, 3.0]), torch.ones(4, 3), torch.tensor([5, 5, 5, 8]),
                  singleton_advantage="zero")
    close(adv[:, 0], torch.tensor([0.0, -1.5, 1.5, 0.0]))


@pytest.mark.parametrize("fn", [grpo_advantages, rloo_advantages])
def test_zero_length_response_and_permutation_invariance(fn):
    rewards = _rewards([1.0, 0.0, 3.0, -1.0, 2.0, 2.0])
    ids = torch.tensor([10, 10, 20, 10, 20, 30])
    mask = torch.ones(6, 3)
    mask[1] = 0  # zero-length response: its row must be 0, yet its score (0) still counts in the baseline
    adv, _ = fn(rewards, mask, ids)
    assert torch.isfinite(adv).all() and torch.equal(adv[1], torch.zeros(3))
    assert adv[0, 0] > 0 > adv[3, 0]  # group 10 scores 1, 0, -1
    perm = torch.tensor([5, 3, 0, 4, 1, 2])
    adv_p, _ = fn(rewards[perm], mask[perm], ids[perm])
    close(adv_p, adv[perm])


# ---------------------------------------------------------------- GAE, ReMax, value loss
def test_gae_hand_example_no_whiten():
    from verl_hf.algorithms import gae_advantages

    # one response of 2 tokens (third column is padding), reward 1 on the last token, V = 0.5, 0.8
    # gamma = lam = 1: t=1 delta = 1 + 0 - 0.8 = 0.2 -> A1 = 0.2; t=0 delta = 0 + 0.8 - 0.5 = 0.3 -> A0 = 0.5
    # returns R = A + V = 1.0, 1.0
    r = torch.tensor([[0.0, 1.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.8, 9.0]])  # the padded value must not leak in
    adv, ret = gae_advantages(r, m, v, gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.2, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 0.0]]))
    # gamma = lam = 0.5: A1 = 0.2; delta0 = 0 + 0.5*0.8 - 0.5 = -0.1 -> A0 = -0.1 + 0.25*0.2 = -0.05
    adv, ret = gae_advantages(r, m, v, gamma=0.5, lam=0.5, whiten=False)
    assert torch.allclose(adv, torch.tensor([[-0.05, 0.2, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.45, 1.0, 0.0]]))


def test_gae_skips_environment_tokens_in_a_multi_turn_response():
    """Multi-turn: tool tokens (mask 0) sit between the model's turns. The recursion steps over them: the
    model's last token before them bootstraps from the value of the model's next token, as if the tool's
    tokens were part of the environment's transition, and they get no advantage and no return."""
    from verl_hf.algorithms import gae_advantages

    # model, tool, tool, model; a turn reward 0.5 on the first turn's last token, the outcome 1 at the end
    # gamma = lam = 1: A3 = 1 - 0.8 = 0.2; A0 = 0.5 + 0.8 - 0.5 + A3 = 1.0; returns A + V = 1.5, 1.0
    r = torch.tensor([[0.5, 0.0, 0.0, 1.0]])
    m = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 7.0, -7.0, 0.8]])  # the critic's values at tool tokens must not leak in
    adv, ret = gae_advantages(r, m, v, gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(adv, torch.tensor([[1.0, 0.0, 0.0, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[1.5, 0.0, 0.0, 1.0]]))


def test_gae_whitened_over_valid_tokens():
    from verl_hf.algorithms import gae_advantages

    r = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, -1.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, _ = gae_advantages(r, m, torch.zeros(2, 3))
    valid = adv[m.bool()]
    assert abs(valid.mean().item()) < 1e-6 and abs(valid.var().item() - 1.0) < 0.3 and adv[0, 2] == 0


def test_remax_hand_example():
    from verl_hf.algorithms import remax_advantages

    # rewards 1 and 2 on the last tokens; greedy baselines 0.5 and 1.0 -> A = 0.5 and 1.0 on every valid token
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = remax_advantages(r, m, torch.tensor([0.5, 1.0]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0]]))


def test_value_loss_clipped_hand_example():
    from verl_hf.algorithms import value_loss

    # V = 1.0, V_old = 0.5, R = 2.0, clip 0.2 -> clipped V = 0.7; (1-2)^2 = 1, (0.7-2)^2 = 1.69 -> 0.5 * 1.69
    loss, metrics = value_loss(torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[2.0]]),
                               torch.tensor([[1.0]]), cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.845) and metrics["vf_clip_frac"] == 1.0
