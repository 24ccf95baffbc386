"""Bad input fails before training, with a message that says what to fix."""

import pytest
from datasets import Dataset

from conftest import small_config
from verl_hf import VerlConfig, VerlTrainer


def _config(**overrides):
    values = dict(output_dir="/tmp/verl-hf-errors", per_device_train_batch_size=8, num_generations=4,
                  report_to="none", use_cpu=True)
    values.update(overrides)
    return VerlConfig(**values)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_generations=1), "needs num_generations >= 2"),
        (dict(num_generations=3), "not divisible by num_generations=3"),
        (dict(generation_batch_size=12), "multiple of per_device_train_batch_size"),
        (dict(adv_estimator="nope"), "adv_estimator='nope' is unknown; valid: gae, "),
        (dict(policy_loss="nope"), "valid: "),
        (dict(loss_agg_mode="mean"), "valid: seq-mean-token-mean"),
        (dict(kl_kind="k9"), "valid: abs, k1, k2, k3"),
        (dict(rollout_engine="sglang"), "valid: auto, hf"),
        (dict(temperature=0.0), "temperature=0.0 must be > 0"),
        (dict(top_p=1.5), "top_p=1.5 must be in (0, 1]"),
        (dict(clip_ratio_c=0.5), "clip_ratio_c=0.5 must be > 1"),
        (dict(data_key_map="{not json"), "is not valid JSON"),
    ],
)
def test_config_rejects(overrides, message):
    with pytest.raises(ValueError) as err:
        _config(**overrides)
    assert message in str(err.value), str(err.value)


def test_data_key_map_json_string_is_parsed():
    assert _config(data_key_map='{"prompt": "question"}').data_key_map == {"prompt": "question"}


def test_unknown_reward_name_lists_builtins(tmp_path, warm_start_dir, addition):
    with pytest.raises(ValueError) as err:
        VerlTrainer(model=warm_start_dir, args=small_config(tmp_path, reward_funcs=["gsm9k"], reward_weights=None),
                    train_dataset=addition[0])
    assert "gsm8k" in str(err.value) and "exact_match" in str(err.value)


def test_reward_weights_counted_before_any_model_loads(tmp_path, addition):
    """One weight per reward function, checked once, when VerlTrainer knows them all (here before the missing
    reward model's path would be opened)."""
    args = small_config(tmp_path, reward_funcs=["gsm8k"], reward_weights=[1.0, 2.0, 3.0],
                        reward_model_path="no-such/reward-model")
    with pytest.raises(ValueError, match=r"reward_weights has 3 entries .* for 2 reward functions \['gsm8k', "
                                         r"'reward_model'\]; give one weight per function"):
        VerlTrainer(model="no-such/policy", args=args, train_dataset=addition[0])


def test_no_reward_at_all(tmp_path, warm_start_dir, addition):
    with pytest.raises(ValueError, match="no reward"):
        VerlTrainer(model=warm_start_dir, args=small_config(tmp_path, reward_funcs=None, reward_weights=None),
                    train_dataset=addition[0])


def test_dataset_without_prompt_column(tmp_path, warm_start_dir):
    data = Dataset.from_dict({"question": ["What is 1 plus 2?\n"], "answer": ["3"]})
    with pytest.raises(ValueError, match=r"no 'prompt' column .*data_key_map"):
        VerlTrainer(model=warm_start_dir, args=small_config(tmp_path), train_dataset=data)
    # ... and the mapping fixes it.
    trainer = VerlTrainer(model=warm_start_dir, args=small_config(tmp_path, data_key_map={"prompt": "question"}),
                          train_dataset=data)
    assert trainer.train_dataset["prompt"] == ["What is 1 plus 2?\n"]


def test_tokenizer_without_pad_token_falls_back_to_eos(tmp_path, warm_start_dir, addition, caplog):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(warm_start_dir)
    tok.pad_token = None
    trainer = VerlTrainer(model=warm_start_dir, args=small_config(tmp_path), train_dataset=addition[0],
                          processing_class=tok)
    assert trainer.processing_class.pad_token == tok.eos_token


def _train_with_reward(tmp_path, warm_start_dir, addition, reward):
    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1)
    VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0], reward_funcs=[reward]).train()


def test_reward_function_of_wrong_length(tmp_path, warm_start_dir, addition):
    def short(prompts, completions, completion_ids, **kw):
        return [1.0] * (len(completions) - 1)

    with pytest.raises(ValueError, match="'short' returned 31 scores for 32 completions"):
        _train_with_reward(tmp_path, warm_start_dir, addition, short)


def test_reward_function_returning_text(tmp_path, warm_start_dir, addition):
    def wordy(prompts, completions, completion_ids, **kw):
        return ["good"] * len(completions)

    with pytest.raises(TypeError, match="'wordy' returned 'good'"):
        _train_with_reward(tmp_path, warm_start_dir, addition, wordy)


