"""TRL's names beside ours for the metrics both report (verl_hf/metric_names.py), and the metrics added for them."""

import pytest

from verl_hf.metric_names import trl_name, with_trl_names


@pytest.mark.parametrize("ours, trls", [
    ("reward/mean", "reward"), ("reward/std", "reward_std"), ("reward/frac_zero_std", "frac_reward_zero_std"),
    ("reward/correct/mean", "rewards/correct/mean"), ("reward/correct/std", "rewards/correct/std"),
    ("response_length/mean", "completions/mean_length"), ("response_length/truncated_frac", "completions/clipped_ratio"),
    ("actor/entropy", "entropy"), ("actor/clip_frac", "clip_ratio/region_mean"),
    ("actor/clip_frac_below", "clip_ratio/low_mean"), ("actor/clip_frac_above", "clip_ratio/high_mean"),
    ("eval_reward/correct", "eval_rewards/correct/mean"), ("eval_response_length", "eval_completions/mean_length"),
])
def test_trls_name_for_ours(ours, trls):
    assert trl_name(ours) == trls


@pytest.mark.parametrize("ours", ["kl", "loss", "grad_norm", "reward/turns/mean", "reward/correct/errors",
                                  "rollout_is/mismatch_k1", "time/rollout", "actor/clip_frac_lower"])
def test_metrics_trl_names_alike_or_lacks_get_no_copy(ours):
    assert trl_name(ours) is None


def test_ours_stay_and_trls_come_beside():
    logs = {"reward/mean": 0.5, "reward/f/mean": 0.25, "kl": 0.1, "reward": 9.0}
    assert with_trl_names(logs) == {**logs, "rewards/f/mean": 0.25}  # a key already there is not overwritten


def test_a_trainer_logs_both_names_and_only_ours_when_asked(tmp_path):
    from conftest import small_config
    from verl_hf import VerlTrainer
    from verl_hf.demo import WARM_START_DIR
    from verl_hf.demo.task import make_addition_dataset

    data = make_addition_dataset(64, seed=0)
    for on in (True, False):
        args = small_config(tmp_path / str(on), max_steps=1, per_device_train_batch_size=8, trl_metric_names=on)
        trainer = VerlTrainer(model=str(WARM_START_DIR), args=args, train_dataset=data)
        trainer.train()
        logs = next(h for h in trainer.state.log_history if "reward/mean" in h)
        trl = ("reward", "reward_std", "frac_reward_zero_std", "rewards/gsm8k/mean", "completions/mean_length",
               "completions/min_length", "entropy", "clip_ratio/region_mean", "clip_ratio/low_mean")
        assert all((name in logs) == on for name in trl), logs
        assert logs["reward/frac_zero_std"] in [i / 2 for i in range(3)]  # 2 groups of 4
        if on:
            assert logs["reward"] == logs["reward/mean"] and logs["entropy"] == logs["actor/entropy"]
