"""Hand-computed checks for verl_hf.algorithms.policy_losses (gspo, sapo, cispo, gpg, clip_cov, kl_cov, geo_mean)."""

import math

import pytest
import torch

import verl_hf.algorithms.policy_losses as pl
from verl_hf.algorithms import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    LossNorm,
    get_policy_loss,
    policy_loss_spec,
    ppo_clip_loss,
    reinforce_loss,
)

close = torch.testing.assert_close
LN2 = math.log(2.0)
NAMES = ("gspo", "sapo", "cispo", "gpg", "clip_cov", "kl_cov", "geo_mean")


def _leaf(rows):
    return torch.tensor(rows, dtype=torch.float32, requires_grad=True)


def _grad(loss, logp):
    (g,) = torch.autograd.grad(loss, logp)
    return g


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", NAMES)
def test_registered_under_exact_name(name):
    assert name in POLICY_LOSSES
    assert get_policy_loss(name) is getattr(pl, f"{name}_loss")


# ----------------------------------------------------------------------------- gspo


def _gspo_example():
    # old = 0, so logp is the log-ratio.  Row 0 (A = +1): log-ratios ln1.1 +- 0.5 -> mean ln1.1 -> s_0 = 1.1;
    # the third token is padding with an absurd 100.  Row 1 (A = +1): ln2 everywhere -> s_1 = 2.
    a = math.log(1.1)
    logp = _leaf([[a + 0.5, a - 0.5, 100.0], [LN2, LN2, LN2]])
    return torch.zeros(2, 3), logp, torch.ones(2, 3), torch.tensor([[1, 1, 0], [1, 1, 1]])


