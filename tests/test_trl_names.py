"""TRL's GRPOConfig names (TRL 1.16) in VerlConfig (verl_hf/config/trl_names.py): each renamed one lands in our
field with TRL's meaning, each refused one says why and what to use, a TRL name beside ours is an error naming
both, and the tables cover every field of TRL's dataclass (read from `trl` where the `bench` extra installed it)."""

import dataclasses

import pytest

from verl_hf import VerlConfig
from verl_hf.config.trl_names import (ALWAYS, REFUSED, RENAMED, SAME_NAME_OTHER_MEANING, SHARED, TRANSLATED,
                                      translate_trl_names)

# TRL 1.16's GRPOConfig fields (its own, beside TrainingArguments'), for machines without trl installed
TRL_1_16_FIELDS = """learning_rate model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout
cast_lm_head_to_fp32 remove_unused_columns num_generations num_generations_eval max_completion_length
ds3_gather_for_generation shuffle_dataset pad_to_multiple_of generation_batch_size steps_per_generation temperature
top_p top_k min_p generation_kwargs chat_template_kwargs repetition_penalty cache_implementation use_vllm vllm_mode
vllm_model_impl vllm_enable_sleep_mode vllm_structured_outputs_regex vllm_server_base_url vllm_server_host
vllm_server_port vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization vllm_max_model_length
vllm_tensor_parallel_size beta num_iterations epsilon delta epsilon_high sapo_temperature_neg sapo_temperature_pos
vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg importance_sampling_level reward_weights
multi_objective_aggregation scale_rewards loss_type mask_truncated_completions sync_ref_model ref_model_mixup_alpha
ref_model_sync_steps top_entropy_quantile entropy_coef use_adaptive_entropy entropy_coef_min entropy_coef_max
entropy_coef_delta entropy_target max_tool_calling_iterations vllm_importance_sampling_correction
vllm_importance_sampling_mode vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min
off_policy_mask_threshold use_bias_correction_kl log_completions log_multimodal num_completions_to_print
log_unique_prompts log_completions_hub_repo use_transformers_continuous_batching transformers_continuous_batching_config
use_transformers_paged vllm_importance_sampling_cap""".split()


def trl_fields() -> list[str]:
    try:
        from transformers import TrainingArguments
        from trl import GRPOConfig
    except ImportError:
        return TRL_1_16_FIELDS
    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    return [f.name for f in dataclasses.fields(GRPOConfig) if f.name not in base or f.name in TRL_1_16_FIELDS]


def test_every_trl_field_is_shared_renamed_translated_or_refused():
    ours = {f.name for f in dataclasses.fields(VerlConfig)}
    kinds = {name: [kind for kind, names in (("shared", SHARED), ("same name", SAME_NAME_OTHER_MEANING),
                                            ("renamed", RENAMED), ("translated", TRANSLATED), ("refused", REFUSED))
                    if name in names] for name in trl_fields()}
    assert {name: k for name, k in kinds.items() if len(k) != 1} == {}
    assert all(name in ours for name in (*SHARED, *SAME_NAME_OTHER_MEANING)), "a shared name must be our field"
    assert all(ours_name in ours for ours_name, _ in RENAMED.values())
    assert all(REFUSED[name] for name in REFUSED) and set(ALWAYS) <= set(REFUSED)


