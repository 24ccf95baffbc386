"""The named RL state between steps: each object's arithmetic and its state_dict round trip."""

import pytest
import torch

from verl_hf.state import KLMeter, MetricBuffer, RefillStream, RolloutSeeds, RoundInProgress


class _Controller:
    def __init__(self):
        self.updates = []

    def update(self, kl, n):
        self.updates.append((kl, n))


def test_kl_meter_token_weights_the_round_and_counts_its_samples_once():
    meter = KLMeter()
    meter.observe(2.0, 4.0, samples=8)   # micro-batch 1: KL sum 2 over 4 tokens
    meter.observe(1.0, 6.0, samples=8)   # micro-batch 2 (a second epoch would add again, samples stay 8)
    controller = _Controller()
    meter.update_controller(controller, "adaptive", reduce_sum=lambda t: t, device="cpu")
    assert controller.updates == [(pytest.approx(0.3), 8)]  # (2 + 1) / (4 + 6); 8 samples
    meter.update_controller(controller, "adaptive", reduce_sum=lambda t: t, device="cpu")  # nothing pending: no step
    assert len(controller.updates) == 1
    meter.observe(1.0, 1.0, samples=3)
    meter.update_controller(controller, "pid", reduce_sum=lambda t: 2 * t, device="cpu")  # two processes
    assert controller.updates[-1] == (pytest.approx(1.0), 1)  # PID: one update is one time step
    meter.observe(1.0, 1.0, samples=3)
    meter.update_controller(controller, "fixed", reduce_sum=lambda t: t, device="cpu")
    assert len(controller.updates) == 2 and meter.pending is None


def test_round_in_progress_walks_the_round_and_restarts_at_a_boundary():
    progress = RoundInProgress(micro_batches=["a", "b", "c", "d"])
    assert progress.starts_new(4)
    assert [progress.take_next(4) for _ in range(3)] == ["a", "b", "c"]
    assert not progress.starts_new(4) and progress.last_taken(4) == "c"
    progress.restart_at_boundary(4)
    assert progress.micro_step == 4 and progress.micro_batches == [] and progress.starts_new(4)
    progress.needs_position = True
    progress.place(global_step=3, gradient_accumulation_steps=2, micro_steps_per_round=4)  # 6 micro-steps done
    assert progress.micro_step == 2 and not progress.needs_position
    copy = RoundInProgress()
    copy.load_state_dict(progress.state_dict())
    assert copy == progress


def test_refill_stream_and_seeds_continue_after_a_round_trip():
    stream, seeds = RefillStream(), RolloutSeeds()
    first = stream.take(3, dataset_size=5, seed=1)
    assert first == torch.randperm(5, generator=torch.Generator().manual_seed(1)).tolist()[:3]
    again = RefillStream()
    again.load_state_dict(stream.state_dict())
    assert again.take(4, 5, seed=2) == stream.take(4, 5, seed=2)  # 2 left, then a new pass
    a = seeds.for_rows(0, step=5, count=2, first_row=0)
    b = seeds.for_rows(0, step=5, count=2, first_row=0)  # a second rollout of step 5 (a refill)
    assert a != b
    restored = RolloutSeeds()
    restored.load_state_dict(seeds.state_dict())
    assert restored.for_rows(0, 5, 2, 0) == seeds.for_rows(0, 5, 2, 0)


def test_metric_buffer_pools_means_extremes_and_timer():
    metrics = MetricBuffer()
    metrics.record({"reward/mean": 1.0})
    metrics.record({"reward/mean": 0.0, "kl": 0.5})
    with metrics.timer("rollout") as clock:
        pass
    assert clock.seconds >= 0 and metrics.values["time/rollout"] == [clock.seconds]
    copy = MetricBuffer()
    copy.load_state_dict(metrics.state_dict())
    copy.record({"response_length/max": 7.0, "advantages/min": -1.0})
    copy.record({"response_length/max": 3.0, "advantages/min": -2.0})
    pooled = copy.pooled(world_size=1)
    assert pooled["reward/mean"] == 0.5 and pooled["kl"] == 0.5 and not copy.values  # cleared once logged
    assert pooled["response_length/max"] == 7.0 and pooled["advantages/min"] == -2.0  # extremes stay extremes


def test_piece_metrics_are_token_weighted_and_value_losses_summed():
    from verl_hf.state import token_weighted

    one = {"kl": 0.2, "critic/value_loss": 0.5}
    assert token_weighted([(one, 500.0)]) is one
    merged = token_weighted([({"kl": 0.2, "critic/value_loss": 0.5}, 500.0), ({"kl": 0.0, "critic/value_loss": 0.25}, 160.0)])
    assert merged["kl"] == pytest.approx(0.2 * 500 / 660)  # the token mean, not (0.2 + 0) / 2
    assert merged["critic/value_loss"] == pytest.approx(0.75)  # parts of one normalised loss add up
