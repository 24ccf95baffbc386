"""The self-describing registries (advantage_spec, policy_loss_spec), LossNorm, the group helpers, and the four
places where the default follows verl 0.9.1 and our former behaviour is a named option (hand-computed)."""

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from verl_hf import VerlConfig
from verl_hf.algorithms import (
    ADVANTAGE_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    LossNorm,
    ppo_clip_loss,
    advantage_spec,
    agg_loss,
    clipped_surrogate,
    get_advantage_estimator,
    get_policy_loss,
    group_all_equal,
    group_stats,
    policy_loss_spec,
    register_advantage,
    register_policy_loss,
    value_loss,
)
from verl_hf.algorithms import policy_losses as pl
from verl_hf.publish import algorithm_name

close = torch.testing.assert_close


def _config(**overrides):
    values = dict(output_dir="/tmp/verl-hf-registry", per_device_train_batch_size=8, num_generations=4,
                  report_to="none", use_cpu=True)
    values.update(overrides)
    return VerlConfig(**values)


# ----------------------------------------------------------------------------- advantage estimators


def test_builtin_estimators_describe_themselves():
    flags = {name: (s.display_name, s.needs_values, s.needs_groups, s.needs_greedy_baseline, s.one_sample_per_prompt,
                    s.needs_turn_rewards) for name, s in ((n, advantage_spec(n)) for n in ADVANTAGE_ESTIMATORS)}
    assert flags == {
        "grpo": ("GRPO", False, True, False, False, False),
        "rloo": ("RLOO", False, True, False, False, False),
        "gae": ("PPO", True, False, False, False, False),
        "remax": ("ReMax", False, False, True, True, False),
        "reinforce_plus_plus": ("REINFORCE++", False, False, False, True, False),
        "reinforce_plus_plus_baseline": ("REINFORCE++ (baseline)", False, True, False, False, False),
        "grpo_passk": ("GRPO (pass@k)", False, True, False, False, False),
        "opo": ("OPO", False, True, False, False, False),
        "gpg": ("GPG", False, True, False, False, False),
        "mt_grpo": ("MT-GRPO", False, True, False, False, True),
    }
    grpo = advantage_spec("grpo")
    assert grpo.fn is get_advantage_estimator("grpo")
    assert grpo.display_name_for(norm_by_std=False) == "Dr.GRPO" and grpo.display_name_for() == "GRPO"
    assert advantage_spec("rloo").display_name_for(norm_by_std=False) == "RLOO"


def test_advantage_spec_call_forwards_the_trainers_inputs():
    # scores 1, 0, 2 -> mean 1, std 1 -> 0, -1, 1 (/ (1 + 1e-6)); unused inputs (values, gamma, ...) are ignored
    rewards, mask = torch.tensor([[1.0], [0.0], [2.0]]), torch.ones(3, 1)
    adv, _ = advantage_spec("grpo")(token_level_rewards=rewards, response_mask=mask, group_ids=torch.zeros(3),
                                    values=torch.zeros(3, 1), reward_baselines=torch.zeros(3), gamma=1.0, lam=0.95,
                                    norm_by_std=True, singleton_advantage="score")
    close(adv[:, 0], torch.tensor([0.0, -1.0, 1.0]) / (1 + 1e-6))
    with pytest.raises(ValueError, match="singleton_advantage='one' is unknown; valid: score, zero"):
        advantage_spec("grpo")(token_level_rewards=rewards, response_mask=mask, group_ids=torch.zeros(3),
                               singleton_advantage="one")