@pytest.mark.parametrize("trl, value, ours, expected", [
    ("max_completion_length", 24, "max_response_length", 24),
    ("beta", 0.04, "kl_coef", 0.04),
    ("num_iterations", 2, "ppo_epochs", 2),
    ("epsilon_high", 0.28, "clip_ratio_high", 0.28),
    ("num_generations_eval", 3, "eval_num_generations", 3),
    ("vllm_enable_sleep_mode", True, "vllm_sleep_level", 2),
    ("vllm_enable_sleep_mode", False, "vllm_sleep_level", 0),
    ("delta", 2.0, "clip_ratio_c", 2.0),  # TRL's cap on the ratio: our dual-clip bound
])
def test_a_renamed_trl_field_sets_ours(trl, value, ours, expected, tmp_path):
    if ours == "vllm_sleep_level" and expected:  # vLLM's sleep mode needs a GPU: the translation alone
        assert translate_trl_names({trl: value}) == {ours: expected}
        return
    sampled = {"eval_do_sample": True} if ours == "eval_num_generations" else {}  # TRL's evaluation samples
    config = VerlConfig(output_dir=str(tmp_path), use_cpu=True, **sampled, **{trl: value})
    assert getattr(config, ours) == expected


def test_epsilon_clips_both_sides_unless_epsilon_high_is_given(tmp_path):
    both = VerlConfig(output_dir=str(tmp_path), use_cpu=True, epsilon=0.1)
    assert (both.clip_ratio_low, both.clip_ratio_high) == (0.1, 0.1)
    apart = VerlConfig(output_dir=str(tmp_path), use_cpu=True, epsilon=0.1, epsilon_high=0.28)
    assert (apart.clip_ratio_low, apart.clip_ratio_high) == (0.1, 0.28)


def test_use_vllm_and_vllm_mode_choose_the_engine():
    assert translate_trl_names({"use_vllm": True}) == {"rollout_engine": "vllm"}
    assert translate_trl_names({"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://h:8000"}) == \
        {"rollout_engine": "vllm_server", "vllm_server_url": "http://h:8000"}
    assert translate_trl_names({"use_vllm": True, "vllm_mode": "server", "vllm_server_host": "10.0.0.2"}) == \
        {"rollout_engine": "vllm_server", "vllm_server_url": "http://10.0.0.2:8000"}
    assert translate_trl_names({"use_vllm": False}) == {"rollout_engine": "hf"}
    # TRL's own defaults side by side (a config dump): vLLM off, whatever the default mode says
    assert translate_trl_names({"use_vllm": False, "vllm_mode": "colocate"}) == {"rollout_engine": "hf"}
    with pytest.raises(ValueError, match="vllm_mode='server' takes effect only with use_vllm=True"):
        translate_trl_names({"vllm_mode": "server"})
    with pytest.raises(ValueError, match="vllm_mode='server' takes effect only with use_vllm=True"):
        translate_trl_names({"use_vllm": False, "vllm_mode": "server"})
    with pytest.raises(ValueError, match="vllm_mode='remote' must be one of"):
        translate_trl_names({"use_vllm": True, "vllm_mode": "remote"})
    with pytest.raises(ValueError, match="use_vllm/vllm_mode .* and rollout_engine .* set the same thing"):
        translate_trl_names({"use_vllm": True, "rollout_engine": "hf"})


@pytest.mark.parametrize("trl, ours", [("beta", "kl_coef"), ("max_completion_length", "max_response_length"),
                                       ("epsilon", "clip_ratio_low"), ("num_iterations", "ppo_epochs")])
def test_a_trl_name_beside_ours_names_both(trl, ours, tmp_path):
    with pytest.raises(ValueError, match=f"{trl} \\(TRL's name\\) and {ours} \\(ours\\) set the same thing; keep one"):
        VerlConfig(output_dir=str(tmp_path), use_cpu=True, **{trl: 1, ours: 1})


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_trl_field_says_why(name, tmp_path):
    value = "something else" if name not in ALWAYS else object()  # a value we do not do
    with pytest.raises(ValueError, match=f"{name}=.* is TRL's GRPOConfig.{name}, which has no counterpart here: "):
        VerlConfig(output_dir=str(tmp_path), use_cpu=True, **{name: value})
    for accepted in ALWAYS.get(name, ()):  # what we always do is accepted, as the same effect
        VerlConfig(output_dir=str(tmp_path), use_cpu=True, **{name: accepted})


