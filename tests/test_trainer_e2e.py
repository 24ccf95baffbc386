"""End-to-end: VerlTrainer learns, and the stock Trainer features keep working. Real tiny model, CPU."""

import os

import pytest
import torch
from transformers import TrainerCallback

from conftest import assert_learned, small_config
from verl_hf import VerlTrainer
from verl_hf.algorithms.losses import LOSS_AGG_MODES


def test_grpo_raises_held_out_accuracy(tmp_path, warm_start_dir, addition):
    """80 GRPO steps on the warm start: greedy accuracy on 100 unseen problems must rise clearly."""
    train, test = addition
    args = small_config(tmp_path, per_device_train_batch_size=128, max_steps=80, logging_steps=20)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=train, eval_dataset=test)
    before = trainer.evaluate()["eval_accuracy"]
    trainer.train()
    after = trainer.evaluate()["eval_accuracy"]
    rewards = [h["reward/mean"] for h in trainer.state.log_history if "reward/mean" in h]
    assert_learned(before, after, 0.10, problems=100)
    assert rewards[-1] > rewards[0], rewards


class RecordLogs(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def _features_config(tmp_path, **overrides):
    values = dict(per_device_train_batch_size=16, gradient_accumulation_steps=2, max_steps=6, logging_steps=2,
                  save_strategy="steps", save_steps=3, eval_strategy="steps", eval_steps=3, report_to="tensorboard")
    values.update(overrides)
    return small_config(tmp_path, **values)


def test_trainer_features_and_exact_resume(tmp_path, warm_start_dir, addition):
    """Gradient accumulation, logging_steps, save_steps, eval_strategy, tensorboard, max_steps and a user
    callback in one run; then resume from checkpoint-3 and land on the same weights as the full run."""
    train, test = addition
    test = test.select(range(20))
    recorder = RecordLogs()
    full = VerlTrainer(model=warm_start_dir, args=_features_config(tmp_path), train_dataset=train,
                       eval_dataset=test, callbacks=[recorder])
    full.train()
    assert full.state.global_step == 6 and full.state.total_flos > 0
    train_logs = [log for log in recorder.logs if "reward/mean" in log]
    assert len(train_logs) == 3  # steps 2, 4, 6
    for key in ("reward/mean", "reward/std", "reward/gsm8k/mean", "kl" if False else "actor/entropy",
                "actor/clip_frac", "response_length/mean", "rollout/tokens_per_s", "time/rollout",
                "time/reward", "time/update", "loss", "learning_rate"):
        assert key in train_logs[0], key
    assert sum("eval_accuracy" in log for log in recorder.logs) == 2  # steps 3 and 6
    assert os.path.isdir(tmp_path / "out" / "checkpoint-3") and os.path.isdir(tmp_path / "out" / "checkpoint-6")
    assert any(name.startswith("events.out.tfevents") for _, _, files in os.walk(tmp_path / "out") for name in files)

    resumed_args = _features_config(tmp_path, output_dir=str(tmp_path / "resumed"))
    resumed = VerlTrainer(model=warm_start_dir, args=resumed_args, train_dataset=train, eval_dataset=test)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-3"))
    assert resumed.state.global_step == 6
    for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, msg=f"{name} differs after resume")


def test_gradient_accumulation_matches_one_big_batch(tmp_path, warm_start_dir, addition):
    """token-mean over 2 x 16 accumulated rows gives the same update as one batch of 32 (same rollout).

    Plain SGD, so the update is the gradient itself: Adam's first step is about lr * sign(g), which turns a
    last-bit difference in a near-zero gradient into a whole lr (measured on an AMD EPYC: one element in
    16384 off by 3e-5 with Adam at lr 1e-3, on the code before and after the round/update split)."""
    train, _ = addition
    results = []
    for batch, accumulation in ((32, 1), (16, 2)):
        args = small_config(tmp_path, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                            max_steps=1, learning_rate=1e-1, optim="sgd")
        trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=train)
        trainer.train()
        results.append([p.detach().clone() for p in trainer.model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("loss_agg_mode", LOSS_AGG_MODES)
def test_token_budget_pieces_give_the_same_update(tmp_path, warm_start_dir, addition, loss_agg_mode):
    """max_tokens_per_micro_batch cuts each micro-batch into length-ordered pieces padded to their own longest
    row; the step's normaliser is shared, so the update equals one forward/backward over the whole micro-batch."""
    train, _ = addition
    results = []
    for budget in (None, 120):
        args = small_config(tmp_path, max_steps=1, learning_rate=1e-1, optim="sgd", loss_agg_mode=loss_agg_mode,
                            max_tokens_per_micro_batch=budget)
        trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=train)
        trainer.train()
        results.append([p.detach().clone() for p in trainer.model.parameters()])
    round_rows = trainer.round_in_progress.last_round
    pieces = round_rows.split_by_tokens(120)
    assert len(pieces) > 4 and sum(map(len, pieces)) == len(round_rows)  # really cut, nothing lost
    for piece in pieces[:-1]:
        clean = piece.without_padding()
        assert len(piece) == 1 or clean.input_ids.numel() <= 120
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-4)


