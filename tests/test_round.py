"""The round builder outside the Trainer: given rows, it plans exactly the round VerlTrainer trains on."""

import torch

from conftest import small_config
from verl_hf import Actor, VerlTrainer
from verl_hf.algorithms import make_kl_controller
from verl_hf.data import prepare_prompts
from verl_hf.rewards import resolve_reward_funcs
from verl_hf.round import RoundBuilder, RoundSettings
from verl_hf.sample_and_score import RewardSettings, RewardStage
from verl_hf.safety import NoConstraint
from verl_hf.state import MetricBuffer


def _same(a, b):
    for name in ("prompt_ids", "response_ids", "response_mask", "rewards", "advantages", "old_logprobs"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)
    assert a.loss_norm == b.loss_norm


def test_a_round_built_from_rows_is_what_the_trainer_trains_on(tmp_path, warm_start_dir, addition):
    # Two optimizer steps of 2 micro-batches each per round, 2 PPO epochs: 8 planned micro-batches.
    args = small_config(tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                        generation_batch_size=32, ppo_epochs=2, max_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    rows = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(7)
    trainer.training_step(trainer.model, rows)
    trained = trainer.round_in_progress.micro_batches

    actor = Actor.from_pretrained(warm_start_dir)
    rewards = RewardStage(resolve_reward_funcs(["gsm8k", "gsm8k_format"]), [1.0, 0.1], RewardSettings.of(args))
    builder = RoundBuilder(RoundSettings.of(args), actor, rewards, constraint=NoConstraint(),
                           kl_controller=make_kl_controller("fixed", kl_coef=0.0), metrics=MetricBuffer())
    torch.manual_seed(7)
    planned = builder.build(rows, step=0)
    assert len(planned.micro_batches) == len(trained) == 8
    for mine, theirs in zip(planned.micro_batches, trained):
        _same(mine, theirs)
    # Several updates per round: behaviour log-probs are stored; each step normalises by its own 16 rows.
    assert planned.micro_batches[0].old_logprobs is not None
    assert planned.micro_batches[0].loss_norm.num_seqs == 16.0
    assert planned.micro_batches[0].loss_norm.num_tokens == float(planned.batch.response_mask[:16].sum())


def test_unscored_rows_leave_the_loss_and_the_sequence_count(tmp_path, warm_start_dir, addition):
    def every_other(prompts, completions, completion_ids, **kw):
        return [1.0 if i % 2 else None for i in range(len(completions))]  # rows 0, 2, ... are not scored

    for count_empty, expected_seqs in ((False, 16.0), (True, 32.0)):
        args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1,
                            loss_agg_mode="seq-mean-token-mean", seq_mean_count_empty_rows=count_empty)
        actor = Actor.from_pretrained(warm_start_dir)
        rewards = RewardStage(resolve_reward_funcs([every_other]), [1.0], RewardSettings.of(args))
        builder = RoundBuilder(RoundSettings.of(args), actor, rewards,
                               constraint=NoConstraint(), kl_controller=make_kl_controller("fixed", kl_coef=0.0),
                               metrics=MetricBuffer())
        prompts = prepare_prompts(addition[0].select(range(8)), actor.tokenizer, None, 32, "train")
        rows = [prompts[i] for i in range(8)]
        planned = builder.build(rows, step=0)
        mask = planned.batch.response_mask
        assert int(mask[0::2].sum()) == 0 and int(mask[1::2].sum()) > 0  # unscored rows: mask 0
        # verl's rule by default: rows with no response token left are not sequences of the step.
        assert planned.micro_batches[0].loss_norm.num_seqs == expected_seqs
        assert builder.metrics.values["reward/excluded_frac"] == [0.5]
