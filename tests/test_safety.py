"""Safe-RLHF in VerlTrainer: costs, the Lagrange multiplier across steps, the cost critic, the safety filter."""

import json
import math

import pytest

from conftest import small_config
from verl_hf import VerlConfig, VerlTrainer
from verl_hf.algorithms import lagrange_multiplier_step


def has_seven(prompts, completions, completion_ids, **columns):
    """Cost 1 for a response that contains the digit 7, else 0: the mean cost is the unsafe rate."""
    return [1.0 if "7" in text else 0.0 for text in completions]


def _logs(trainer):
    return [h for h in trainer.state.log_history if "safety/lambda" in h]


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_lambda_follows_the_windowed_cost_each_step(tmp_path, warm_start_dir, addition, estimator):
    """logging every step: each step's lambda is one multiplier step from the previous one on the logged
    window mean (hand formula); under PPO a cost critic trains beside the reward critic."""
    args = small_config(tmp_path, adv_estimator=estimator, max_steps=3, cost_funcs=["tests/test_safety.py:has_seven"],
                        cost_limit=0.05, lambda_init=0.5, lambda_lr=0.5, episode_cost_window_size=1000)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    assert (trainer.safety.cost_critic is not None) == (estimator == "gae")
    trainer.train()
    logs = _logs(trainer)
    assert len(logs) == 3
    log_lambda = math.log(0.5)
    for log in logs:
        log_lambda = lagrange_multiplier_step(log_lambda, log["safety/episode_cost"], 0.05, 0.5)
        assert log["safety/lambda"] == pytest.approx(math.exp(log_lambda), rel=1e-6)
        assert 0 <= log["cost/unsafe_rate"] <= 1 and log["cost/mean"] == pytest.approx(log["cost/unsafe_rate"])
    # The first window holds exactly the first round's costs.
    assert logs[0]["safety/episode_cost"] == pytest.approx(logs[0]["cost/mean"])
    if estimator == "gae":
        assert all(math.isfinite(log["cost_critic/value_loss"]) for log in logs)


def test_lambda_waits_for_its_delay_and_respects_its_cap(tmp_path, warm_start_dir, addition):
    args = small_config(tmp_path, max_steps=3, cost_funcs=["tests/test_safety.py:has_seven"], cost_limit=-1.0,
                        lambda_init=1.0, lambda_lr=1.0, lambda_max=2.0, lambda_update_delay_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    trainer.train()
    lambdas = [log["safety/lambda"] for log in _logs(trainer)]
    assert lambdas[0] == 1.0  # step 0 < delay: unchanged
    assert lambdas[1] == pytest.approx(2.0) and lambdas[2] == pytest.approx(2.0)  # cost above limit: capped


def test_safety_filter_and_eval_metrics_and_checkpoint(tmp_path, warm_start_dir, addition):
    train, test = addition
    args = small_config(tmp_path, max_steps=2, cost_funcs=["tests/test_safety.py:has_seven"],
                        safety_filter_threshold=0.5, save_strategy="steps", save_steps=2)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=train, eval_dataset=test)
    trainer.train()
    logs = _logs(trainer)
    assert all(log["safety/filtered_frac"] == pytest.approx(log["cost/unsafe_rate"]) for log in logs)
    metrics = trainer.evaluate()
    assert 0 <= metrics["eval_unsafe_rate"] <= 1 and metrics["eval_cost"] == pytest.approx(metrics["eval_unsafe_rate"])
    saved = json.loads((tmp_path / "out" / "checkpoint-2" / "safety.json").read_text())
    assert saved["log_lambda"] == pytest.approx(math.log(logs[-1]["safety/lambda"]))
    assert len(saved["window"]) == 2 * 32


def test_safety_config_errors(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True)
    with pytest.raises(ValueError, match="safety_filter_threshold needs costs"):
        VerlConfig(**base, safety_filter_threshold=0.5)
    with pytest.raises(ValueError, match="lambda_init=0.0 must be > 0"):
        VerlConfig(**base, cost_funcs=["length"], lambda_init=0.0)
    with pytest.raises(ValueError, match="lambda_max=0.5 must be >= lambda_init"):
        VerlConfig(**base, cost_funcs=["length"], lambda_max=0.5)
    with pytest.raises(ValueError, match="ReMax's baseline is the greedy response's reward"):
        VerlConfig(**base, cost_funcs=["length"], adv_estimator="remax", num_generations=2)
