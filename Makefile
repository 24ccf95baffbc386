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

.PHONY: demo test install clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) -e '.[test]'
	touch $@

demo: install
	$(VENV)/bin/verl-hf demo $(ARGS)

test: install
	$(PY) -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) demo-output build *.egg-info
