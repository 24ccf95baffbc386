"""Safe-RLHF in VerlTrainer: costs, the Lagrange multiplier across steps, the cost critic, the safety filter."""

import json
import math

import pytest

from conftest import small_config
from verl_hf import VerlConfig, VerlTrainer
from verl_hf.algorithms import lagrange_multiplier_step


# Cost 1 for a response that contains the digit 7, else 0: the mean cost is the unsafe rate.
SEVEN = "examples/safe_rlhf/task.py:forbidden_digit"


def _logs(trainer):
    return [h for h in trainer.state.log_history if "safety/lambda" in h]


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_lambda_follows_the_windowed_cost_each_step(tmp_path, warm_start_dir, addition, estimator):
    """logging every step: each step's lambda is one multiplier step from the previous one on the logged
    window mean (hand formula); under PPO a cost critic trains beside the reward critic."""
    args = small_config(tmp_path, adv_estimator=estimator, max_steps=3, cost_funcs=[SEVEN],
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
    args = small_config(tmp_path, max_steps=3, cost_funcs=[SEVEN], cost_limit=-1.0,
                        lambda_init=1.0, lambda_lr=1.0, lambda_max=2.0, lambda_update_delay_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    trainer.train()
    lambdas = [log["safety/lambda"] for log in _logs(trainer)]
    assert lambdas[0] == 1.0  # step 0 < delay: unchanged
    assert lambdas[1] == pytest.approx(2.0) and lambdas[2] == pytest.approx(2.0)  # cost above limit: capped


def test_safety_filter_and_eval_metrics_and_checkpoint(tmp_path, warm_start_dir, addition):
    train, test = addition
    args = small_config(tmp_path, max_steps=2, cost_funcs=[SEVEN],
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
    with pytest.raises(ValueError, match="safety_filter_threshold=.* takes effect only when cost_funcs or cost_model_path"):
        VerlConfig(**base, safety_filter_threshold=0.5)
    with pytest.raises(ValueError, match="lambda_init=0.0 must be > 0"):
        VerlConfig(**base, cost_funcs=["length"], lambda_init=0.0)
    with pytest.raises(ValueError, match="lambda_max=0.5 must be >= lambda_init"):
        VerlConfig(**base, cost_funcs=["length"], lambda_max=0.5)
    with pytest.raises(ValueError, match="ReMax's baseline is the greedy response's reward"):
        VerlConfig(**base, cost_funcs=["length"], adv_estimator="remax", num_generations=2)
    with pytest.raises(ValueError, match="set use_kl_in_reward=False"):
        VerlConfig(**base, cost_funcs=["length"], use_kl_in_reward=True, kl_coef=0.01)
    with pytest.raises(ValueError, match="cost_model_label_index=.* takes effect only when cost_model_path is set"):
        VerlConfig(**base, cost_model_label_index=1)


def test_costs_may_judge_only_some_batches_and_failures_stop(tmp_path, warm_start_dir, addition):
    """A cost function that returns None for a whole round is fine (cost 0); one that raises stops training
    even with reward_on_error='zero' (a failed safety check must not count as safe)."""
    args = small_config(tmp_path, max_steps=1, cost_funcs=["tests/cost_functions.py:judges_nothing"])
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    trainer.train()
    assert _logs(trainer)[0]["cost/mean"] == 0.0
    args = small_config(tmp_path, max_steps=1, cost_funcs=["tests/cost_functions.py:always_fails"],
                        reward_on_error="zero")
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    with pytest.raises(RuntimeError, match="reward function 'always_fails' raised on sample 0"):
        trainer.train()


def test_cost_model_from_a_path(tmp_path, warm_start_dir, addition, tokenizer):
    """A score model as the cost (cost_model_path): its scores are the costs the multiplier sees."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(123)  # not the run's seed: its head must differ from a fresh one
    path = tmp_path / "cost_model"
    AutoModelForSequenceClassification.from_pretrained(warm_start_dir, num_labels=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    args = small_config(tmp_path, max_steps=1, cost_model_path=str(path))
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    assert [name for name, _ in trainer.safety.cost_funcs] == ["cost_model"]
    # Under PPO the cost critic starts from the cost model (its backbone and scoring head), as in Safe-RLHF.
    ppo = VerlTrainer(model=warm_start_dir, train_dataset=addition[0], args=small_config(
        tmp_path / "ppo", max_steps=1, cost_model_path=str(path), adv_estimator="gae", num_generations=1))
    cost_model = dict(ppo.safety.cost_funcs[0][1].model.named_parameters())
    critic = dict(ppo.safety.cost_critic.model.named_parameters())
    assert torch.equal(critic["score.weight"], cost_model["score.weight"])
    assert not torch.equal(critic["score.weight"], dict(ppo.critic.model.named_parameters())["score.weight"])
    trainer.train()
    log = _logs(trainer)[0]
    assert log["cost/cost_model/mean"] == pytest.approx(log["cost/mean"])
    assert log["safety/episode_cost"] == pytest.approx(log["cost/mean"], abs=1e-6)


def test_two_processes_keep_the_same_lambda(tmp_path):
    """`accelerate launch`, 2 DDP processes: each adds both processes' costs to its window, so the multiplier
    moves identically on both without being sent."""
    from test_distributed import MODES, _run, _two_processes

    out = tmp_path / "run"
    _run(tmp_path, _two_processes(MODES["ddp"]), out,
         ["--max_steps", "3", "--eval_steps", "3", "--per_device_train_batch_size", "32", "--use_cpu", "false",
          "--cost_funcs", SEVEN, "--cost_limit", "0.05", "--lambda_lr", "0.5"],
         {"ACCELERATE_USE_CPU": "true"})
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["lagrange_lambda"] == ranks[1]["lagrange_lambda"] != 1.0


def test_dynamic_sampling_keeps_groups_whose_costs_differ():
    """A group with equal rewards but different costs still has cost advantages: dynamic sampling keeps it."""
    import torch

    from types import SimpleNamespace

    from verl_hf.batch import RolloutBatch
    from verl_hf.round import split_informative
    from verl_hf.safety import NoConstraint, SafetyConstraint

    safety = SafetyConstraint([], SimpleNamespace(lambda_init=1.0, episode_cost_window_size=8))

    rows = 6
    batch = RolloutBatch(prompt_ids=torch.ones(rows, 2, dtype=torch.long), prompt_mask=torch.ones(rows, 2),
                         response_ids=torch.ones(rows, 3, dtype=torch.long), response_mask=torch.ones(rows, 3),
                         group_ids=torch.tensor([0, 0, 1, 1, 2, 2]), truncated=torch.zeros(rows, dtype=torch.bool),
                         rewards=torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0]))
    kept, flat = split_informative(batch, NoConstraint())
    assert kept.group_ids.tolist() == [2, 2]
    batch.costs = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    kept, flat = split_informative(batch, safety)
    assert kept.group_ids.tolist() == [1, 1, 2, 2] and flat.group_ids.tolist() == [0, 0]


def test_dynamic_sampling_keeps_a_group_left_with_one_scored_row_under_verls_singleton_rule():
    """Group 0's second row is unscored: one scored row is left, whose advantage is its score under
    singleton_group_advantage="score" (verl), so the group informs; with "zero" it carries nothing."""
    import torch

    from verl_hf.batch import RolloutBatch
    from verl_hf.round import split_informative
    from verl_hf.safety import NoConstraint

    batch = RolloutBatch(prompt_ids=torch.ones(4, 2, dtype=torch.long), prompt_mask=torch.ones(4, 2),
                         response_ids=torch.ones(4, 3, dtype=torch.long), response_mask=torch.ones(4, 3),
                         group_ids=torch.tensor([0, 0, 1, 1]), truncated=torch.zeros(4, dtype=torch.bool),
                         rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), valid=torch.tensor([True, False, True, True]))
    kept, flat = split_informative(batch, NoConstraint(), singleton_informs=True)
    assert kept.group_ids.tolist() == [0, 0] and flat.group_ids.tolist() == [1, 1]
    kept, flat = split_informative(batch, NoConstraint(), singleton_informs=False)
    assert kept.group_ids.tolist() == [] and flat.group_ids.tolist() == [0, 0, 1, 1]