def test_user_estimator_with_a_bare_name_and_unknown_names():
    try:
        @register_advantage("my_est")
        def my_est(token_level_rewards, response_mask, group_ids=None, **kw):
            return token_level_rewards, token_level_rewards

        spec = advantage_spec("my_est")
        assert spec.display_name == "my_est" and spec.fn is my_est
        assert not (spec.needs_values or spec.needs_groups or spec.needs_greedy_baseline or spec.one_sample_per_prompt)
        ADVANTAGE_ESTIMATORS["by_hand"] = my_est  # put in the dict directly: a spec with every flag False
        assert advantage_spec("by_hand").display_name == "by_hand" and not advantage_spec("by_hand").needs_groups
    finally:
        ADVANTAGE_ESTIMATORS.pop("my_est", None)
        ADVANTAGE_ESTIMATORS.pop("by_hand", None)
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'; valid: .*@register_advantage\('nope'\)"):
        advantage_spec("nope")
    with pytest.raises(ValueError, match=r"unknown policy loss 'nope'; valid: .*@register_policy_loss\('nope'\)"):
        policy_loss_spec("nope")


def test_algorithm_name_reads_the_registry():
    def args(est, std=True, safe=False):
        return SimpleNamespace(adv_estimator=est, norm_adv_by_std_in_grpo=std, safe_rl=safe)

    assert algorithm_name(args("grpo")) == "GRPO" and algorithm_name(args("grpo", std=False)) == "Dr.GRPO"
    assert algorithm_name(args("gae", safe=True)) == "PPO-Lagrangian (Safe-RLHF)"
    assert algorithm_name(args("rloo", safe=True)) == "RLOO with a Lagrangian cost constraint (Safe-RLHF)"
    assert algorithm_name(args("reinforce_plus_plus_baseline")) == "REINFORCE++ (baseline)"
    assert algorithm_name(args("gone")) == "gone"  # no longer registered: the config name


def test_config_checks_ask_the_spec():
    try:
        register_advantage("my_group_est", needs_groups=True)(lambda **kw: None)
        register_advantage("my_greedy_est", display_name="MyGreedy", needs_greedy_baseline=True)(lambda **kw: None)
        register_advantage("my_critic_est", needs_values=True)(lambda **kw: None)
        with pytest.raises(ValueError, match="adv_estimator='my_group_est' compares the responses of one prompt"):
            _config(adv_estimator="my_group_est", num_generations=1)
        _config(adv_estimator="remax", num_generations=1)  # one sample per prompt is fine
        safe = dict(cost_funcs=["length"], kl_coef=0.1)
        with pytest.raises(ValueError, match="MyGreedy's baseline is the greedy response's reward"):
            _config(adv_estimator="my_greedy_est", **safe)
        _config(adv_estimator="my_critic_est", use_kl_in_reward=True, **safe)  # values: KL may ride in the reward
        with pytest.raises(ValueError, match="KL cannot ride in the reward"):
            _config(adv_estimator="my_group_est", use_kl_in_reward=True, **safe)
    finally:
        for name in ("my_group_est", "my_greedy_est", "my_critic_est"):
            ADVANTAGE_ESTIMATORS.pop(name, None)


def test_config_singleton_and_seq_count_fields():
    cfg = _config()
    assert cfg.singleton_group_advantage == "score" and cfg.seq_mean_count_empty_rows is False
    assert _config(singleton_group_advantage="zero", seq_mean_count_empty_rows=True).singleton_group_advantage == "zero"
    with pytest.raises(ValueError, match="singleton_group_advantage='0' is unknown; valid: score, zero"):
        _config(singleton_group_advantage="0")


# ----------------------------------------------------------------------------- policy losses


def test_builtin_losses_declare_their_hyperparameters():
    declared = {name: dict(policy_loss_spec(name).hyperparameters) for name in POLICY_LOSSES}
    assert declared == {
        "vanilla": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0},
        "reinforce": {},
        "gspo": {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
        "sapo": {"tau_pos": 1.0, "tau_neg": 1.05, "follow_loss_agg_mode": False},
        "cispo": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2},
        "gpg": {},
        "clip_cov": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "clip_cov_ratio": 2e-4,
                     "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "generator": None},
        "kl_cov": {"kl_cov_ratio": 2e-4, "kl_cov_coef": 1.0},
        "geo_mean": {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4, "clip_direction": "token"},
    }
    assert {n for n in POLICY_LOSSES if not policy_loss_spec(n).uses_old_logprobs} == {"reinforce", "gpg"}
    assert all(policy_loss_spec(n).fn is get_policy_loss(n) for n in POLICY_LOSSES)


