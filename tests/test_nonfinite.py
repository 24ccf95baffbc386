"""Non-finite values never reach the weights (verl_hf/nonfinite.py): huge finite rewards give finite group
statistics; a non-finite gradient stops the run before the optimizer step, or skips the step and counts it;
a model with NaN weights is never saved."""

import math
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from conftest import small_config  # noqa: E402

from verl_hf.algorithms import grpo_advantages  # noqa: E402
from verl_hf.nonfinite import MAX_SKIPPED_IN_ROW, NonFiniteGuard, check_finite_weights  # noqa: E402


def test_the_guard_raises_or_skips_and_counts():
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    assert NonFiniteGuard("raise").after_gradients(1.5, [param], step=3)
    with pytest.raises(FloatingPointError, match="step 3: the gradient norm is nan; the optimizer step was not taken"):
        NonFiniteGuard("raise").after_gradients(float("nan"), [param], step=3)
    guard = NonFiniteGuard("skip")
    assert not guard.after_gradients(float("inf"), [param], step=4) and param.grad is None
    assert guard.metrics() == {"train/skipped_steps": 1.0} and guard.state_dict() == {"skipped": 1, "in_row": 1}
    assert guard.after_gradients(0.5, [param], step=5) and guard.in_row == 0  # a good step ends the streak
    for step in range(6, 6 + MAX_SKIPPED_IN_ROW - 1):
        guard.after_gradients(float("nan"), [param], step=step)
    with pytest.raises(FloatingPointError, match=f"{MAX_SKIPPED_IN_ROW} optimizer steps in a row"):
        guard.after_gradients(float("nan"), [param], step=99)
    with pytest.raises(ValueError, match="on_nonfinite='ignore' must be one of"):
        NonFiniteGuard("ignore")


def test_huge_finite_rewards_give_finite_advantages():
    # One group of four: the float32 sum of squares of 3e38 overflows; in float64 mean 1e38 and std 2.582e38.
    rewards = torch.tensor([3e38, 1e38, -3e38, 3e38]).unsqueeze(-1)
    advantages, _ = grpo_advantages(rewards, torch.ones(4, 1), torch.zeros(4, dtype=torch.long))
    s = [3e38, 1e38, -3e38, 3e38]
    mean = sum(s) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in s) / 3)
    expected = torch.tensor([(x - mean) / (std + 1e-6) for x in s])
    assert torch.isfinite(advantages).all() and advantages.dtype == torch.float32
    assert torch.allclose(advantages[:, 0], expected, atol=1e-6)


def test_a_weighted_reward_beyond_float32_is_refused_with_its_sample():
    from verl_hf.rewards import score_completions

    def huge(completions, **kwargs):
        return [1.0, 3e38]

    with pytest.raises(ValueError, match=r"sample 1's weighted reward 6e\+38 .*beyond float32's range"):
        score_completions([("huge", huge)], [2.0], prompts=["a", "b"], completions=["x", "y"],
                          completion_ids=[[1], [2]], columns={})


def test_weights_with_nan_are_not_saved(tmp_path):
    model = torch.nn.Linear(2, 2)
    check_finite_weights({"policy": model}, lambda t: t, "cpu", str(tmp_path / "checkpoint-1"))
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"not writing .*checkpoint-1: the weights of \['policy'\] hold NaN"):
        check_finite_weights({"policy": model, "critic": None}, lambda t: t, "cpu", str(tmp_path / "checkpoint-1"))


def _explodes(completions, **kwargs):
    """Rewards of +-1e38: finite, but Dr.GRPO's unnormalised advantages then overflow the gradient."""
    return [1e38 if i % 2 else -1e38 for i in range(len(completions))]


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_a_non_finite_gradient_never_reaches_the_weights(tmp_path, warm_start_dir, addition, mode):
    from verl_hf import VerlTrainer

    args = small_config(tmp_path, max_steps=2, per_device_train_batch_size=8, reward_funcs=None, reward_weights=None,
                        norm_adv_by_std_in_grpo=False, on_nonfinite=mode, save_strategy="steps", save_steps=1)
    trainer = VerlTrainer(model=str(warm_start_dir), args=args, train_dataset=addition[0], reward_funcs=[_explodes])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    if mode == "raise":
        with pytest.raises(FloatingPointError, match="step 1: the gradient norm is"):
            trainer.train()
    else:
        trainer.train()
        logged = [h["train/skipped_steps"] for h in trainer.state.log_history if "train/skipped_steps" in h]
        assert logged == [1.0, 2.0]
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())  # no step reached them
    assert not (tmp_path / "out" / "checkpoint-1").exists() or mode == "skip"


def test_skip_is_refused_under_deepspeed(tmp_path):
    with pytest.raises(ValueError, match="on_nonfinite='skip' cannot take effect under DeepSpeed"):
        small_config(tmp_path, on_nonfinite="skip", deepspeed={"zero_optimization": {"stage": 2},
                                                                "train_micro_batch_size_per_gpu": "auto"})


def test_a_role_skips_a_step_with_a_non_finite_gradient():
    """Custom loops too: `TrainableRole.step` does not apply a NaN/inf gradient (and says so by the norm)."""
    from verl_hf.roles.base import TrainableRole

    role = TrainableRole(torch.nn.Linear(2, 1), learning_rate=0.1)
    before = role.model.weight.detach().clone()
    (role.model(torch.ones(1, 2)).sum() * float("inf")).backward()
    assert not math.isfinite(role.step())
    assert torch.equal(role.model.weight, before) and role.model.weight.grad is None
    role.model(torch.ones(1, 2)).sum().backward()
    assert math.isfinite(role.step()) and not torch.equal(role.model.weight, before)


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_a_critic_step_with_a_nonfinite_gradient_is_never_applied(mode, tmp_path, warm_start_dir, policy, tokenizer):
    """Returns of inf give the value loss an inf gradient: the critic's weights stay as they were, and the
    step stops the run ("raise") or is counted (`critic/skipped_step`)."""
    from verl_hf import Actor, Critic
    from verl_hf.update import PolicyUpdate, UpdateSettings

    critic = Critic.from_pretrained(warm_start_dir, learning_rate=1e-2)
    batch = Actor(policy, tokenizer).generate_sequences(["What is 12 plus 34?\n"], max_new_tokens=6,
                                                        num_return_sequences=2, seed=0)
    batch.values = torch.zeros(batch.response_ids.shape)
    batch.returns = torch.full(batch.response_ids.shape, float("inf"))
    batch.loss_norm = None  # token-mean over this batch
    before = {k: v.clone() for k, v in critic.model.state_dict().items()}
    update = PolicyUpdate(UpdateSettings.of(small_config(tmp_path, on_nonfinite=mode)), kl_controller=None)
    if mode == "raise":
        with pytest.raises(FloatingPointError, match="the critic's gradient norm is"):
            update.critic_step(batch, critic, "values", "returns", "critic", optimizer_step=True)
    else:
        out = update.critic_step(batch, critic, "values", "returns", "critic", optimizer_step=True)
        assert out["critic/skipped_step"] == 1.0 and not math.isfinite(out["critic/grad_norm"])
    assert all(torch.equal(before[k], v) for k, v in critic.model.state_dict().items())