def test_every_reward_none(tmp_path, warm_start_dir, addition):
    def abstain(prompts, completions, completion_ids, **kw):
        return [None] * len(completions)

    with pytest.raises(ValueError, match="returned None for all 32 samples"):
        _train_with_reward(tmp_path, warm_start_dir, addition, abstain)


def test_some_rewards_none_exclude_those_rows(tmp_path, warm_start_dir, addition):
    """Rows a function declines (None) get no gradient and no share in their group's baseline."""
    def half(prompts, completions, completion_ids, answer, **kw):
        return [None if i % 2 else float(answer[i] in c) for i, c in enumerate(completions)]

    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0], reward_funcs=[half])
    trainer.train()
    log = next(h for h in trainer.state.log_history if "reward/mean" in h)
    assert log["reward/excluded_frac"] == 0.5



@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(policy_loss="sapo", policy_loss_kwargs={"tau_postive": 1.0}), "['tau_postive'] are not keywords"),
        (dict(policy_loss_kwargs={"clip_ratio_low": 0.1}), "as VerlConfig fields"),
        (dict(eval_num_generations=4), "takes effect only when eval_do_sample=True"),
        (dict(kl_controller="adaptive"), "takes effect only when kl_coef > 0"),
        (dict(use_kl_in_reward=True), "use_kl_in_reward=True takes effect only when kl_coef > 0"),
        (dict(kl_coef=0.1, kl_controller="pid"), "three numbers (kp ki kd)"),
        (dict(logits_chunk_size=-1), "logits_chunk_size=-1 must be >= 0"),
        (dict(max_tokens_per_micro_batch=100), "must be >= max_prompt_length + max_response_length = 768"),
        (dict(max_tokens_per_micro_batch=1000, deepspeed={"zero_optimization": {"stage": 2}}),
         "gradient accumulation of DeepSpeed and FSDP does not count yet"),
        (dict(max_tokens_per_micro_batch=1000, policy_loss="clip_cov"), "picks its tokens by covariance"),
    ],
)
def test_config_rejects_more(overrides, message):
    with pytest.raises(ValueError) as err:
        _config(**overrides)
    assert message in str(err.value), str(err.value)


def test_policy_loss_kwargs_reach_the_loss():
    assert _config(policy_loss="sapo", policy_loss_kwargs='{"tau_pos": 0.5}').policy_loss_kwargs == {"tau_pos": 0.5}


def test_bf16_default_follows_the_hardware_and_explicit_choices_win(monkeypatch):
    from verl_hf.config import bf16_is_fast

    assert _config().bf16 is bf16_is_fast()  # None resolves to on exactly where bf16 is fast
    assert _config(bf16=False).bf16 is False
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # DeepSpeed on a CPU keeps fp32 unless asked
    import torch

    if not torch.cuda.is_available():
        assert _config(use_cpu=False).bf16 is False


def test_auto_rollout_engine_resolves_to_a_named_engine():
    import torch

    expected = "hf" if not torch.cuda.is_available() else ("vllm", "hf")
    assert _config(rollout_engine="auto").rollout_engine in expected
    assert _config(rollout_engine="auto", vllm_server_url="http://127.0.0.1:1").rollout_engine == "vllm_server"


def test_a_new_conditional_setting_is_one_declaration():
    """The README's contributor example: a field whose type names its condition is refused where the condition
    does not hold, with no other code; HfArgumentParser still sees the plain type."""
    from dataclasses import dataclass, field
    from typing import Annotated

    from transformers import HfArgumentParser

    from verl_hf.config import COLOCATED_VLLM, conditional_fields

    @dataclass
    class MyConfig(VerlConfig):
        vllm_swap_space_gb: Annotated[int, COLOCATED_VLLM] = field(
            default=0, metadata={"help": "vLLM: CPU swap space per GPU in GB."})

    assert MyConfig(output_dir="/tmp/verl-hf-errors", use_cpu=True, rollout_engine="vllm",
                    vllm_swap_space_gb=4).vllm_swap_space_gb == 4
    with pytest.raises(ValueError, match=r"vllm_swap_space_gb=4 takes effect only when rollout_engine='vllm', which "
                                         r"this setup does not have \(here rollout_engine='hf'\): set that, or leave "
                                         r"vllm_swap_space_gb at its default \(0\)\."):
        MyConfig(output_dir="/tmp/verl-hf-errors", use_cpu=True, vllm_swap_space_gb=4)
    (parsed,) = HfArgumentParser(MyConfig).parse_args_into_dataclasses(
        ["--output_dir", "/tmp/verl-hf-errors", "--use_cpu", "--rollout_engine", "vllm", "--vllm_swap_space_gb", "2"])
    assert parsed.vllm_swap_space_gb == 2
    conditional_fields.cache_clear()  # read again after the parser rewrote the fields' types: still there
    assert conditional_fields(MyConfig)["vllm_swap_space_gb"] is COLOCATED_VLLM