def _ppo_example():
    # ratios 1.5, 0.5, 0.5, 5 with A = +1, +1, -1, -1 (old = 0, so logp is the log-ratio)
    logp = torch.tensor([[1.5, 0.5, 0.5, 5.0]]).log().requires_grad_()
    return torch.zeros(1, 4), logp, torch.tensor([[1.0, 1.0, -1.0, -1.0]]), torch.ones(1, 4)


def test_bind_gives_the_trainers_former_call():
    old, logp, adv, mask = _ppo_example()
    spec = policy_loss_spec("vanilla")
    # config clip_ratio_low/high None (the loss's 0.2), clip_ratio_c 3 -> l = -1.2, -0.5, 0.8, 3 -> mean 0.525
    config = SimpleNamespace(clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0)
    fn = spec.bind(**{k: getattr(config, k) for k in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")
                      if k in spec.hyperparameters})
    loss, _ = fn(old, logp, adv, mask, LossNorm())
    close(loss.detach(), torch.tensor(0.525))
    # clip-higher 0.28 and c 2: l = -1.28, -0.5, 0.8, min(5, 2) = 2 -> 1.02 / 4 = 0.255
    loss, _ = spec.bind(clip_ratio_high=0.28, clip_ratio_c=2.0)(old, logp, adv, mask, LossNorm())
    close(loss.detach(), torch.tensor(0.255))
    with pytest.raises(ValueError) as err:
        policy_loss_spec("sapo").bind(tau_postive=1.0, clip_ratio_c=3.0)
    assert str(err.value) == ("policy loss 'sapo' has no hyper-parameter ['clip_ratio_c', 'tau_postive']; valid: "
                              "['follow_loss_agg_mode', 'tau_neg', 'tau_pos'].")


def test_clipped_surrogate_hand():
    # r = 1.5, 0.5, 0.5, 5 ; A = +1, +1, -1, -1 ; eps 0.2 / 0.28 ; c = 3
    # max(-A r, -A clip(r, 0.8, 1.28)) = max(-1.5, -1.28), max(-0.5, -0.8), max(0.5, 0.8), max(5, 1.28)
    #                                  = -1.28 (clipped), -0.5, 0.8 (clipped), 5 -> dual-clip min(5, 3) = 3
    ratio, adv = torch.tensor([1.5, 0.5, 0.5, 5.0]), torch.tensor([1.0, 1.0, -1.0, -1.0])
    pg = clipped_surrogate(adv, ratio, 0.2, 0.28, 3.0)
    close(pg.loss, torch.tensor([-1.28, -0.5, 0.8, 3.0]))
    assert pg.clipped.tolist() == [True, False, True, False] and pg.dual_clipped.tolist() == [False] * 3 + [True]
    close(clipped_surrogate(adv, ratio, 0.2, 0.28).loss, torch.tensor([-1.28, -0.5, 0.8, 5.0]))  # no dual-clip


