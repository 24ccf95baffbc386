"""verl_hf.callbacks: the progress table shows the RL metrics."""

from conftest import small_config
from verl_hf import VerlTrainer
from verl_hf.callbacks import RLProgressCallback


def test_progress_table_prints_rows(tmp_path, warm_start_dir, addition, capsys):
    args = small_config(tmp_path, max_steps=4, logging_steps=2, eval_strategy="steps", eval_steps=4)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0],
                          eval_dataset=addition[1].select(range(10)), callbacks=[RLProgressCallback()])
    trainer.train()
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip().split(" ")[0].isdigit()
             or "reward" in line]
    header = next(line for line in lines if "reward" in line and "eval_acc" in line)
    rows = [line.split() for line in lines if line.split()[0] in ("2", "4")]
    assert header.split()[:3] == ["step", "reward", "eval_acc"]
    assert len(rows) >= 2 and all(len(r) == len(header.split()) for r in rows)
    assert float(rows[0][1]) > 0  # a mean reward, not a dash


# ---------------------------------------------------------------- the RL callbacks (verl_hf.callbacks)
import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from verl_hf.callbacks import (BestRewardCheckpointCallback, CompletionSamplesCallback, KLGuardCallback,  # noqa: E402
                               RewardCurvePlotCallback, RewardTargetStoppingCallback, SyncRefModelCallback)


def _train(tmp_path, warm_start_dir, addition, callbacks, eval_dataset=None, **overrides):
    args = small_config(tmp_path, **overrides)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0], eval_dataset=eval_dataset,
                          callbacks=callbacks)
    trainer.train()
    return trainer


def test_completion_samples_go_to_jsonl_parquet_and_tensorboard(tmp_path, warm_start_dir, addition, monkeypatch):
    import pyarrow.parquet as pq
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from verl_hf.rewards.reasoning import split_think

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    samples = CompletionSamplesCallback(num_samples=3, formats=("jsonl", "parquet"))
    trainer = _train(tmp_path, warm_start_dir, addition, [samples], max_steps=2, report_to=["tensorboard"],
                     reasoning_format="think")
    out = tmp_path / "out" / "completions"
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and [r["step"] for r in rows] == [1, 1, 1, 2, 2, 2]
    first = rows[0]
    assert set(first) >= {"prompt", "completion", "reward", "advantage", "reward/gsm8k", "reward/gsm8k_format",
                          "reasoning", "content"}
    assert all((r["reasoning"], r["content"]) == split_think(r["completion"]) for r in rows)
    batch = trainer.last_round  # the step-2 round: the last three rows are its first three
    assert [r["completion"] for r in rows[3:]] == batch.completions[:3]
    assert rows[3]["reward"] == pytest.approx(float(batch.rewards[0]))
    assert pq.read_table(out / "step_2.parquet").num_rows == 3
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert any("completions" in tag for tag in events.Tags()["tensors"])
    with pytest.raises(ValueError, match="choose from"):
        CompletionSamplesCallback(formats=("csv",))


def test_reward_curve_png_refreshes_and_shows_lambda(tmp_path, warm_start_dir, addition):
    from verl_hf.callbacks.plots import plot_curves

    plot = RewardCurvePlotCallback(every_n_logs=1)
    sizes = []

    class Watch(RewardCurvePlotCallback):  # records the PNG after each refresh
        def on_log(self, args, state, control, logs=None, **kwargs):
            png = tmp_path / "out" / "reward_curve.png"
            sizes.append(png.stat().st_size if png.exists() else 0)

    trainer = _train(tmp_path, warm_start_dir, addition, [plot, Watch()], max_steps=3, kl_coef=0.01,
                     cost_funcs=["examples/safe_rlhf/task.py:forbidden_digit"])
    png = tmp_path / "out" / "reward_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and all(size > 0 for size in sizes[:3])
    assert plot_curves(trainer.state.log_history, str(tmp_path / "again.png")) == ["reward", "KL", "response length",
                                                                                   "lambda"]


def test_kl_guard_stops_and_rolls_back(tmp_path, warm_start_dir, addition):
    stop = KLGuardCallback(max_kl=1e-12)
    trainer = _train(tmp_path / "stop", warm_start_dir, addition, [stop], max_steps=4, kl_coef=0.01)
    # KL is exactly 0 at step 1 (policy = reference), then positive: the guard stops at step 2.
    assert trainer.state.global_step == 2 and [e["action"] for e in stop.events] == ["stop"]
    collapse = KLGuardCallback(min_entropy=1e9)
    trainer = _train(tmp_path / "entropy", warm_start_dir, addition, [collapse], max_steps=4)
    assert trainer.state.global_step == 1 and "entropy" in collapse.events[0]["reason"]

    back = KLGuardCallback(max_kl=1e-12, action="rollback", max_rollbacks=1)
    trainer = _train(tmp_path / "back", warm_start_dir, addition, [back], max_steps=4, kl_coef=0.01,
                     save_strategy="steps", save_steps=1)
    assert [(e["action"], e["step"]) for e in back.events] == [("rollback", 2), ("stop", 3)]
    assert back.events[0]["checkpoint"].endswith("checkpoint-1")