def test_plain_training_arguments_are_converted(tmp_path, warm_start_dir, addition):
    from transformers import TrainingArguments

    train, _ = addition
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=16,
                             report_to="none", use_cpu=True)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=train, reward_funcs=["gsm8k"])
    assert trainer.args.num_generations == 8 and trainer.args.max_steps == 1


@pytest.mark.parametrize("kl_in_reward", [False, True])
def test_kl_against_reference_is_logged_and_grows(tmp_path, warm_start_dir, addition, kl_in_reward):
    """With kl_coef > 0 a frozen reference is used: KL starts at zero and becomes positive as the actor moves."""
    args = small_config(tmp_path, kl_coef=0.05, use_kl_in_reward=kl_in_reward, max_steps=3, learning_rate=1e-3)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    trainer.train()
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[-1] > 1e-6
    assert trainer.ref_policy.model is not trainer.model
    assert ("kl/in_reward" in trainer.state.log_history[-2]) == kl_in_reward


def test_bf16_default_samples_from_a_bf16_copy_and_kl_starts_at_zero(tmp_path, warm_start_dir, addition):
    """The default precision on this machine (bf16 where it is fast): the reference is scored under the same
    autocast as the actor's loss, so KL is exactly zero before the first update, then grows."""
    from verl_hf.config import bf16_is_fast
    from verl_hf.rollout import HFCopyEngine

    args = small_config(tmp_path, bf16=None, kl_coef=0.05, max_steps=3, learning_rate=1e-3)
    assert args.bf16 is bf16_is_fast()
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    trainer.train()
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[-1] > 1e-6, kls
    if args.bf16:
        engine = trainer.actor.engine
        assert isinstance(engine, HFCopyEngine) and engine.dtype == torch.bfloat16
        assert next(trainer.model.parameters()).dtype == torch.float32  # fp32 master weights


def test_lora_actor_uses_adapter_free_base_as_reference(tmp_path, warm_start_dir, addition):
    from peft import LoraConfig

    args = small_config(tmp_path, kl_coef=0.05, max_steps=3, learning_rate=1e-2)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0],
                          peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    base_before = {n: p.clone() for n, p in trainer.model.named_parameters() if "lora" not in n}
    trainer.train()
    assert trainer.ref_policy.model is None and trainer.ref_policy.adapter_model is trainer.model
    for n, p in trainer.model.named_parameters():
        if "lora" not in n:
            assert torch.equal(p, base_before[n]), n  # only adapters train
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[-1] > 1e-6


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_accumulation_invariance_8_vs_4x2(tmp_path, warm_start_dir, addition, loss_agg_mode):
    """One micro-batch of 8 and four accumulated micro-batches of 2 (same rollout): same loss, same gradients."""
    results = []
    for batch, accumulation in ((8, 1), (2, 4)):
        args = small_config(tmp_path, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                            loss_agg_mode=loss_agg_mode, max_steps=1, num_generations=8)
        trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
        rows = next(iter(trainer.get_train_dataloader()))
        torch.manual_seed(5)
        loss = sum(trainer.training_step(trainer.model, rows) for _ in range(accumulation))
        results.append((loss, [p.grad.clone() for p in trainer.model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a.item() == pytest.approx(loss_b.item(), abs=1e-5)
    assert sum(g.abs().sum() for g in grads_a) > 0  # the group's rewards differed: a real gradient
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_ppo_checkpoint_resume_includes_critic_and_kl_controller(tmp_path, warm_start_dir, addition):
    """A PPO run resumed from checkpoint-2 ends with the same actor AND critic as the uninterrupted run."""
    def config(out):
        return small_config(tmp_path, output_dir=str(tmp_path / out), adv_estimator="gae", num_generations=1,
                            per_device_train_batch_size=16, generation_batch_size=16, ppo_epochs=2, max_steps=4,
                            critic_learning_rate=1e-3, kl_coef=0.05, use_kl_in_reward=True,
                            kl_controller="adaptive", kl_target=0.01, kl_horizon=100,
                            save_strategy="steps", save_steps=2)

    full = VerlTrainer(model=warm_start_dir, args=config("full"), train_dataset=addition[0])
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert (checkpoint / "critic" / "optimizer.pt").exists() and (checkpoint / "kl_controller.json").exists()
    resumed = VerlTrainer(model=warm_start_dir, args=config("resumed"), train_dataset=addition[0])
    resumed.train(resume_from_checkpoint=str(checkpoint))
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b)
    for a, b in zip(full.critic.model.parameters(), resumed.critic.model.parameters()):
        torch.testing.assert_close(a, b)
    assert full.kl_ctrl.value == pytest.approx(resumed.kl_ctrl.value) and full.kl_ctrl.value != 0.05
    logs = [h for h in full.state.log_history if "critic/value_loss" in h]
    assert logs and "kl/coef" in logs[0]


def test_critic_warmup_keeps_the_actor_still(tmp_path, warm_start_dir, addition):
    args = small_config(tmp_path, adv_estimator="gae", num_generations=1, per_device_train_batch_size=16,
                        max_steps=2, critic_warmup_steps=2, learning_rate=1e-2)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    before = [p.clone() for p in trainer.model.parameters()]
    critic_before = [p.clone() for p in trainer.critic.model.parameters()]
    trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, trainer.critic.model.parameters()))