def test_a_yaml_config_with_trl_names_loads(tmp_path):
    from verl_hf.cli import UsageError, parse_config

    path = tmp_path / "grpo.yaml"
    path.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\nbeta: 0.04\nmax_completion_length: 64\n"
                    f"model_name_or_path: m\ndataset_name: d\n")
    _, config = parse_config(str(path), [])
    assert (config.kl_coef, config.max_response_length) == (0.04, 64)
    path.write_text("loss_type: dr_grpo\n")
    with pytest.raises(UsageError, match=f"{path}: loss_type='dr_grpo' is TRL's GRPOConfig.loss_type"):
        parse_config(str(path), [])


@pytest.mark.parametrize("field, text, says", [
    ("num_generations", "8", "num_generations='8' is text, and num_generations takes an int: pass num_generations=8"),
    ("learning_rate", "1e-5", "learning_rate='1e-5' is text, and learning_rate takes a float: pass learning_rate=1e-05"),
    ("bf16", "false", "bf16='false' is text, and bf16 takes a bool: pass bf16=False"),
    ("kl_coef", "high", "kl_coef='high' is text, and kl_coef takes a float: pass kl_coef=<a float>"),
])
def test_a_number_given_as_text_in_python_is_named(field, text, says, tmp_path):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        VerlConfig(output_dir=str(tmp_path), use_cpu=True, **{field: text})


def test_steps_per_generation_is_micro_batches_per_round():
    assert translate_trl_names({"steps_per_generation": 4, "per_device_train_batch_size": 8}) == \
        {"generation_batch_size": 32, "per_device_train_batch_size": 8}
    assert translate_trl_names({"steps_per_generation": None}) == {}  # TRL's default: one optimizer step, ours too
    with pytest.raises(ValueError, match="steps_per_generation=4 .* needs per_device_train_batch_size beside it"):
        translate_trl_names({"steps_per_generation": 4})


def test_a_renamed_trl_field_set_to_none_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"max_completion_length=None \(TRL's GRPOConfig.max_completion_length, our "
                                         r"max_response_length\): give a value"):
        VerlConfig(output_dir=str(tmp_path), use_cpu=True, max_completion_length=None)
    with pytest.raises(ValueError, match="top_k=None: top_k takes an int; give one"):
        VerlConfig(output_dir=str(tmp_path), use_cpu=True, top_k=None)


def test_a_config_derived_from_verl_config_takes_trl_names_too(tmp_path):
    @dataclasses.dataclass
    class MyConfig(VerlConfig):
        my_weight: float = 1.0

    config = MyConfig(output_dir=str(tmp_path), use_cpu=True, beta=0.02, my_weight=2.0)
    assert (config.kl_coef, config.my_weight) == (0.02, 2.0)
    assert dataclasses.replace(config, kl_coef=0.5).kl_coef == 0.5


def test_rl_defaults_where_training_arguments_defaults_make_no_sense(tmp_path):
    """TRL's and verl's rate and TRL's logging cadence by default; a config that sets them keeps its values."""
    from transformers import TrainingArguments

    config = VerlConfig(output_dir=str(tmp_path), use_cpu=True)
    assert (config.learning_rate, config.logging_steps) == (1e-6, 10)
    plain = TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    for kept in ("max_grad_norm", "weight_decay", "warmup_steps", "gradient_checkpointing", "save_steps",
                 "lr_scheduler_type", "eval_strategy", "report_to", "seed"):
        assert getattr(config, kept) == getattr(plain, kept), kept
    given = VerlConfig(output_dir=str(tmp_path), use_cpu=True, learning_rate=5e-5, logging_steps=500)
    assert (given.learning_rate, given.logging_steps) == (5e-5, 500)
    fields = {f.name: f for f in dataclasses.fields(VerlConfig)}
    assert all("TRL" in fields[name].metadata["help"] for name in ("learning_rate", "logging_steps"))