def test_restore_checkpoint_brings_back_weights_and_optimizer(tmp_path, warm_start_dir, addition):
    from safetensors.torch import load_file

    trainer = _train(tmp_path, warm_start_dir, addition, [], max_steps=2, save_strategy="steps", save_steps=1,
                     generation_batch_size=64)  # rounds of 2 steps: checkpoint-1 is inside one
    checkpoint = tmp_path / "out" / "checkpoint-1"
    trainer.restore_checkpoint(str(checkpoint))
    progress = trainer.round_in_progress
    assert progress.micro_batches == [] and progress.micro_step % trainer.args.micro_steps_per_round == 0  # fresh
    saved = load_file(checkpoint / "model.safetensors")
    for name, param in trainer.model.named_parameters():
        if name in saved:
            assert torch.equal(param.detach().cpu(), saved[name]), name
    state = torch.load(checkpoint / "optimizer.pt", weights_only=False)["state"]
    assert torch.equal(trainer.optimizer.state_dict()["state"][0]["exp_avg"].cpu(), state[0]["exp_avg"])


def test_reward_target_stops_training(tmp_path, warm_start_dir, addition):
    target = RewardTargetStoppingCallback(target=-1.0, patience=2)
    trainer = _train(tmp_path, warm_start_dir, addition, [target], max_steps=5)
    assert trainer.state.global_step == 2 and target.events[0]["step"] == 2
    never = RewardTargetStoppingCallback(target=2.0, metric="eval_accuracy")
    trainer = _train(tmp_path / "never", warm_start_dir, addition, [never], eval_dataset=addition[1], max_steps=2,
                     eval_strategy="steps", eval_steps=1)
    assert trainer.state.global_step == 2 and not never.events


def test_best_checkpoint_is_kept(tmp_path, warm_start_dir, addition):
    best = BestRewardCheckpointCallback(metric="eval_reward")
    trainer = _train(tmp_path, warm_start_dir, addition, [best], eval_dataset=addition[1].select(range(50)),
                     max_steps=4, eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1,
                     learning_rate=3e-4)
    evals = [(h["step"], h["eval_reward"]) for h in trainer.state.log_history if "eval_reward" in h]
    step, value = max(evals, key=lambda e: (e[1], -e[0]))
    kept = json.loads((tmp_path / "out" / "best_checkpoint" / "best.json").read_text())
    assert kept == {"step": step, "metric": "eval_reward", "value": value}
    assert (tmp_path / "out" / "best_checkpoint" / "model.safetensors").exists()
    with pytest.raises(ValueError, match="use an evaluation metric"):
        BestRewardCheckpointCallback(metric="reward/mean")


def test_sync_ref_model_mixes_the_reference_towards_the_policy(tmp_path, warm_start_dir, addition):
    class Snapshot(SyncRefModelCallback):  # the reference and policy just before the sync of step 2
        def bind(self, trainer):
            self.trainer = trainer

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                self.before = [p.detach().clone() for p in self.trainer.ref_policy.model.parameters()]

    snap, sync = Snapshot(), SyncRefModelCallback(sync_steps=2, alpha=0.5)
    trainer = _train(tmp_path, warm_start_dir, addition, [snap, sync], max_steps=2, kl_coef=0.01,
                     save_strategy="steps", save_steps=2)
    policy = list(trainer.model.parameters())
    for ref, old, new in zip(trainer.ref_policy.model.parameters(), snap.before, policy):
        assert torch.allclose(ref, 0.5 * old + 0.5 * new.detach(), atol=1e-7)
    assert sync.syncs == 1
    # The checkpoint carries the moved reference, and a resume brings it back (not the starting weights).
    resumed = VerlTrainer(model=warm_start_dir, args=small_config(tmp_path, max_steps=2, kl_coef=0.01),
                          train_dataset=addition[0])
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    for a, b in zip(resumed.ref_policy.model.parameters(), trainer.ref_policy.model.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="needs a KL reference"):
        _train(tmp_path / "nokl", warm_start_dir, addition, [SyncRefModelCallback()], max_steps=1)
