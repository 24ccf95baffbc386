"""Shared fixtures: the shipped tiny warm-start model and the synthetic addition task. No network."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def warm_start_dir():
    from verl_hf.demo import WARM_START_DIR

    return str(WARM_START_DIR)


@pytest.fixture(scope="session")
def tokenizer(warm_start_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(warm_start_dir)


@pytest.fixture()
def policy(warm_start_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(warm_start_dir)


@pytest.fixture(scope="session")
def addition():
    """(train, test) splits of the demo task without the SFT target column."""
    from verl_hf.demo.task import demo_splits

    train, _, test = demo_splits(seed=0, num_train=2000, num_test=100, num_dev=10)
    return train.remove_columns("completion"), test.remove_columns("completion")


def small_config(tmp_path, **overrides):
    from verl_hf import VerlConfig

    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=32, num_generations=4, learning_rate=1e-4,
        lr_scheduler_type="constant", max_prompt_length=32, max_response_length=12, max_steps=4,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
        per_device_eval_batch_size=100, reward_funcs=["gsm8k", "gsm8k_format"], reward_weights=[1.0, 0.1], seed=0,
        bf16=False,  # fp32: these tests compare numbers exactly; the bf16 default has its own tests
    )
    values.update(overrides)
    return VerlConfig(**values)
