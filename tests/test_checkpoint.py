"""RLCheckpoint: the RL state saved by name beside the Trainer's, versioned: a newer format is refused, the
first layout is converted."""

import json

import pytest
import torch

from verl_hf.algorithms import LossNorm, make_kl_controller
from verl_hf.batch import RolloutBatch
from verl_hf.checkpoint import FORMAT_VERSION, CheckpointSettings, RLCheckpoint
from verl_hf.safety import NoConstraint
from verl_hf.state import KLMeter, MetricBuffer, RefillStream, RolloutSeeds, RoundInProgress


def _checkpoint():
    settings = CheckpointSettings(should_save=True, process_index=0, world_size=1, device="cpu",
                                  loss_agg_mode="seq-mean-token-mean", max_response_length=12)
    parts = {"round": RoundInProgress(), "metrics": MetricBuffer(), "kl_meter": KLMeter(), "refill": RefillStream(),
             "seeds": RolloutSeeds()}
    controller = make_kl_controller("adaptive", init_kl_coef=0.1, target_kl=0.05, horizon=100)
    return RLCheckpoint(settings, per_process=parts, constraint=NoConstraint(), kl_controller=controller), parts


def test_named_state_round_trips(tmp_path):
    saver, parts = _checkpoint()
    parts["round"].micro_step, parts["round"].size = 3, 64
    parts["metrics"].record({"reward/mean": 0.25})
    parts["kl_meter"].observe(1.0, 2.0, samples=64)
    saver.kl_controller.update(0.5, 64)
    saver.save(str(tmp_path))
    assert json.loads((tmp_path / "rl_checkpoint.json").read_text()) == {"format_version": FORMAT_VERSION}

    loader, fresh = _checkpoint()
    loader.load(str(tmp_path))
    assert fresh["round"].micro_step == 3 and fresh["round"].size == 64
    assert fresh["metrics"].values == {"reward/mean": [0.25]} and fresh["kl_meter"].pending == [1.0, 2.0, 64.0]
    assert loader.kl_controller.value == saver.kl_controller.value != 0.1


def test_a_rollback_keeps_the_per_process_state_out(tmp_path):
    saver, parts = _checkpoint()
    parts["round"].micro_step = 3
    saver.save(str(tmp_path))
    loader, fresh = _checkpoint()
    loader.load(str(tmp_path), with_round=False)
    assert fresh["round"].micro_step == 0


def test_a_newer_format_is_refused_with_the_fix(tmp_path):
    saver, _ = _checkpoint()
    saver.save(str(tmp_path))
    (tmp_path / "rl_checkpoint.json").write_text(json.dumps({"format_version": FORMAT_VERSION + 1}))
    with pytest.raises(ValueError, match="newer than this verl_hf reads"):
        _checkpoint()[0].load(str(tmp_path))


def test_a_round_file_of_the_first_layout_loads_with_its_normalisers(tmp_path):
    saver, _ = _checkpoint()
    saver.save(str(tmp_path))
    (tmp_path / "rl_checkpoint.json").unlink()  # the first layout had no version file
    mb = RolloutBatch(prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                      response_ids=torch.ones(2, 3, dtype=torch.long), response_mask=torch.ones(2, 3),
                      group_ids=torch.tensor([0, 0]), truncated=torch.zeros(2, dtype=torch.bool))
    mb.__dict__.update(step_num_tokens=6.0, step_num_seqs=2.0)  # how that version's micro-batches looked
    torch.save({"round": [mb, mb], "micro_step": 3, "last_round": None, "round_size": 2, "refill_order": [5, 1],
                "rollout_calls": {3: 1}, "metrics": {"kl": [0.5]}, "kl_seen": [1.0, 6.0, 2.0], "world_size": 1},
               tmp_path / "rl_round_0.pt")
    loader, fresh = _checkpoint()
    loader.load(str(tmp_path))
    loaded, second_epoch = fresh["round"].micro_batches  # ppo_epochs=2 saved the same micro-batch twice
    assert loaded.loss_norm == LossNorm("seq-mean-token-mean", num_tokens=6.0, num_seqs=2.0, constant=12,
                                        count_empty_rows=True)
    assert second_epoch.loss_norm == loaded.loss_norm
    assert "step_num_tokens" not in loaded.__dict__ and fresh["round"].micro_step == 3
    assert fresh["metrics"].values == {"kl": [0.5]} and fresh["kl_meter"].pending == [1.0, 6.0, 2.0]
    (tmp_path / "rl_round_0.pt").unlink()  # without round files the run starts a fresh round
    loader, fresh = _checkpoint()
    loader.load(str(tmp_path))
    assert fresh["round"].micro_step == 0