def _first_operand_parity_reward(prompts, completions, completion_ids, operands, **kw):
    """Odd first operand: every response scores 0.5 (a group with no signal); even: 1 if right else 0."""
    return [0.5 if a % 2 else float(c.strip() == f"#### {a + b}") for c, (a, b) in zip(completions, operands)]


def _groups(batch):
    out = {}
    for g, r in zip(batch.group_ids.tolist(), batch.rewards.tolist()):
        out.setdefault(g, []).append(r)
    return out


def test_dynamic_sampling_drops_flat_groups_and_refills(tmp_path, warm_start_dir, addition):
    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, dynamic_sampling=True,
                        dynamic_sampling_max_rounds=10, per_device_train_batch_size=32, max_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0],
                          reward_funcs=[_first_operand_parity_reward])
    rows = next(iter(trainer.get_train_dataloader()))
    trainer.training_step(trainer.model, rows)
    batch = trainer.round_in_progress.micro_batches[0]
    groups = _groups(batch)
    assert len(batch) == 32 and len(groups) == 8 and all(len(v) == 4 for v in groups.values())
    assert all(max(v) > min(v) for v in groups.values())  # only informative groups are kept
    assert trainer.metrics.values["dynamic_sampling/informative_frac"][0] < 1.0
    assert trainer.metrics.values["dynamic_sampling/extra_rounds"][0] >= 1
    assert "dynamic_sampling/filler_groups" not in trainer.metrics.values


def test_dynamic_sampling_fills_with_flat_groups_when_none_are_informative(tmp_path, warm_start_dir, addition):
    def constant(prompts, completions, completion_ids, **kw):
        return [1.0] * len(completions)

    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, dynamic_sampling=True,
                        dynamic_sampling_max_rounds=2, max_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0], reward_funcs=[constant])
    trainer.train()
    log = trainer.state.log_history[0]
    assert log["dynamic_sampling/filler_groups"] == 8 and log["dynamic_sampling/extra_rounds"] == 2
    assert log["advantages/abs_mean"] == 0.0


def test_remax_baselines_are_the_greedy_rewards_of_each_prompt(tmp_path, warm_start_dir, addition):
    args = small_config(tmp_path, adv_estimator="remax", num_generations=2, per_device_train_batch_size=8,
                        max_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    rows = next(iter(trainer.get_train_dataloader()))
    trainer.training_step(trainer.model, rows)
    batch = trainer.round_in_progress.micro_batches[0]
    greedy = trainer.actor.generate_sequences(prompt_ids=[r["prompt_ids"] for r in rows], rows=rows,
                                              max_new_tokens=12, do_sample=False)
    expected = trainer.rewards.rewards(greedy)[0].repeat_interleave(2)
    torch.testing.assert_close(batch.reward_baselines, expected)
    adv = batch.advantages[:, 0]
    torch.testing.assert_close(adv, batch.rewards - expected)  # A = R - R_greedy on the first token


def test_resume_in_the_middle_of_a_round_uses_that_rounds_prompts(tmp_path, warm_start_dir, addition):
    """Rounds of 2 optimizer steps, resumed after step 1: the next micro-step trains on the second half of a
    round sampled from the prompts the dataloader gives for that position."""
    args = small_config(tmp_path, per_device_train_batch_size=16, generation_batch_size=32, max_steps=4)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    rows = next(iter(trainer.get_train_dataloader()))
    trainer.round_in_progress.needs_position, trainer.state.global_step = True, 1  # as after loading checkpoint-1
    trainer.training_step(trainer.model, rows)
    assert trainer.round_in_progress.micro_step == 2 and len(trainer.round_in_progress.micro_batches) == 2
    used = trainer.round_in_progress.micro_batches[1]
    prompts = {r["prompt"] for r in rows}
    assert set(used.prompts) <= prompts and len(used) == 16


def test_given_reference_model_uses_the_sampling_temperature(tmp_path, warm_start_dir, addition, policy):
    args = small_config(tmp_path, kl_coef=0.05, temperature=0.7, max_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0], ref_policy=policy)
    assert trainer.ref_policy.temperature == 0.7 and trainer.ref_policy.model is policy
