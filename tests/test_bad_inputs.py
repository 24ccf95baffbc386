"""The catalogue of bad inputs: each one fails early (before any model loads where it can) with an error of a
stated type whose message names the field, value or file and says what to do. Faults that need a run of their
own live beside their code: hangs in tests/test_rewards_calling.py, NaN in tests/test_nonfinite.py, killed and
failed saves in tests/test_checkpoint_files.py, the sandbox in tests/test_sandbox.py."""

import os
import sys
from pathlib import Path

import pytest
from datasets import Dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from verl_hf import VerlConfig  # noqa: E402

BASE = dict(output_dir="/tmp/verl-hf-bad-inputs", per_device_train_batch_size=8, num_generations=4, report_to="none",
            use_cpu=True)

# (case id, VerlConfig overrides, the error's type, a regex the message must match: the field, the value, the fix)
CONFIG_CASES = [
    ("negative learning rate", dict(learning_rate=-1e-5), ValueError, r"learning_rate=-1e-05 must be >= 0"),
    ("zero batch size", dict(per_device_train_batch_size=0), ValueError, r"per_device_train_batch_size=0 must be >= 1"),
    ("zero accumulation", dict(gradient_accumulation_steps=0), ValueError, r"gradient_accumulation_steps=0 must be"),
    ("negative generation batch", dict(generation_batch_size=-8), ValueError, r"generation_batch_size=-8 must be >= 1"),
    ("NaN reward weight", dict(reward_weights=[float("nan")]), ValueError, r"reward_weights=\[nan\] must all be finite"),
    ("eager vLLM with HF engine", dict(vllm_enforce_eager=False), ValueError,
     r"vllm_enforce_eager=False takes effect only when rollout_engine='vllm'"),
    ("kv cache with HF engine", dict(vllm_kv_cache_mb=128), ValueError,
     r"vllm_kv_cache_mb=128 takes effect only when rollout_engine='vllm'.*leave vllm_kv_cache_mb at its default"),
    ("tensor parallel with HF engine", dict(rollout_tensor_parallel_size=2), ValueError,
     r"rollout_tensor_parallel_size=2 takes effect only when rollout_engine='vllm'"),
    ("vLLM memory share with HF engine", dict(vllm_gpu_memory_utilization=0.5), ValueError,
     r"vllm_gpu_memory_utilization=0.5 takes effect only when rollout_engine='vllm'"),
    ("vLLM length with HF engine", dict(vllm_max_model_len=512), ValueError, r"vllm_max_model_len=512 takes effect"),
    ("server timeout without server", dict(vllm_server_timeout_s=5.0), ValueError,
     r"vllm_server_timeout_s=5.0 takes effect only when rollout_engine='vllm_server'"),
    ("HF weights choice with vLLM server", dict(rollout_engine="vllm_server", vllm_server_url="http://h:1",
                                               rollout_hf_weights="copy"), ValueError,
     r"rollout_hf_weights='copy' takes effect only when rollout_engine='hf'"),
    ("cost limit without costs", dict(cost_limit=0.1), ValueError,
     r"cost_limit=0.1 takes effect only when cost_funcs or cost_model_path is set"),
    ("lambda lr without costs", dict(lambda_lr=0.5), ValueError, r"lambda_lr=0.5 takes effect only when cost_funcs"),
    ("cost window without costs", dict(episode_cost_window_size=8), ValueError, r"episode_cost_window_size=8 takes"),
    ("safety filter without costs", dict(safety_filter_threshold=0.5), ValueError,
     r"safety_filter_threshold=.* takes effect only when cost_funcs or cost_model_path is set"),
    ("IS threshold without rollout_is", dict(rollout_is_threshold=3.0), ValueError,
     r"rollout_is_threshold=3.0 takes effect only when rollout_is='token' or 'sequence'"),
    ("IS lower bound without rollout_is", dict(rollout_is_threshold_low=0.5), ValueError,
     r"rollout_is_threshold_low=0.5 takes effect only when rollout_is is set with rollout_is_mode='mask'"),
    ("IS lower bound in truncate mode", dict(rollout_is="token", rollout_is_threshold_low=0.5), ValueError,
     r"rollout_is_threshold_low=0.5 takes effect only when rollout_is is set with rollout_is_mode='mask'"),
    ("KL estimator without KL", dict(kl_kind="k1"), ValueError, r"kl_kind='k1' takes effect only when kl_coef > 0"),
    ("KL target with fixed KL", dict(kl_coef=0.1, kl_target=0.5), ValueError,
     r"kl_target=0.5 takes effect only when kl_controller='adaptive' or 'pid'"),
    ("PID gains with adaptive KL", dict(kl_coef=0.1, kl_controller="adaptive", kl_pid_gains=[1.0, 0.0, 0.0]),
     ValueError, r"kl_pid_gains=\[1.0, 0.0, 0.0\] takes effect only when kl_controller='pid'"),
    ("KL control without KL", dict(kl_controller="adaptive"), ValueError, r"kl_controller='adaptive' takes effect only when kl_coef > 0"),
    ("GAE lambda without GAE", dict(lam=0.9), ValueError,
     r"lam=0.9 takes effect only when adv_estimator is one that takes lam \(gae\).*adv_estimator='grpo'"),
    ("no turns", dict(max_turns=0), ValueError, r"max_turns=0 must be >= 1"),
    ("a turn longer than the budget", dict(max_turn_length=10_000), ValueError,
     r"max_turn_length=10000 must be in \[1, max_response_length\] \(None: max_response_length\)"),
    ("negative tool calls", dict(max_tool_calls=-1), ValueError, r"max_tool_calls=-1 must be >= 0"),
    ("zero tool timeout", dict(tool_timeout_s=0.0), ValueError, r"tool_timeout_s=0.0 must be > 0 \(None: no limit\)"),
    ("negative environment timeout", dict(env_timeout_s=-1.0), ValueError, r"env_timeout_s=-1.0 must be > 0"),
    ("a tool timeout past the environment's", dict(tool_timeout_s=600.0), ValueError,
     r"tool_timeout_s=600.0 must be below env_timeout_s=300.0: a tool call runs inside its environment's answer"),
    ("KL horizon with the PID controller", dict(kl_coef=0.1, kl_controller="pid", kl_pid_gains=[1.0, 0.0, 0.0],
                                                kl_horizon=100), ValueError,
     r"kl_horizon=100 takes effect only when kl_controller='adaptive'"),
    ("critic lr without critic", dict(critic_learning_rate=1e-4), ValueError,
     r"critic_learning_rate=0.0001 takes effect only when adv_estimator='gae' \(PPO"),
    ("value clip without critic", dict(cliprange_value=0.2), ValueError, r"cliprange_value=0.2 takes effect"),
    ("critic warm-up without critic", dict(critic_warmup_steps=3), ValueError, r"critic_warmup_steps=3 takes effect"),
    ("critic path without critic", dict(critic_model_path="/x"), ValueError,
     r"critic_model_path='/x' takes effect only when adv_estimator='gae' \(PPO"),
    ("overlong factor without buffer", dict(overlong_penalty_factor=2.0), ValueError,
     r"overlong_penalty_factor=2.0 takes effect only when overlong_buffer_len > 0"),
    ("refill rounds without dynamic sampling", dict(dynamic_sampling_max_rounds=3), ValueError,
     r"dynamic_sampling_max_rounds=3 takes effect only when dynamic_sampling=True"),
    ("label index without reward model", dict(reward_model_label_index=1), ValueError,
     r"reward_model_label_index=1 takes effect only when reward_model_path is set"),
    ("cost label without cost model", dict(cost_model_label_index=1), ValueError,
     r"cost_model_label_index=.* takes effect only when cost_model_path is set"),
    ("sleep mode on CPU", dict(rollout_engine="vllm", vllm_sleep_level=1), ValueError,
     r"vllm_sleep_level needs a GPU"),
    ("unknown on_nonfinite", dict(on_nonfinite="ignore"), ValueError, r"on_nonfinite='ignore' is unknown; valid"),
    ("skip under DeepSpeed", dict(on_nonfinite="skip", deepspeed={"zero_optimization": {"stage": 2},
                                                               "train_micro_batch_size_per_gpu": "auto"}),
     ValueError, r"on_nonfinite='skip' cannot take effect under DeepSpeed"),
    ("zero reward timeout", dict(reward_timeout_s=0), ValueError, r"reward_timeout_s=0 must be > 0 \(None: no limit\)"),
    ("unknown reward_on_error", dict(reward_on_error="skip"), ValueError, r"reward_on_error='skip' is unknown"),
    ("routing replay through the server", dict(routing_replay=True, rollout_engine="vllm_server",
                                               vllm_server_url="http://h:1"), ValueError,
     r"routing_replay needs each token's experts.*use rollout_engine='vllm'"),
    ("server URL without server engine", dict(vllm_server_url="http://h:1"), ValueError,
     r"vllm_server_url='http://h:1' takes effect only when rollout_engine='vllm_server'.*\(here rollout_engine='hf'\)"),
    ("greedy evaluation repeated", dict(eval_num_generations=4), ValueError,
     r"eval_num_generations=4 takes effect only when eval_do_sample=True.*repeat one answer"),
    ("sync_verify with vLLM", dict(rollout_engine="vllm", sync_verify=True), ValueError,
     r"sync_verify=True takes effect only when rollout_engine='hf'.*compares weights by their HF names"),
    ("negative top_k", dict(top_k=-1), ValueError, r"top_k=-1 must be >= 0 \(0 disables it\)"),
    ("empty prompts", dict(max_prompt_length=0), ValueError, r"max_prompt_length=0 must be > 0"),
    ("empty responses", dict(max_response_length=0), ValueError, r"max_response_length=0 must be > 0"),
    ("no PPO epoch", dict(ppo_epochs=0), ValueError, r"ppo_epochs=0 must be >= 1"),
    ("negative KL coefficient", dict(kl_coef=-1.0), ValueError, r"kl_coef=-1.0 must be >= 0"),
    ("negative entropy bonus", dict(entropy_coef=-0.1), ValueError, r"entropy_coef=-0.1 must be >= 0"),
    ("discount above one", dict(gamma=1.5), ValueError, r"gamma=1.5 must be in \[0, 1\]"),
    ("overlong buffer past the length", dict(overlong_buffer_len=300), ValueError,
     r"overlong_buffer_len=300 must be in \[0, max_response_length\)"),
    ("empty sync buckets", dict(sync_bucket_mb=0), ValueError, r"sync_bucket_mb=0 must be > 0"),
    ("negative logits chunk", dict(logits_chunk_size=-1), ValueError, r"logits_chunk_size=-1 must be >= 0"),
    ("a keyword the loss does not take", dict(policy_loss_kwargs={"tau": 1.0}), ValueError,
     r"policy_loss_kwargs \['tau'\] are not keywords of policy_loss='vanilla'; it takes \['clip_ratio_c'"),
    ("policy loss keywords not JSON", dict(policy_loss_kwargs="{not json"), ValueError,
     r"policy_loss_kwargs='\{not json' is not valid JSON"),
    ("data_key_map not JSON", dict(data_key_map="{bad"), ValueError, r"data_key_map='\{bad' is not valid JSON"),
    ("unknown rollout dtype", dict(rollout_dtype="int8"), ValueError, r"rollout_dtype='int8' is unknown; valid: auto"),
    ("unknown IS level", dict(rollout_is="token2"), ValueError, r"rollout_is='token2' is unknown; valid: sequence"),
    ("PID gains of the wrong length", dict(kl_coef=0.1, kl_controller="pid", kl_pid_gains=[1.0]), ValueError,
     r"kl_pid_gains=\[1.0\] must be three numbers \(kp ki kd\)"),
    ("IS threshold below one", dict(rollout_is="token", rollout_is_threshold=0.5), ValueError,
     r"rollout_is_threshold=0.5 must be > 1"),
    ("token budget below one row", dict(max_tokens_per_micro_batch=64), ValueError,
     r"max_tokens_per_micro_batch=64 must be >= max_prompt_length \+ max_response_length = 768"),
    ("NaN correctness threshold", dict(eval_correct_threshold=float("nan")), ValueError,
     r"eval_correct_threshold=nan must be a finite number"),
    ("dynamic sampling without groups", dict(dynamic_sampling=True, num_generations=1), ValueError,
     r"dynamic_sampling drops groups whose rewards are all equal; it needs num_generations >= 2"),
]