def test_gspo_hand():
    old, logp, adv, mask = _gspo_example()
    loss, m = pl.gspo_loss(old, logp, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    # row 0: s = 1.1 in [0.8, 1.2] -> l = -1.1 per token (token ratios 1.81 / 0.67 would be PPO-clipped,
    #        the sequence ratio is not); row 1: s = 2 > 1.2, A > 0 -> clipped, l = -1.2 per token.
    # token-mean: (2 * -1.1 + 3 * -1.2) / 5 = -5.8 / 5 = -1.16
    close(loss.detach(), torch.tensor(-1.16))
    # d l_t / d logp_t = -A s_i (same for every token of row 0), / 5 tokens = -0.22 ; row 1 clipped -> 0
    close(_grad(loss, logp), torch.tensor([[-0.22, -0.22, 0.0], [0.0, 0.0, 0.0]]))
    assert m["clip_frac"] == pytest.approx(3 / 5)
    assert m["seq_ratio_mean"] == pytest.approx((1.1 + 2.0) / 2, rel=1e-5)
    kl = 0.5 * ((math.log(1.1) + 0.5) ** 2 + (math.log(1.1) - 0.5) ** 2 + 3 * LN2 ** 2) / 5
    assert m["ppo_kl"] == pytest.approx(kl, rel=1e-5)
    assert all(type(v) is float for v in m.values())


def test_gspo_honours_agg_mode_and_paper_defaults():
    old, logp, adv, mask = _gspo_example()
    # seq-mean-token-mean (the paper's): (mean(-1.1, -1.1) + mean(-1.2 x3)) / 2 = -1.15
    loss, _ = pl.gspo_loss(old, logp, adv, mask, "seq-mean-token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2)
    close(loss.detach(), torch.tensor(-1.15))
    # defaults 3e-4 / 4e-4: both s_i > 1.0004 with A > 0 -> every token -1.0004, no gradient
    loss, m = get_policy_loss("gspo")(old, logp, adv, mask)
    close(loss.detach(), torch.tensor(-1.0004))
    close(_grad(loss, logp), torch.zeros(2, 3))
    assert m["clip_frac"] == 1.0


# ----------------------------------------------------------------------------- sapo


def test_sapo_hand():
    # ratios r = [[1, 2, pad], [1, 0.5, 1]], A = +1 row 0 (tau_pos = 1), -1 row 1 (tau_neg = 2 here)
    old = torch.zeros(2, 3)
    logp = _leaf([[0.0, LN2, 50.0], [0.0, -LN2, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    s1, sm1 = 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))  # sigmoid(1) = 0.731059, sigmoid(-1) = 0.268941
    # gate f = (4/tau) sigmoid(tau (r - 1)); l = -A f
    # row 0: r=1 -> 4*0.5 = 2 -> -2 ; r=2 -> 4*0.731059 = 2.924234 -> -2.924234
    # row 1: r=1 -> 2*0.5 = 1 -> +1 ; r=0.5 -> 2*sigmoid(-1) = 0.537883 -> +0.537883 ; r=1 -> +1
    # d l / d logp = -A r 4 sigma (1 - sigma): r=1 -> 1 ; row0 r=2 -> -8 * 0.196612 ; row1 r=0.5 -> 2 * 0.196612
    w = s1 * sm1  # 0.196612
    # Default (verl, the paper): seq-mean-token-mean whatever the mode says (token-mean here):
    # row 0 mean(-2, -2.924234) = -2.462117 ; row 1 mean(1, 0.537883, 1) = 0.845961 ; / 2 seqs = -0.808078
    loss, _ = pl.sapo_loss(old, logp, adv, mask, "token-mean", tau_pos=1.0, tau_neg=2.0)
    default = ((-2 - 4 * s1) / 2 + (1 + 2 * sm1 + 1) / 3) / 2
    assert default == pytest.approx(-0.808078, abs=1e-6)
    close(loss.detach(), torch.tensor(default))
    close(_grad(loss, logp), torch.tensor([[-1.0 / 4, -8 * w / 4, 0.0], [1.0 / 6, 2 * w / 6, 1.0 / 6]]))
    # follow_loss_agg_mode=True honours the mode: token-mean (-2 - 2.924234 + 1 + 0.537883 + 1) / 5 = -0.4772702
    loss, m = pl.sapo_loss(old, logp, adv, mask, tau_pos=1.0, tau_neg=2.0, follow_loss_agg_mode=True)
    expected = (-2 - 4 * s1 + 1 + 2 * sm1 + 1) / 5
    close(loss.detach(), torch.tensor(expected))
    assert expected == pytest.approx(-0.4772702, abs=1e-6)
    close(_grad(loss, logp), torch.tensor([[-1.0, -8 * w, 0.0], [1.0, 2 * w, 1.0]]) / 5)
    assert m["gate_grad_mean"] == pytest.approx((3 + 2 * 4 * w) / 5, rel=1e-5)
    assert m["ratio_mean"] == pytest.approx((1 + 2 + 1 + 0.5 + 1) / 5, rel=1e-5)


def test_sapo_defaults_and_on_policy_gradient_is_reinforce():
    logp = _leaf([[-1.0, -2.0, -0.5], [-3.0, -0.1, -9.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, _ = pl.sapo_loss(logp.detach(), logp, adv, mask)
    # r = 1: f = 2/tau -> A=+1: -2 (tau_pos 1) x3 ; A=-2: +2 * 2/1.05 = 3.809524 x2
    # seq-mean-token-mean (the default): (mean(-2 x3) + mean(3.809524 x2)) / 2 = (-2 + 3.809524) / 2 = 0.904762
    close(loss.detach(), torch.tensor((-2 + 2 * 2 / 1.05) / 2))
    # the gate's slope is 1 at r = 1 for any tau, so the gradient is exactly REINFORCE's (same aggregation)
    ref, _ = reinforce_loss(None, logp, adv, mask, "seq-mean-token-mean")
    close(_grad(loss, logp), _grad(ref, logp))
    with pytest.raises(ValueError, match="tau_pos and tau_neg must be > 0"):
        pl.sapo_loss(logp.detach(), logp, adv, mask, tau_neg=0.0)


# ----------------------------------------------------------------------------- cispo


def test_cispo_hand():
    logp = _leaf([[-1.0, -2.0, -7.0], [-0.5, -3.0, -1.0]])
    ratio = torch.tensor([[1.5, 0.5, 9.0], [1.0, 2.0, 0.9]])
    old = logp.detach() - ratio.log()
    adv = torch.tensor([[2.0, 1.0, 9.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, m = pl.cispo_loss(old, logp, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    # w = sg[clip(r, 0.8, 1.28)] = [1.28, 0.8 | 1.0, 1.28, 0.9] ; l = -w A logp
    # = -1.28*2*(-1) = 2.56 ; -0.8*1*(-2) = 1.6 ; -1*(-1)*(-0.5) = -0.5 ; -1.28*(-1)*(-3) = -3.84 ; -0.9*(-1)*(-1) = -0.9
    # token-mean: (2.56 + 1.6 - 0.5 - 3.84 - 0.9) / 5 = -1.08 / 5 = -0.216
    close(loss.detach(), torch.tensor(-0.216))
    # grad -w A / 5: clipped tokens keep their gradient (unlike PPO), only the weight is capped
    close(_grad(loss, logp), torch.tensor([[-2.56, -0.8, 0.0], [1.0, 1.28, 0.9]]) / 5)
    assert m["clip_frac"] == pytest.approx(3 / 5)  # 1.5 > 1.28, 0.5 < 0.8, 2 > 1.28
    # verl defaults 0.2 / 0.2: w = [1.2, 0.8 | 1, 1.2, 0.9] -> (2.4 + 1.6 - 0.5 - 3.6 - 0.9) / 5 = -0.2
    loss, _ = get_policy_loss("cispo")(old, logp, adv, mask)
    close(loss.detach(), torch.tensor(-0.2))


# ----------------------------------------------------------------------------- gpg


def test_gpg_hand_equals_reinforce():
    logp = _leaf([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    adv = torch.tensor([[1.0, -1.0, 4.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])  # row 1 is an empty response
    loss, m = pl.gpg_loss(None, logp, adv, mask)
    # -A logp = 1, -2 (rest masked) -> token-mean -1 / 2 = -0.5 ; grad -A / 2 = -0.5, 0.5
    close(loss.detach(), torch.tensor(-0.5))
    close(_grad(loss, logp), torch.tensor([[-0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]))
    assert m == {}
    # seq-mean-token-sum: -1 / 1 seq (the empty one is left out, as verl) = -1 ; same as reinforce in every mode
    for mode in LOSS_AGG_MODES:
        a, _ = pl.gpg_loss(None, logp, adv, mask, mode)
        b, _ = reinforce_loss(None, logp, adv, mask, mode)
        close(a, b)
    _, m = pl.gpg_loss(logp.detach() - LN2, logp, adv, mask)
    assert m["ppo_kl"] == pytest.approx(0.5 * LN2 ** 2, rel=1e-5)


# ----------------------------------------------------------------------------- clip_cov / kl_cov


def _cov_example():
    # valid logp [-1, -4, -2 | -4, -1], padding 50 -> mean logp = -12/5 = -2.4 ; centred 1.4, -1.6, 0.4 | -1.6, 1.4
    # A = +1 row 0, -1 row 1 -> mean A = (3 - 2)/5 = 0.2 ; centred 0.8 | -1.2
    # cov = 1.12, -1.28, 0.32 | 1.92, -1.68   (padding would shift both means if it leaked in)
    # ratios r = 1 except t00 = 2 (A > 0) and t10 = 2 (A < 0)
    logp = _leaf([[-1.0, -4.0, -2.0], [-4.0, -1.0, 50.0]])
    old = logp.detach() - torch.tensor([[LN2, 0.0, 0.0], [LN2, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return old, logp, adv, mask


def test_centered_cov_hand():
    _, logp, adv, mask = _cov_example()
    close(pl._centered_cov(adv, logp, mask), torch.tensor([[1.12, -1.28, 0.32], [1.92, -1.68, 0.0]]))


def test_clip_cov_hand():
    old, logp, adv, mask = _cov_example()
    loss, m = pl.clip_cov_loss(old, logp, adv, mask)  # defaults: lb 1, ub 5, ratio 2e-4, clip 0.2, c 3
    # vanilla: t00 r=2, A=+1 -> max(-2, -1.2) = -1.2 (PPO-clipped) ; t01, t02 -> -1 ; t10 r=2, A=-1 ->
    #   max(2, 1.2) = 2 < c=3 ; t11 -> 1.   Candidates lb < cov < ub and not clipped: t00 (1.12) is clipped,
    #   so only t10 (1.92).  n = max(int(2e-4 * 5), 1) = 1 (at least one token, as verl) -> t10 loss 0.
    # token-mean: (-1.2 - 1 - 1 + 0 + 1) / 5 = -0.44   (vanilla alone: (-1.2 - 2 + 2 + 1) / 5 = -0.04)
    close(loss.detach(), torch.tensor(-0.44))
    # grads /5: t00 clipped 0 ; t01, t02 -A r = -1 ; t10 detached 0 (vanilla: +2) ; t11 +1
    close(_grad(loss, logp), torch.tensor([[0.0, -1.0, -1.0], [0.0, 1.0, 0.0]]) / 5)
    assert m["cov_clip_frac"] == pytest.approx(0.2)
    assert m["clip_frac"] == pytest.approx(0.2) and m["clip_frac_lower"] == 0.0
    assert m["ppo_kl"] == pytest.approx(0.5 * 2 * LN2 ** 2 / 5, rel=1e-5)


def test_clip_cov_without_candidates_is_vanilla():
    old, logp, adv, mask = _cov_example()
    # lb = 3: no token has cov in (3, 5) -> nothing detached -> exactly the vanilla loss (dual-clip included)
    for c in (3.0, 1.5):
        loss, m = pl.clip_cov_loss(old, logp, adv, mask, clip_cov_lb=3.0, clip_ratio_c=c)
        ref, _ = ppo_clip_loss(old, logp, adv, mask, clip_ratio_c=c)
        close(loss, ref)
        close(_grad(loss, logp), _grad(ref, logp))
        assert m["cov_clip_frac"] == 0.0
    close(ref.detach(), torch.tensor((-1.2 - 2 + 1.5 + 1) / 5))  # c = 1.5 dual-clips t10: min(2, 1.5)


def test_clip_cov_random_selection_is_seeded_and_sized():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 8, generator=g).requires_grad_()
    old = logp.detach() + 0.01 * torch.randn(4, 8, generator=g)
    adv = torch.randn(4, 1, generator=g).expand(4, 8)
    mask = torch.ones(4, 8)
    kw = dict(clip_cov_ratio=0.25, clip_cov_lb=-1e9, clip_cov_ub=1e9)  # every unclipped token is a candidate

    def run(seed):
        loss, m = pl.clip_cov_loss(old, logp, adv, mask, generator=torch.Generator().manual_seed(seed), **kw)
        return loss.detach(), _grad(loss, logp), m

    l0, g0, m0 = run(0)
    l0b, g0b, _ = run(0)
    _, g1, _ = run(1)
    close(l0, l0b)
    close(g0, g0b)  # same seed -> same subset
    assert not torch.equal(g0 == 0, g1 == 0)  # another seed -> another subset
    assert m0["clip_frac"] == 0.0
    assert m0["cov_clip_frac"] == pytest.approx(8 / 32)  # int(0.25 * 32) = 8 tokens
    assert int((g0 == 0).sum()) == 8


def test_kl_cov_hand():
    old, logp, adv, mask = _cov_example()
    loss, m = pl.kl_cov_loss(old, logp, adv, mask)  # ratio 2e-4 -> k = max(int(0.001), 1) = 1 ; coef 1
    # unclipped surrogate -A r: t00 -2 (no clip!), t01 -1, t02 -1, t10 +2, t11 +1.
    # top-1 cov is t10 (1.92) -> + |ln 2| = 2.693147.  token-mean: (-4 + 2.693147 + 1) / 5 = -0.0613706
    close(loss.detach(), torch.tensor((-4 + 2 + LN2 + 1) / 5))
    # grads /5: -A r -> t00 -2, t01 -1, t02 -1, t10 2 + sign(ln2) = 3, t11 1
    close(_grad(loss, logp), torch.tensor([[-2.0, -1.0, -1.0], [3.0, 1.0, 0.0]]) / 5)
    assert m["kl_cov_frac"] == pytest.approx(0.2)
    assert m["ppo_kl_abs"] == pytest.approx(2 * LN2 / 5, rel=1e-5)
    # kl_cov_ratio 0.4 -> k = int(2.0) = 2: t10 and t00 (1.12) ; coef 0.5 -> + 0.5 ln2 each
    loss, m = pl.kl_cov_loss(old, logp, adv, mask, kl_cov_ratio=0.4, kl_cov_coef=0.5)
    close(loss.detach(), torch.tensor((-4 + 2 + 1 + 2 * 0.5 * LN2) / 5))
    close(_grad(loss, logp), torch.tensor([[-1.5, -1.0, -1.0], [2.5, 1.0, 0.0]]) / 5)
    assert m["kl_cov_frac"] == pytest.approx(0.4)


def test_cov_ratios_validated():
    old, logp, adv, mask = _cov_example()
    with pytest.raises(ValueError, match="clip_cov_ratio must be in"):
        pl.clip_cov_loss(old, logp, adv, mask, clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match="kl_cov_ratio must be in"):
        pl.kl_cov_loss(old, logp, adv, mask, kl_cov_ratio=1.5)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        pl.clip_cov_loss(old, logp, adv, mask, clip_ratio_c=1.0)


# ----------------------------------------------------------------------------- geo_mean


def test_geo_mean_hand():
    old = torch.zeros(2, 3)
    logp = _leaf([[0.6, -0.6, 100.0], [-0.6, 0.6, 0.0]])  # log-ratios (old = 0); t02 padding
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, m = pl.geo_mean_loss(old, logp, adv, mask)  # clip 0.4 / 0.4 in log space
    # row 0, A = +1: c = min(lr, clip(lr, -0.4, 0.4)) = [0.4 (clipped), -0.6 (lower bound not pessimistic)]
    #   mean -0.1 -> ratio e^-0.1 = 0.904837 -> l0 = -0.904837
    # row 1, A = -1: c = max(lr, clip) = [-0.4 (clipped), 0.6, 0.0] -> mean 0.2/3 -> e^(1/15) = 1.068939 -> l1 = 1.068939
    # mean over 2 seqs: (-0.904837 + 1.068939) / 2 = 0.082051
    r0, r1 = math.exp(-0.1), math.exp(1 / 15)
    close(loss.detach(), torch.tensor((-r0 + r1) / 2))
    # d l_i / d logp_t = -A_i ratio_i / n_i / B for unclipped tokens: row 0 t01 -0.904837/2/2 ; row 1 t11, t12 1.068939/3/2
    close(_grad(loss, logp), torch.tensor([[0.0, -r0 / 4, 0.0], [0.0, r1 / 6, r1 / 6]]))
    assert m["clip_frac"] == pytest.approx(2 / 5)
    assert m["seq_ratio_mean"] == pytest.approx((r0 + r1) / 2, rel=1e-5)
    # loss_agg_mode is ignored (validated); num_seqs is the whole-step normaliser
    for mode in LOSS_AGG_MODES:
        close(pl.geo_mean_loss(old, logp, adv, mask, mode)[0], loss)
    close(pl.geo_mean_loss(old, logp, adv, mask, LossNorm(num_seqs=4))[0].detach(), torch.tensor((-r0 + r1) / 4))
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        pl.geo_mean_loss(old, logp, adv, mask, "sum")


# ----------------------------------------------------------------------------- shared properties


@pytest.mark.parametrize("name", ("gspo", "sapo", "cispo", "gpg", "geo_mean"))
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_microbatch_sum_equals_full_batch(name, mode):
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(4, 5, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(4, 5, generator=g)
    adv = torch.randn(4, 1, generator=g).expand(4, 5)
    # 9 tokens, 3 sequences with a token: the empty response is left out of the count (verl)
    mask = (torch.arange(5) < torch.tensor([5, 1, 0, 3])[:, None]).float()
    spec = policy_loss_spec(name)
    fn = spec.bind(**{k: 0.2 for k in ("clip_ratio_low", "clip_ratio_high") if k in spec.hyperparameters})
    full, _ = fn(old, logp, adv, mask, LossNorm(mode))
    step = LossNorm(mode, num_tokens=mask.sum(), num_seqs=3)
    micro = sum(fn(old[i:i + 2], logp[i:i + 2], adv[i:i + 2], mask[i:i + 2], step)[0] for i in (0, 2))
    close(micro, full)
    close(_grad(micro, logp), _grad(full, logp))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_extreme_log_ratios_padding_and_empty_masks_are_finite(name, mode):
    # log-ratios +-200 (clamped to +-20); nan/inf only in the padded last column of both inputs
    logp = _leaf([[100.0, -100.0, float("nan")], [-100.0, 100.0, -float("inf")]])
    old = torch.tensor([[-100.0, 100.0, float("nan")], [100.0, -100.0, float("inf")]])
    adv = torch.tensor([[5.0, -5.0, 1e3], [-1e3, 2.0, -1.0]])
    spec = policy_loss_spec(name)
    fn = spec.bind(**({"generator": torch.Generator().manual_seed(0)} if "generator" in spec.hyperparameters else {}))
    masks = (torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]),
             torch.zeros(2, 3))
    for mask in masks:
        loss, metrics = fn(old, logp, adv, mask, LossNorm(mode))
        g = _grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(g).all(), (name, mask)
        assert all(math.isfinite(v) and type(v) is float for v in metrics.values()), (name, metrics)
        assert (g[~mask.bool()] == 0).all()  # padding never gets a gradient
    assert loss.item() == 0.0  # all-zero mask


@pytest.mark.parametrize("name", NAMES)
def test_trainer_binding_is_accepted(name):
    # the trainer binds the clip fields a loss declares (None = the loss's own default), then passes tensors and
    # the step's LossNorm; a key the loss does not declare is refused instead of swallowed
    old, logp, adv, mask = _cov_example()
    spec = policy_loss_spec(name)
    config = {"clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": 3.0}
    fn = spec.bind(**{k: v for k, v in config.items() if k in spec.hyperparameters})
    loss, _ = fn(old, logp, adv, mask, LossNorm("token-mean", num_tokens=5, num_seqs=2, constant=3))
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match=f"policy loss '{name}' has no hyper-parameter \\['kl_coef'\\]; valid: "):
        spec.bind(kl_coef=0.1)


def test_ppo_clip_fractions_by_side():
    """clip_frac_below: ratio < 1 - eps with A < 0; clip_frac_above: ratio > 1 + eps with A > 0 (TRL's
    clip_ratio/low_mean and high_mean); clip_frac is both (its region_mean). A ratio outside the range on the side
    where the min does not bind (0.5 with A > 0, 1.5 with A < 0) is not clipped."""
    ratio = torch.tensor([[1.5, 0.5, 1.0], [0.5, 1.5, 1.0]])
    logp = _leaf([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    old = logp.detach() - ratio.log()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    _, m = pl.ppo_clip_loss(old, logp, adv, torch.ones(2, 3), clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert m["clip_frac_below"] == pytest.approx(1 / 6) and m["clip_frac_above"] == pytest.approx(1 / 6)
    assert m["clip_frac"] == pytest.approx(2 / 6) and m["clip_frac_lower"] == 0.0
    _, m = pl.gspo_loss(*_gspo_example(), clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert (m["clip_frac_below"], m["clip_frac_above"]) == (0.0, pytest.approx(3 / 5))  # row 1: s = 2, A > 0
