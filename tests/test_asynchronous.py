"""Asynchronous training (max_staleness >= 1) for real: a `verl-hf vllm-serve` process samples the next rounds
while the trainer updates. The bound holds on every round with a deliberately slow trainer and a deliberately
slow producer, a failing producer stops the run with its own error and leaves no thread, and settings it cannot
serve yet are refused before anything loads."""

import threading
import time
from pathlib import Path

import pytest
from transformers import TrainerCallback

from conftest import small_config, vllm_server

WARM_START = str(Path(__file__).resolve().parents[1] / "verl_hf/demo/warm_start")
ASYNC = dict(rollout_engine="vllm_server", rollout_is="token", per_device_train_batch_size=16, logging_steps=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with vllm_server(WARM_START, tmp_path_factory.mktemp("server") / "server.log") as url:
        yield url


class SlowSteps(TrainerCallback):
    """A trainer slower than its producer: every optimizer step takes `seconds` more."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def slow_reward(completions, **kwargs):
    """A producer slower than its trainer: scoring takes 0.4 s a round."""
    time.sleep(0.4)
    return [float("####" in c) for c in completions]


def producers_alive() -> list:
    return [t for t in threading.enumerate() if t.name == "verl_hf-rollout-producer" and t.is_alive()]


def _train(tmp_path, server, addition, staleness: int, callbacks=(), **fields):
    from verl_hf import VerlTrainer

    args = small_config(tmp_path, **{**ASYNC, "vllm_server_url": server, "max_staleness": staleness, **fields})
    trainer = VerlTrainer(model=WARM_START, args=args, train_dataset=addition[0], callbacks=list(callbacks))
    trainer.train()
    return [h for h in trainer.state.log_history if "async/staleness_max" in h]


@pytest.mark.parametrize("staleness", [1, 2])
def test_a_slow_trainer_lets_the_producer_run_ahead_up_to_the_bound_and_no_further(server, tmp_path, addition,
                                                                                     staleness):
    steps = _train(tmp_path, server, addition, staleness, [SlowSteps(0.6)], max_steps=6)
    assert len(steps) == 6
    seen = [h["async/staleness_max"] for h in steps]
    assert max(seen) == staleness, seen  # ahead as far as allowed (the trainer is the slow side) ...
    assert all(s <= staleness for s in seen), seen  # ... and never further
    assert all(h["async/staleness_mean"] == h["async/staleness_max"] for h in steps)  # one version per round
    assert sum(h["async/producer_wait_s"] for h in steps) > 1.0  # it waited at the bound instead of sampling on
    # the server really sampled with older weights: only the first round's log-probs are the trainer's own
    gaps = [h["rollout_is/logprob_gap_max"] for h in steps]
    assert gaps[0] < 1e-3 and all(g > 1e-2 for g in gaps[1:]), gaps
    assert not producers_alive()


def test_a_slow_producer_makes_the_trainer_wait_and_stays_within_the_bound(server, tmp_path, addition):
    steps = _train(tmp_path, server, addition, 1, max_steps=5, reward_funcs=[slow_reward], reward_weights=[1.0])
    assert len(steps) == 5 and all(h["async/staleness_max"] <= 1 for h in steps)
    assert sum(h["async/trainer_wait_s"] for h in steps[1:]) > 0.5  # scoring, not training, set the pace
    assert all(h["sync/gigabytes"] > 0 for h in steps[1:])  # weights pushed while the producer was between rounds


def failing_reward(completions, **kwargs):
    failing_reward.calls += 1
    if failing_reward.calls == 3:
        raise ValueError("the reward service is down")
    return [0.0] * len(completions)


def test_a_failing_producer_stops_the_run_with_its_error_and_no_thread_survives(server, tmp_path, addition):
    failing_reward.calls = 0
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match="the rollout producer failed while sampling ahead") as caught:
        _train(tmp_path, server, addition, 1, max_steps=20, reward_funcs=[failing_reward], reward_weights=[1.0])
    assert "the reward service is down" in repr(caught.value.__cause__)
    assert time.perf_counter() - started < 60 and not producers_alive()


@pytest.mark.parametrize("fields, message", [
    (dict(rollout_engine="hf"), "takes effect only when rollout_engine='vllm_server'"),
    (dict(rollout_is=None), "set rollout_is='token'"),
    (dict(dynamic_sampling=True), "dynamic_sampling=True: its refills sample"),
    (dict(adv_estimator="remax"), "greedy baselines"),
    (dict(max_staleness=-1), "must be >= 0"),
    (dict(ppo_epochs=2), "rounds that feed 2 optimizer steps"),
    (dict(ignore_data_skip=True), "ignore_data_skip=True"),
    (dict(cost_funcs=["examples/safe_rlhf/task.py:forbidden_digit"], cost_limit=0.05), "cannot run with Safe-RLHF"),
    (dict(tools=["verl_hf.agent.tools:calculator"]), "cannot run with tools"),
    (dict(routing_replay=True), "routing_replay needs each token's experts"),
])
def test_settings_it_cannot_serve_are_refused_with_the_reason(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        small_config(tmp_path, **{**ASYNC, "vllm_server_url": "http://127.0.0.1:1", "max_staleness": 1, **fields})


def test_one_step_off_policy_grpo_learns_the_demo_task(server, tmp_path, addition):
    """150 GRPO steps with max_staleness=1 (every round after the first sampled by the weights one step behind,
    rollout_is='token' correcting for them) lift held-out greedy accuracy like the synchronous server test.
    Measured on an Intel Xeon with AMX: 0.27 -> 0.50 (+23 problems against the bar of +15; the synchronous test,
    tests/test_rollout_vllm_server.py, 0.27 -> 0.51). Not measured on an AMD EPYC yet."""
    from verl_hf import VerlTrainer

    from conftest import assert_learned

    train, test = addition
    args = small_config(tmp_path, **{**ASYNC, "vllm_server_url": server, "max_staleness": 1,
                                     "per_device_train_batch_size": 128, "max_steps": 150, "logging_steps": 25,
                                     "rollout_seed_per_prompt": True})
    trainer = VerlTrainer(model=WARM_START, args=args, train_dataset=train, eval_dataset=test)
    before = trainer.evaluate()["eval_accuracy"]
    trainer.train()
    after = trainer.evaluate()["eval_accuracy"]
    logs = [h for h in trainer.state.log_history if "async/staleness_max" in h]
    assert logs and all(h["async/staleness_max"] <= 1 for h in logs) and logs[-1]["async/staleness_mean"] > 0.5
    assert_learned(before, after, 0.15, problems=100)


def test_an_environment_is_refused_before_the_model_loads(tmp_path):
    from verl_hf import VerlTrainer

    class Environment:
        def reset(self, **row):
            return "start"

        def step(self, text):
            return "done", 0.0, True

    args = small_config(tmp_path, **{**ASYNC, "vllm_server_url": "http://127.0.0.1:1", "max_staleness": 1})
    with pytest.raises(ValueError, match="cannot run with multi-turn rollouts"):
        VerlTrainer(model=WARM_START, args=args, environment=Environment)