def test_legacy_loss_works_through_the_adapter():
    seen = {}
    try:
        @register_policy_loss("legacy_loss")
        def legacy_loss(old_logprobs, logprobs, advantages, response_mask, *, loss_agg_mode="token-mean",
                        num_tokens=None, num_seqs=None, norm_constant=None, my_coef: float = 2.0, **unused):
            seen.update(loss_agg_mode=loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                        norm_constant=norm_constant, my_coef=my_coef, unused=unused)
            return my_coef * agg_loss(-advantages * logprobs, response_mask, loss_agg_mode, num_tokens=num_tokens,
                                      num_seqs=num_seqs, norm_constant=norm_constant), {}

        spec = policy_loss_spec("legacy_loss")
        # Its own scalar, and the clip fields the trainer always offered (it swallows them in **unused).
        clips = {"clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": None}
        assert dict(spec.hyperparameters) == {"my_coef": 2.0, **clips} and spec.uses_old_logprobs
        logp = torch.tensor([[-1.0, -2.0]])
        norm = LossNorm("seq-mean-token-sum", num_tokens=7.0, num_seqs=4.0, constant=5.0)
        loss, _ = spec.bind(my_coef=3.0)(logp, logp, torch.ones(1, 2), torch.ones(1, 2), norm)
        # 3 * (1 + 2) / 4 seqs = 2.25 ; the LossNorm's fields arrive as the four keywords, nothing else in **unused
        close(loss, torch.tensor(2.25))
        assert seen == dict(loss_agg_mode="seq-mean-token-sum", num_tokens=7.0, num_seqs=4.0, norm_constant=5.0,
                            my_coef=3.0, unused={})
        spec.bind(my_coef=None)(logp, logp, torch.ones(1, 2), torch.ones(1, 2), norm)
        assert seen["my_coef"] == 2.0  # None: its own default
        with pytest.raises(ValueError, match=r"no hyper-parameter \['my_cof'\]; valid: \['clip_ratio_c', "
                                             r"'clip_ratio_high', 'clip_ratio_low', 'my_coef'\]"):
            spec.bind(my_cof=1.0)
        assert _config(policy_loss="legacy_loss", policy_loss_kwargs={"my_coef": 1.0}).policy_loss == "legacy_loss"
        with pytest.raises(ValueError, match=r"\['my_cof'\] are not keywords of policy_loss='legacy_loss'"):
            _config(policy_loss="legacy_loss", policy_loss_kwargs={"my_cof": 1.0})
    finally:
        POLICY_LOSSES.pop("legacy_loss", None)


def test_new_style_user_loss_and_registration_checks():
    try:
        @register_policy_loss("scaled_pg", hyperparameters={"scale": 1.0}, uses_old_logprobs=False)
        def scaled_pg(old_logprobs, logprobs, advantages, response_mask, norm=LossNorm(), *, scale=1.0):
            return scale * agg_loss(-advantages * logprobs, response_mask, norm), {}

        spec = policy_loss_spec("scaled_pg")
        loss, _ = spec.bind(scale=2.0)(None, torch.tensor([[-1.0, -3.0]]), torch.ones(1, 2), torch.ones(1, 2),
                                       LossNorm())
        close(loss, torch.tensor(4.0))  # 2 * (1 + 3) / 2 tokens
        assert not spec.uses_old_logprobs
        with pytest.raises(ValueError, match="defaults to 0.5 but .* defaults it to 1.0; make them agree"):
            register_policy_loss("bad_default", hyperparameters={"scale": 0.5})(scaled_pg)
        with pytest.raises(ValueError, match="declares hyper-parameter 'shift' but .* has no keyword parameter"):
            register_policy_loss("bad_name", hyperparameters={"shift": 0.0})(scaled_pg)
    finally:
        POLICY_LOSSES.pop("scaled_pg", None)


def test_ppo_epochs_warning_uses_the_spec(caplog):
    with caplog.at_level(logging.WARNING, logger="verl_hf.config"):
        _config(policy_loss="gpg", ppo_epochs=2)
        _config(policy_loss="sapo", ppo_epochs=2)
    warned = [r.getMessage() for r in caplog.records if "ignores old log-probs" in r.getMessage()]
    assert len(warned) == 1 and "policy_loss='gpg'" in warned[0]


# ----------------------------------------------------------------------------- LossNorm and agg_loss


