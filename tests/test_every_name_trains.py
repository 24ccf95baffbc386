"""Every registered estimator and loss is reachable from VerlConfig by name and runs a real training step."""

import math

import pytest

from conftest import small_config
from verl_hf import VerlTrainer
from verl_hf.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, advantage_spec

# Estimators that need one response per prompt in their usual setting still accept groups; gae brings a critic.
ONE_SAMPLE = {"remax", "gae", "reinforce_plus_plus"}


def _one_step(tmp_path, warm_start_dir, train, **overrides):
    args = small_config(tmp_path, max_steps=1, per_device_train_batch_size=16, **overrides)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=train)
    trainer.train()
    return trainer.state.log_history[0]


# mt_grpo needs an environment's turn rewards: it trains in tests/test_agent_loop.py (and is refused here).
@pytest.mark.parametrize("name", sorted(n for n in ADVANTAGE_ESTIMATORS if not advantage_spec(n).needs_turn_rewards))
def test_every_advantage_estimator(name, tmp_path, warm_start_dir, addition):
    log = _one_step(tmp_path, warm_start_dir, addition[0], adv_estimator=name,
                    num_generations=1 if name in ONE_SAMPLE else 4)
    assert math.isfinite(log["loss"]) and math.isfinite(log["advantages/abs_mean"])


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_policy_loss(name, tmp_path, warm_start_dir, addition):
    log = _one_step(tmp_path, warm_start_dir, addition[0], policy_loss=name, ppo_epochs=2)
    assert math.isfinite(log["loss"]) and math.isfinite(log["grad_norm"])