@pytest.mark.parametrize("overrides, error, message", [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_is_refused_with_the_fix(overrides, error, message):
    import torch

    if "vllm_sleep_level" in overrides and torch.cuda.is_available():
        pytest.skip("sleep mode is valid on a GPU machine")
    with pytest.raises(error, match=message):
        VerlConfig(**{**BASE, **overrides})


def test_one_reward_name_is_one_function_not_its_characters():
    assert VerlConfig(**BASE, reward_funcs="gsm8k").reward_funcs == ["gsm8k"]


def test_the_catalogue_is_distinct():
    ids = [c[0] for table in (CONFIG_CASES, DATA_CASES, SETUP_CASES, CLI_CASES) for c in table]
    assert len(ids) == len(set(ids)) and len(ids) >= 60


# ---------------------------------------------------------------- data (before any model loads)
DATA_CASES = [
    ("a list instead of a dataset", [{"prompt": "1+1="}], TypeError,
     r"the train dataset is a list; give a datasets.Dataset \(e.g. datasets.Dataset.from_list\(rows\)"),
    ("an empty dataset", Dataset.from_dict({"prompt": []}), ValueError, r"the train dataset has no rows"),
    ("no prompt column", Dataset.from_list([{"question": "1+1="}]), ValueError,
     r"has no 'prompt' column \(columns: \['question'\]\).*data_key_map"),
    ("a chat message without content", Dataset.from_list([{"prompt": [{"role": "user", "content": None}]},
                                                         {"prompt": [{"role": "user", "content": "hi"}]}]),
     ValueError, r"train row 0: chat message 0 \('user'\) of a prompt has no text 'content'"),
    ("a prompt that is a number", Dataset.from_list([{"prompt": 7}]), ValueError,
     r"train row 0: a prompt must be text or a list of chat messages"),
    ("every prompt too long", Dataset.from_list([{"prompt": "1+1=" * 200}]), ValueError,
     r"every train prompt is longer than max_prompt_length=16"),
    ("every prompt empty", Dataset.from_list([{"prompt": ""}, {"prompt": " "}]), ValueError,
     r"every train prompt is empty \(no tokens after the chat template\); check the prompt column"),
]


@pytest.mark.parametrize("dataset, error, message", [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_bad_data_is_refused_before_any_model_loads(dataset, error, message, tokenizer):
    from verl_hf.data import prepare_prompts

    with pytest.raises(error, match=message):
        prepare_prompts(dataset, tokenizer, None, 16, "train")


# ---------------------------------------------------------------- models, rewards and callbacks at set-up
def _missing_policy(tmp_path, warm):
    return dict(model=str(tmp_path / "no-such-model"))


def _a_number_as_the_policy(tmp_path, warm):
    return dict(model=42)


def _missing_reward_model(tmp_path, warm):
    return dict(model=warm, args_extra=dict(reward_model_path=[str(tmp_path / "no-rm")], reward_funcs=None,
                                            reward_weights=None))


def _missing_critic(tmp_path, warm):
    return dict(model=warm, args_extra=dict(adv_estimator="gae", critic_model_path="./no-such-critic"))


def _truncated_weights(tmp_path, warm):
    import shutil

    copy = tmp_path / "truncated"
    shutil.copytree(warm, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a copy that stopped early
    return dict(model=str(copy))


def _missing_reference(tmp_path, warm):
    return dict(model=warm, ref_policy=str(tmp_path / "no-such-ref"), args_extra=dict(kl_coef=0.1))


def _tokenizer_too_big(tmp_path, warm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(warm)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(64)])
    tokenizer.pad_token = "<extra_63>"  # an id the model has no embedding for (extra tokens alone would be fine)
    return dict(model=warm, processing_class=tokenizer)


def _guard_that_cannot_fire(tmp_path, warm):
    from verl_hf.callbacks import KLGuardCallback

    return dict(model=warm, callbacks=[KLGuardCallback(max_kl=0.5)])


def _tools_without_a_chat_template(tmp_path, warm):
    from verl_hf.demo.tools_task import multiply

    return dict(model=warm, tools=[multiply])  # the addition demo's tokenizer has no chat template


def _unknown_tool_call_parser(tmp_path, warm):
    from verl_hf.demo import TOOLS_WARM_START_DIR

    return dict(model=str(TOOLS_WARM_START_DIR), args_extra=dict(tools=["verl_hf.demo.tools_task:multiply"],
                                                                  tool_call_parser="xml"))


def _mistral_parser_for_a_hermes_template(tmp_path, warm):
    from transformers import AutoTokenizer

    from verl_hf.demo import TOOLS_WARM_START_DIR

    tokenizer = AutoTokenizer.from_pretrained(TOOLS_WARM_START_DIR)
    tokenizer.chat_template = (Path(__file__).parent / "chat_templates" / "qwen2_5_instruct.jinja").read_text()
    return dict(model=str(TOOLS_WARM_START_DIR), processing_class=tokenizer,
                args_extra=dict(tools=["verl_hf.demo.tools_task:multiply"], tool_call_parser="mistral"))


def _multi_turn_setting_without_multi_turn(tmp_path, warm):
    return dict(model=warm, args_extra=dict(max_tool_calls=2))


class _Echo:
    """An environment that ends every conversation at once."""

    def reset(self, row):
        return None

    def step(self, message):
        from verl_hf.agent import Step

        return Step(done=True)


def _tool_limit_with_an_environment(tmp_path, warm):
    from verl_hf.demo import TOOLS_WARM_START_DIR

    return dict(model=str(TOOLS_WARM_START_DIR), environment=_Echo, args_extra=dict(tool_timeout_s=5.0))


def _a_tool_path_that_does_not_load(tmp_path, warm):
    return dict(model=warm, args_extra=dict(tools=["verl_hf.demo.tools_task:mulitply"]))


SETUP_CASES = [
    ("tools with a tokenizer without a chat template", _tools_without_a_chat_template, ValueError,
     r"multi-turn rollouts need a tokenizer with a chat template \(tokenizer.chat_template is None\)"),
    ("an unknown tool-call parser", _unknown_tool_call_parser, ValueError,
     r"tool_call_parser='xml': unknown; built in: \['hermes', 'llama3_json', 'mistral', 'pythonic'\], or pass a callable"),
    ("a tool-call parser for another format than the template's", _mistral_parser_for_a_hermes_template, ValueError,
     r"tool_call_parser='mistral' reads \[TOOL_CALLS\] calls, but the chat template teaches the model "
     r"<tool_call>\{json\}</tool_call> \(it says '<tool_call>'\): set tool_call_parser='hermes'"),
    ("a multi-turn setting without multi-turn", _multi_turn_setting_without_multi_turn, ValueError,
     r"max_tool_calls=2 takes effect only when tools are given: tools=\[...\] on VerlTrainer"),
    ("a tool limit with an environment", _tool_limit_with_an_environment, ValueError,
     r"tool_timeout_s=5.0 takes effect only when tools are given.*Why: an environment= enforces its own limits"),
    ("a tool path that does not load", _a_tool_path_that_does_not_load, ValueError,
     r"tool 'verl_hf.demo.tools_task:mulitply': 'verl_hf.demo.tools_task' has no callable named 'mulitply'; check"),
    ("a number as the policy", _a_number_as_the_policy, TypeError,
     r"model must be an id, a path or a PreTrainedModel, got int 42"),
    ("a policy path that does not exist", _missing_policy, FileNotFoundError,
     r"model='.*no-such-model': no such file or directory \(a local path"),
    ("a reward model path that does not exist", _missing_reward_model, FileNotFoundError,
     r"reward_model_path\[0\]='.*no-rm': no such file or directory"),
    ("a truncated weights file", _truncated_weights, ValueError,
     r"model='.*truncated': its weights file cannot be read .*; it is truncated or damaged. Copy or download"),
    ("a reference path that does not exist", _missing_reference, FileNotFoundError,
     r"ref_policy='.*no-such-ref': no such file or directory"),
    ("a critic path that does not exist", _missing_critic, FileNotFoundError,
     r"critic_model_path='./no-such-critic': no such file or directory"),
    ("a tokenizer larger than the model's vocabulary", _tokenizer_too_big, ValueError,
     r"token ids \{'pad': \d+\} are beyond the model's embedding \(\d+ rows.*resize_token_embeddings"),
    ("a KL guard with KL off", _guard_that_cannot_fire, ValueError,
     r"KLGuardCallback\(max_kl=0.5\) can never fire: with kl_coef=0.*set kl_coef > 0"),
]


@pytest.mark.parametrize("make, error, message", [c[1:] for c in SETUP_CASES], ids=[c[0] for c in SETUP_CASES])
def test_bad_setup_is_refused_before_training(make, error, message, tmp_path, warm_start_dir, addition):
    from conftest import small_config

    from verl_hf import VerlTrainer

    given = make(tmp_path, str(warm_start_dir))
    args = small_config(tmp_path, max_steps=1, **given.pop("args_extra", {}))
    with pytest.raises(error, match=message):
        VerlTrainer(args=args, train_dataset=addition[0], **given)


def test_a_metric_never_logged_is_reported_at_the_first_log(tmp_path, warm_start_dir, addition):
    from conftest import small_config

    from verl_hf import VerlTrainer
    from verl_hf.callbacks import RewardTargetStoppingCallback

    trainer = VerlTrainer(model=str(warm_start_dir), args=small_config(tmp_path, max_steps=2),
                          train_dataset=addition[0], callbacks=[RewardTargetStoppingCallback(0.9, metric="reward/meen")])
    with pytest.raises(ValueError, match=r"metric='reward/meen'\) waits for a metric this run does not log; closest "
                                         r"logged: \['reward/mean'"):
        trainer.train()
    assert trainer.state.global_step == 1  # said at the first log, not after the run


# ---------------------------------------------------------------- the command line
CLI_CASES = [
    ("YAML syntax error", "max_steps: [1, 2\n", [], r"bad\.yaml:2:1: not valid YAML"),
    ("YAML that is not a mapping", "- a\n- b\n", [], r"bad\.yaml: a config is a mapping of field: value, got a list"),
    ("unknown YAML field", "learning_rat: 1e-5\n", [], r"unknown field\(s\) 'learning_rat' \(did you mean 'learning_rate'"),
    ("bad value from a flag", "base_config: demo\n", ["--learning_rate", "-1"], r"learning_rate=-1.0 must be >= 0"),
    ("missing base config", "base_config: nowhere.yaml\n", [], r"base_config 'nowhere.yaml' not found at"),
    ("missing local dataset", "base_config: demo\ndataset_name: ./no-such-data\n", [],
     r"dataset_name='./no-such-data': no such file or directory \(a local path"),
]


def test_a_null_test_split_evaluates_nothing():
    """`dataset_test_split: null` (the field's help: "None: none") means no evaluation, for the demo's task too."""
    from verl_hf.runner import ScriptArguments, load_splits

    train, test = load_splits(ScriptArguments(dataset_test_split=None))
    assert len(train) == 4000 and test is None
    assert len(load_splits(ScriptArguments())[1]) == 200
    with pytest.raises(ValueError, match=r"has splits \['train', 'dev', 'test'\], not 'validation'"):
        load_splits(ScriptArguments(dataset_test_split="validation"))


@pytest.mark.parametrize("text, flags, message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_the_command_line_says_one_clear_line_and_exits_2(text, flags, message, tmp_path, capsys):
    import re

    from verl_hf.cli import main

    config = tmp_path / "bad.yaml"
    config.write_text(text)
    assert main(["train", str(config), "--output_dir", str(tmp_path / "out"), *flags]) == 2
    said = capsys.readouterr().err
    assert re.search(message, said) and said.startswith("verl-hf: error: ") and "Traceback" not in said, said
    traceback_file = re.search(r"\(traceback: (\S+);", said).group(1)
    assert "Traceback (most recent call last)" in Path(traceback_file).read_text()
    from verl_hf.cli import USER_ERRORS

    with pytest.raises(USER_ERRORS, match=message):  # --traceback: the exception itself
        main(["train", str(config), "--output_dir", str(tmp_path / "out"), *flags, "--traceback"])


def test_a_missing_config_file_is_named(tmp_path, capsys):
    from verl_hf.cli import main

    assert main(["train", str(tmp_path / "none.yaml")]) == 2
    assert f"config file '{tmp_path / 'none.yaml'}' does not exist" in capsys.readouterr().err


def test_the_demo_curve_starts_at_the_baseline_evaluation(tmp_path):
    """What people see is true: the evaluation before training (not in the Trainer's fresh log) is the curve's
    first point, so the gain the demo exists to show is on the plot."""
    from verl_hf.runner import plot_curve

    history = [{"step": 50, "reward/mean": 0.4}, {"step": 100, "eval_accuracy": 0.61}, {"step": 200, "eval_accuracy": 0.7}]
    series = plot_curve(history, str(tmp_path / "curve.png"), baseline={"eval_accuracy": 0.315})
    assert series["held-out accuracy"] == [(0, 0.315), (100, 0.61), (200, 0.7)]
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_a_stopping_metric_is_checked_only_against_logs_of_its_kind():
    """Later steps of a multi-step round log no reward/*, and each eval set logs on its own: neither is a
    reason to refuse; a log of the metric's kind without it is."""
    from transformers import TrainerControl, TrainerState

    from verl_hf.callbacks import RewardTargetStoppingCallback

    state, control = TrainerState(), TrainerControl()
    train = RewardTargetStoppingCallback(2.0)
    train.on_log(None, state, control, logs={"loss": 0.1, "reward/mean": 0.5})
    train.on_log(None, state, control, logs={"loss": 0.1})  # step 2 of a round: no reward/* at all
    evals = RewardTargetStoppingCallback(0.9, metric="eval_b_accuracy")
    evals.on_log(None, state, control, logs={"eval_a_accuracy": 0.4, "eval_a_loss": 1.0})  # another set
    evals.on_log(None, state, control, logs={"eval_b_accuracy": 0.5})
    typo = RewardTargetStoppingCallback(0.9, metric="eval_b_acuracy")
    with pytest.raises(ValueError, match=r"closest logged: \['eval_b_accuracy'\]"):
        typo.on_log(None, state, control, logs={"eval_b_accuracy": 0.5})