def test_loss_norm_is_validated_frozen_and_accepted_everywhere():
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'; valid: token-mean, seq-mean-token-sum"):
        LossNorm("mean")
    with pytest.raises(AttributeError):
        LossNorm().mode = "seq-mean-token-sum"
    loss, mask = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([[1, 1, 0], [1, 0, 0]])
    # seq-mean-token-sum-norm: (1 + 2 + 4) / (seqs 4 * L 7) = 0.25, in all three spellings
    new = agg_loss(loss, mask, LossNorm("seq-mean-token-sum-norm", num_seqs=4, constant=7))
    old = agg_loss(loss, mask, "seq-mean-token-sum-norm", num_seqs=4, norm_constant=7)
    keyword = agg_loss(loss, mask, loss_agg_mode="seq-mean-token-sum-norm", num_seqs=4, norm_constant=7)
    close(new, torch.tensor(0.25))
    close(old, new)
    close(keyword, new)
    values, old_values, returns = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.5, 3.0]]), torch.tensor([[2.0, 3.0]])
    # l = 0.5 max((1 - 2)^2, (0.7 - 2)^2) = 0.845 and 0 ; seq-mean-token-sum over 1 seq = 0.845
    a, _ = value_loss(values, old_values, returns, torch.ones(1, 2), cliprange_value=0.2,
                      norm=LossNorm("seq-mean-token-sum"))
    b, _ = value_loss(values, old_values, returns, torch.ones(1, 2), cliprange_value=0.2,
                      loss_agg_mode="seq-mean-token-sum")
    close(a, torch.tensor(0.845))
    close(b, a)


LOSS3 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK3 = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])  # row 1 has no valid token (e.g. an unscored row)


@pytest.mark.parametrize(
    "mode, verl, ours",
    [
        ("token-mean", 10 / 3, 10 / 3),  # (1 + 2 + 7) / 3 tokens either way
        ("seq-mean-token-sum", 5.0, 10 / 3),  # (3 + 7) / 2 seqs with a token ; / 3 rows
        ("seq-mean-token-mean", 4.25, 8.5 / 3),  # (1.5 + 7) / 2 ; / 3
        ("seq-mean-token-sum-norm", 10 / 6, 10 / 9),  # 10 / (2 * L 3) ; / (3 * 3)
    ],
)
def test_seq_mean_leaves_empty_rows_out_by_default(mode, verl, ours):
    # verl 0.9.1 agg_loss: seq_mask = (sum(loss_mask, -1) > 0), global_batch_size = seq_mask.sum()
    close(agg_loss(LOSS3, MASK3, LossNorm(mode)), torch.tensor(verl))
    close(agg_loss(LOSS3, MASK3, LossNorm(mode, count_empty_rows=True)), torch.tensor(ours))
    # a given step count wins over both rules
    close(agg_loss(LOSS3, MASK3, LossNorm(mode, num_seqs=5, count_empty_rows=True)),
          agg_loss(LOSS3, MASK3, LossNorm(mode, num_seqs=5)))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_seq_count_rule_keeps_micro_batches_exact(mode):
    # the step's count under either rule (3 rows with a token, or 4 rows) makes micro-batch sums exact
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(4, 5, generator=g)
    mask = (torch.arange(5) < torch.tensor([5, 1, 0, 3])[:, None]).float()
    for count_empty, n_seqs in ((False, 3), (True, 4)):
        full = agg_loss(loss, mask, LossNorm(mode, count_empty_rows=count_empty))
        step = LossNorm(mode, num_tokens=mask.sum(), num_seqs=n_seqs, count_empty_rows=count_empty)
        close(sum(agg_loss(loss[i:i + 2], mask[i:i + 2], step) for i in (0, 2)), full)


# ----------------------------------------------------------------------------- sapo and geo_mean options


def test_sapo_aggregates_seq_mean_token_mean_unless_told():
    # on-policy (r = 1): gate 2/tau -> l = -2 A (tau_pos = 1) for A = +1 ; rows of 2 and 1 valid tokens
    # default (verl): mean(-2, -2) and mean(-2) -> (-2 - 2) / 2 seqs = -2 in every mode
    # follow_loss_agg_mode=True with seq-mean-token-sum: (-4 - 2) / 2 = -3 ; token-mean: -6 / 3 = -2
    logp, adv, mask = torch.zeros(2, 2), torch.ones(2, 2), torch.tensor([[1, 1], [1, 0]])
    for mode in LOSS_AGG_MODES:
        close(pl.sapo_loss(logp, logp, adv, mask, mode)[0], torch.tensor(-2.0))
    close(pl.sapo_loss(logp, logp, adv, mask, "seq-mean-token-sum", follow_loss_agg_mode=True)[0], torch.tensor(-3.0))
    # the step's sequence count is kept: 4 seqs -> (-2 - 2) / 4 = -1
    close(pl.sapo_loss(logp, logp, adv, mask, LossNorm(num_seqs=4))[0], torch.tensor(-1.0))


def _geo_example():
    # old = 0, so logp is the log-ratio; clip 0.4 / 0.4 in log space
    # row 0: A_t = 2, -1 (A_i = 0.5), lr 0.6, -0.6 ; row 1: A_t = 1, 0 (A_i = 0.5), lr 0.2, 0.3
    logp = torch.tensor([[0.6, -0.6], [0.2, 0.3]], requires_grad=True)
    return torch.zeros(2, 2), logp, torch.tensor([[2.0, -1.0], [1.0, 0.0]]), torch.ones(2, 2)


def test_geo_mean_clip_direction_token_is_verl():
    old, logp, adv, mask = _geo_example()
    loss, m = pl.geo_mean_loss(old, logp, adv, mask)
    # token (verl: sgn(A_t) min(sgn lr, sgn clip(lr))): row 0 c = min(0.6, 0.4) = 0.4, max(-0.6, -0.4) = -0.4
    #   -> mean 0 -> ratio 1 -> l0 = -0.5 ; row 1 c = min(0.2, 0.2) = 0.2, A_t = 0 -> 0 -> mean 0.1
    #   -> e^0.1 = 1.105171 -> l1 = -0.552585 ; loss (-0.5 - 0.552585) / 2 = -0.526293
    close(loss.detach(), torch.tensor((-0.5 - 0.5 * math.exp(0.1)) / 2))
    # gradient: row 0 both clipped -> 0 ; row 1 t0: -A_i e^0.1 / 2 tokens / 2 seqs = -0.138146, t1 (A_t = 0) -> 0
    (g,) = torch.autograd.grad(loss, logp)
    close(g, torch.tensor([[0.0, 0.0], [-0.5 * math.exp(0.1) / 4, 0.0]]))
    assert m["clip_frac"] == pytest.approx(2 / 4)  # row 0's two tokens


def test_geo_mean_clip_direction_sequence_is_the_option():
    old, logp, adv, mask = _geo_example()
    loss, m = pl.geo_mean_loss(old, logp, adv, mask, clip_direction="sequence")
    # sequence (A_i = 0.5 > 0 -> min on every token): row 0 c = 0.4, min(-0.6, -0.4) = -0.6 -> mean -0.1
    #   -> e^-0.1 = 0.904837 -> l0 = -0.452419 ; row 1 c = 0.2, 0.3 -> mean 0.25 -> e^0.25 = 1.284025
    #   -> l1 = -0.642013 ; loss (-0.452419 - 0.642013) / 2 = -0.547216
    close(loss.detach(), torch.tensor((-0.5 * math.exp(-0.1) - 0.5 * math.exp(0.25)) / 2))
    # gradient -A_i ratio_i / 2 tokens / 2 seqs on unclipped tokens: row 0 t1 -0.113105 ; row 1 -0.160503 each
    (g,) = torch.autograd.grad(loss, logp)
    close(g, torch.tensor([[0.0, -0.5 * math.exp(-0.1) / 4], [-0.5 * math.exp(0.25) / 4] * 2]))
    assert m["clip_frac"] == pytest.approx(1 / 4)  # row 0 t0
    with pytest.raises(ValueError, match="clip_direction='seq' is unknown; valid: token, sequence"):
        pl.geo_mean_loss(old, logp, adv, mask, clip_direction="seq")


def test_geo_mean_sequence_count_follows_the_norm():
    # row 1 empty: l = (-A_0 e^0) = -1 on row 0 ; verl's rule divides by 1 seq with a token, count_empty_rows by 2
    old, logp, adv, mask = torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), torch.tensor([[1, 1], [0, 0]])
    close(pl.geo_mean_loss(old, logp, adv, mask)[0], torch.tensor(-1.0))
    close(pl.geo_mean_loss(old, logp, adv, mask, LossNorm(count_empty_rows=True))[0], torch.tensor(-0.5))


# ----------------------------------------------------------------------------- group helpers


def test_group_stats_hand():
    # group 4 = rows 0, 2, 3 (scores 1, 0, 2) ; group -1 = row 1 (singleton, 5) ; row 3 invalid in the second call
    scores, ids = torch.tensor([1.0, 5.0, 0.0, 2.0]), torch.tensor([4, -1, 4, 4])
    stats = group_stats(scores, ids)
    # group 4: n 3, sum 3, mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1 ; singleton: n 1, mean 5, std 0
    close(stats.count, torch.tensor([3.0, 1.0, 3.0, 3.0]))
    close(stats.total, torch.tensor([3.0, 5.0, 3.0, 3.0]))
    close(stats.mean, torch.tensor([1.0, 5.0, 1.0, 1.0]))
    close(stats.std, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    # without row 3: group 4 scores 1, 0 -> n 2, mean 0.5, std sqrt(0.5) (row 3 still reads its group's values)
    stats = group_stats(scores, ids, torch.tensor([True, True, True, False]))
    close(stats.count, torch.tensor([2.0, 1.0, 2.0, 2.0]))
    close(stats.mean, torch.tensor([0.5, 5.0, 0.5, 0.5]))
    close(stats.std, torch.tensor([0.5 ** 0.5, 0.0, 0.5 ** 0.5, 0.5 ** 0.5]))


def test_group_all_equal_hand():
    # group 0: 1, 1, 0 -> differ ; group 1: 0.1 x3 (equal, though their fp32 mean is not 0.1) ; group 2: 3
    # (one row) ; group 3: 2, 7 with 7 unscored -> one valid row -> equal ; group 5: no valid row -> equal
    scores = torch.tensor([1.0, 1.0, 0.0, 0.1, 0.1, 0.1, 3.0, 2.0, 7.0, 4.0, 5.0])
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 3, 3, 5, 5])
    valid = torch.tensor([True] * 8 + [False, False, False])
    assert group_all_equal(scores, ids).tolist() == [False] * 3 + [True] * 4 + [False, False, False, False]
    assert group_all_equal(scores, ids, valid).tolist() == [False] * 3 + [True] * 8
    assert group_all_equal(torch.zeros(0), torch.zeros(0, dtype=torch.long)).tolist() == []


def test_group_all_equal_matches_a_loop_over_groups():
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        ids = torch.randint(0, 5, (12,), generator=g)
        scores = torch.randint(0, 3, (12,), generator=g).float()
        valid = torch.rand(12, generator=g) > 0.3
        expected = []
        for i in range(12):
            members = {float(scores[j]) for j in range(12) if ids[j] == ids[i] and valid[j]}
            expected.append(len(members) < 2)
        assert group_all_equal(scores, ids, valid).tolist() == expected


def test_legacy_loss_keeps_getting_the_clip_fields():
    """The trainer always offered clip_ratio_c (and the ratios when set) to every loss: a pre-LossNorm loss that
    names them, even as plain parameters, or swallows them in **unused, still gets the configured values."""
    got = {}
    try:
        @register_policy_loss("legacy_clips")
        def legacy_clips(old, new, adv, mask, loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2,
                         **unused):
            got.update(low=clip_ratio_low, high=clip_ratio_high, c=unused.get("clip_ratio_c"))
            return torch.zeros(()), {}

        spec = policy_loss_spec("legacy_clips")
        ones = torch.ones(1, 2)
        spec.bind(clip_ratio_low=0.1, clip_ratio_high=0.28, clip_ratio_c=3.0)(ones, ones, ones, ones, LossNorm())
        assert got == {"low": 0.1, "high": 0.28, "c": 3.0}
        spec.bind(clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0)(ones, ones, ones, ones, LossNorm())
        assert got == {"low": 0.2, "high": 0.2, "c": 3.0}  # unset ratios: the loss's own defaults
    finally:
        POLICY_LOSSES.pop("legacy_clips", None)


def test_builtin_losses_still_take_the_former_norm_keywords():
    old = torch.zeros(2, 3)
    new = torch.zeros(2, 3)
    adv = torch.ones(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # ratio 1, A = 1: token loss -1 on 3 valid tokens; seq-mean-token-sum over 2 rows -> -3 / 2
    loss, _ = ppo_clip_loss(old, new, adv, mask, loss_agg_mode="seq-mean-token-sum")
    close(loss, torch.tensor(-1.5))
    loss, _ = ppo_clip_loss(old, new, adv, mask, num_tokens=6.0)  # token-mean over a step of 6 tokens
    close(loss, torch.tensor(-0.5))
    with pytest.raises(TypeError):
        ppo_clip_loss(old, new, adv, mask, clip_ratio_lo=0.1)  # a typo is not swallowed


def test_estimator_without_kwargs_gets_only_its_inputs_and_overrides_keep_flags():
    try:
        @register_advantage("plain_inputs", needs_groups=True)
        def plain_inputs(token_level_rewards, response_mask, group_ids, norm_by_std=True):
            return token_level_rewards * norm_by_std, response_mask

        adv, _ = advantage_spec("plain_inputs")(token_level_rewards=torch.ones(1, 2), response_mask=torch.ones(1, 2),
                                                group_ids=torch.tensor([0]), norm_by_std=True, gamma=1.0,
                                                singleton_advantage="score", values=None)
        close(adv, torch.ones(1, 2))
        register_advantage("gae", override=True)(ADVANTAGE_ESTIMATORS["gae"])  # e.g. a patched GAE
        assert advantage_spec("gae").needs_values and advantage_spec("gae").display_name == "PPO"
    finally:
        ADVANTAGE_ESTIMATORS.pop("plain_inputs", None)


def test_a_loss_declaring_hyperparameters_must_take_norm_and_unhashable_estimators_work():
    with pytest.raises(ValueError, match="takes no `norm`"):
        @register_policy_loss("no_norm", hyperparameters={"coef": 1.0})
        def no_norm(old_logprobs, logprobs, advantages, response_mask, *, coef=1.0):
            return logprobs.sum(), {}
    assert "no_norm" not in POLICY_LOSSES

    class Estimator:  # a callable object that cannot be hashed
        __hash__ = None

        def __call__(self, token_level_rewards, response_mask, **unused):
            return token_level_rewards, token_level_rewards

    try:
        register_advantage("callable_object")(Estimator())
        adv, _ = advantage_spec("callable_object")(token_level_rewards=torch.ones(1, 2), response_mask=torch.ones(1, 2))
        close(adv, torch.ones(1, 2))
    finally:
        ADVANTAGE_ESTIMATORS.pop("callable_object", None)


def test_a_step_count_below_one_is_kept():
    # Two processes, one valid token in the whole step: each process divides by 1 / 2, so the averaged
    # gradient is the global token mean (the token's loss, -1 here), not half of it.
    loss = agg_loss(-torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), LossNorm("token-mean", num_tokens=0.5))
    close(loss, torch.tensor(-2.0))
    close(agg_loss(torch.ones(1, 2), torch.zeros(1, 2), LossNorm("token-mean", num_tokens=0.0)), torch.tensor(0.0))
