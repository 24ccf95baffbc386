"""Multi-turn rollouts whose tools and environments answer with images, on a tiny random-weight Qwen2-VL with HF
generate (colocated vLLM and the vLLM server: tests/test_vision_vllm.py): every answer's placeholders are
expanded to its image's tokens, the images travel with the conversation in the order their tokens appear, every
turn sees all of them, the sampling log-probs equal the trainer's forward, and a later turn's image is read where
it stands; VerlTrainer trains with such a tool; what cannot work is said, naming the sample."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from conftest import small_config
from vision_engine_checks import (PROMPT_WORDS, assert_multi_turn, ending_turns, every_turn_looks, look,
                                  multi_turn, picture)


@pytest.fixture(scope="module")
def vlm():
    """A tiny random Qwen2-VL that ends its turns after a few tokens, and its processor."""
    from verl_hf.demo.tiny_vision import build_tiny_qwen2_vl, build_vision_processor

    processor = build_vision_processor([PROMPT_WORDS], vocab_size=300)
    model = build_tiny_qwen2_vl(processor)
    ending_turns(model, processor.tokenizer.eos_token_id)
    return model, processor


def test_a_tool_that_returns_a_picture_on_hf_generate(vlm):
    """Rows with one picture, two and none, four samples each, three turns; `look` answers every turn with a
    picture of another size and text (tests/vision_engine_checks.py)."""
    from verl_hf.roles import Actor

    model, processor = vlm
    assert_multi_turn(multi_turn(Actor(model, processor, logits_chunk_size=0)))


class PictureGame:
    """An environment of our own: it opens with a picture (reset), answers the first turn with another picture as
    a user message, and ends after the second turn with a reward."""

    def reset(self, row):
        return [{"role": "user", "content": [{"type": "image", "image": picture(56, 56, 0)},
                                             {"type": "text", "text": "What is it?"}]}]

    def step(self, message):
        from verl_hf.agent import Step

        self.turns = getattr(self, "turns", 0) + 1
        if self.turns == 2:
            return Step(reward=1.0, done=True)
        return Step([{"role": "user", "content": [{"type": "text", "text": "And this?"},
                                                  {"type": "image", "image": picture(28, 84, 1)}]}])


def test_an_environment_opens_and_answers_with_pictures(vlm):
    """reset() opens with a picture, step() answers with another: both expanded in the conversation's ids, both
    in its pixels in that order, and the log-probs match the trainer's forward."""
    from verl_hf.agent import MultiTurnRollout
    from verl_hf.roles import Actor

    model, processor = vlm
    actor = Actor(model, processor, logits_chunk_size=0)
    rollout = MultiTurnRollout(PictureGame, processor, None, max_turns=2, max_tokens=96, env_timeout_s=30)
    rows = [{"prompt": [{"role": "user", "content": "unused"}], "prompt_ids": [0]}] * 4
    batch, metrics = actor.generate_conversations(rollout, rows, max_new_tokens=6, seed=0)
    image_token = processor.image_token_id
    opening, answer = (processor.image_processor(images=[picture(*size, seed)])["image_grid_thw"][0].tolist()
                       for size, seed in [((56, 56), 0), ((28, 84), 1)])
    continued = [r for r in range(len(batch)) if batch.env_mask[r].any()]
    assert continued, metrics
    for r in range(len(batch)):
        grids = batch.pixels[r].tensors["image_grid_thw"].tolist()
        assert grids[0] == opening and int((batch.prompt_ids[r] == image_token).sum()) == opening[1] * opening[2] // 4
        in_response = int((batch.response_ids[r] == image_token).sum())
        assert (grids[1:], in_response) == (([answer], answer[1] * answer[2] // 4) if r in continued else ([], 0))
    model_tokens = batch.response_mask.bool()
    assert (actor.get_logprobs(batch) - batch.rollout_logprobs)[model_tokens].abs().max() < 1e-4


def test_gemma3_conversations_with_pictures(vlm):
    """A tiny Gemma-3 (each image 4 soft tokens between its markers, attended both ways) through PictureGame:
    the answer's picture expanded in the conversation, both pictures in its pixels, log-probs equal the trainer's."""
    from verl_hf.agent import MultiTurnRollout
    from verl_hf.demo.tiny_vision import build_gemma3_processor, build_tiny_gemma3
    from verl_hf.roles import Actor

    processor = build_gemma3_processor([PROMPT_WORDS], vocab_size=300)
    model = build_tiny_gemma3(processor)
    ending_turns(model, processor.tokenizer.eos_token_id)
    actor = Actor(model, processor, logits_chunk_size=0)
    rollout = MultiTurnRollout(PictureGame, processor, None, max_turns=2, max_tokens=96, env_timeout_s=30)
    rows = [{"prompt": [{"role": "user", "content": "unused"}], "prompt_ids": [0]}] * 6
    batch, metrics = actor.generate_conversations(rollout, rows, max_new_tokens=6, seed=0)
    soft = processor.tokenizer.image_token_id
    continued = [r for r in range(len(batch)) if batch.env_mask[r].any()]
    assert continued, metrics
    for r in range(len(batch)):
        answered = r in continued
        assert batch.pixels[r].num_images == 1 + answered and int((batch.prompt_ids[r] == soft).sum()) == 4
        assert int((batch.response_ids[r] == soft).sum()) == 4 * answered
    model_tokens = batch.response_mask.bool()
    assert (actor.get_logprobs(batch) - batch.rollout_logprobs)[model_tokens].abs().max() < 1e-4


def test_the_engines_image_limit_ends_a_sample_and_sampled_placeholders_cut_a_turn(vlm):
    """An engine that takes at most two images per prompt: a conversation ends ("max_images") before a reply would
    bring a third. A turn that samples an image placeholder ends before it ("image_token"): no model token is one,
    and the forward over the conversations still equals the sampling log-probs."""
    from verl_hf.roles import Actor

    model, processor = vlm
    actor = Actor(model, processor, logits_chunk_size=0)
    actor.engine.max_images_per_prompt = 2
    figures = multi_turn(actor)
    assert max(figures["num_images"]) <= 2 and figures["metrics"]["stop/max_images"] > 0, figures
    assert figures["logprob_gap"] < 1e-4
    weights = model.get_output_embeddings().weight
    kept = weights[processor.image_token_id].detach().clone()
    with torch.no_grad():  # now most turns sample an image placeholder
        weights[processor.image_token_id] *= 1000
    actor.engine.max_images_per_prompt = None
    cut = multi_turn(actor)
    with torch.no_grad():
        weights[processor.image_token_id] = kept
    assert cut["metrics"]["stop/image_token"] >= 0.5 and cut["sampled_placeholders"] == 0, cut["metrics"]
    assert cut["logprob_gap"] < 1e-4


def lambda_empty(text: str):
    """A tool that returns an empty picture.

    Args:
        text: Ignored.
    """
    return Image.new("RGB", (0, 0))


lambda_empty.__name__ = "look"


def test_what_cannot_show_a_picture_is_said_naming_the_sample(vlm, tmp_path):
    """A picture answered to a run without a processor, an image part without its image, an unreadable path, an
    image_url part: each an error that names the sample and the fix. A placeholder in an answer's text ends that
    sample; a tool's empty picture is an error result; a template that renders no placeholder for an answer's
    image is refused when the rollout is built."""
    import asyncio

    from verl_hf.agent import MultiTurnRollout, Step, ToolCall, ToolEnvironment, as_tools
    from verl_hf.agent.tools import answer
    from verl_hf.demo.tiny import CHAT_TEMPLATE
    from verl_hf.roles import Actor

    model, processor = vlm
    rows = [{"prompt": [{"role": "user", "content": "Look."}],
             "prompt_ids": processor.tokenizer.apply_chat_template([{"role": "user", "content": "Look."}],
                                                                   add_generation_prompt=True, return_dict=False)}]

    def answering(content):
        class Answers:
            def reset(self, row):
                return None

            def step(self, message):
                return Step([{"role": "user", "content": content}])
        return Answers

    def play(actor, make_env, tokenizer):
        rollout = MultiTurnRollout(make_env, tokenizer, None, max_turns=3, max_tokens=96, env_timeout_s=30)
        return actor.generate_conversations(rollout, rows * 4, max_new_tokens=6, seed=0)

    text_actor = Actor(model, processor.tokenizer, logits_chunk_size=0)
    text_rollout = MultiTurnRollout(lambda: ToolEnvironment(as_tools([look]), every_turn_looks), processor.tokenizer,
                                    None, max_turns=3, max_tokens=96, env_timeout_s=30)
    with pytest.raises(ValueError, match=r"the environment's answer to sample \d+ has 1 image\(s\), but this rollout "
                                         r"has no vision-language processor"):
        text_actor.generate_conversations(text_rollout, rows * 4, max_new_tokens=6, seed=0)
    actor = Actor(model, processor, logits_chunk_size=0)
    with pytest.raises(ValueError, match=r"message 0 has an image part without its image; give \{'type': 'image', "
                                         r"'image'"):
        play(actor, answering([{"type": "image"}]), processor)
    with pytest.raises(ValueError, match=r"message 0, image 0: no image file at '.*nowhere.png'"):
        play(actor, answering([{"type": "image", "image": str(tmp_path / "nowhere.png")}]), processor)
    (tmp_path / "broken.png").write_bytes(b"not a picture")
    with pytest.raises(ValueError, match=r"cannot read the image"):
        play(actor, answering([{"type": "image", "path": str(tmp_path / "broken.png")}]), processor)
    with pytest.raises(ValueError, match=r"message 0 has a 'image_url' part, which is not read here \(URLs are not "
                                         r"fetched"):
        play(actor, answering([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]), processor)
    # a placeholder in an answer's text (e.g. echoed by a tool): the sample ends there, the run goes on
    batch, metrics = play(actor, answering("Here: <|image_pad|>"), processor)
    assert metrics["stop/image_error"] > 0 and not (batch.response_ids == processor.image_token_id).any()
    empty = asyncio.run(answer(ToolCall("look", {"text": ""}), as_tools([lambda_empty]), 5))
    assert (empty.status, empty.content) == ("error", "Error: look returned an empty image (0x0 pixels).")
    template = processor.tokenizer.chat_template
    try:  # CHAT_TEMPLATE renders a message's content as it is: no placeholder for its picture; refused when built
        processor.tokenizer.chat_template = CHAT_TEMPLATE
        with pytest.raises(ValueError, match=r"the chat template cannot show an image in a 'user' message \(a 'user' "
                                             r"reply with an image: its ids hold 0 image placeholder"):
            MultiTurnRollout(answering(""), processor, None, max_turns=3, max_tokens=96, env_timeout_s=30)
    finally:
        processor.tokenizer.chat_template = processor.chat_template = template


def test_an_opening_with_pictures_is_checked_against_its_limits(vlm):
    """reset() messages with more images than the engine takes, or more tokens than max_prompt_length: refused
    naming the sample; a text run refuses parts in reset()'s content."""
    from verl_hf.agent import MultiTurnRollout
    from verl_hf.roles import Actor

    model, processor = vlm
    actor = Actor(model, processor, logits_chunk_size=0)
    rows = [{"prompt": [{"role": "user", "content": "unused"}], "prompt_ids": [0]}]
    actor.engine.max_images_per_prompt = 0
    try:
        with pytest.raises(ValueError, match=r"environment.reset's messages for sample 0 hold 1 images; the rollout "
                                             r"engine takes at most 0 per prompt"):
            actor.generate_conversations(MultiTurnRollout(PictureGame, processor, None, 2, 96, 30), rows,
                                         max_new_tokens=4)
    finally:
        actor.engine.max_images_per_prompt = None
    short = MultiTurnRollout(PictureGame, processor, None, 2, 96, 30, max_prompt_tokens=8)
    with pytest.raises(ValueError, match=r"environment.reset opened sample 0 with \d+ tokens, more than "
                                         r"max_prompt_length=8"):
        actor.generate_conversations(short, rows, max_new_tokens=4)
    text = MultiTurnRollout(PictureGame, processor.tokenizer, None, 2, 96, 30)
    with pytest.raises(TypeError, match=r"a non-empty list of \{'role', 'content'\} messages \(content: text\)"):
        Actor(model, processor.tokenizer).generate_conversations(text, rows, max_new_tokens=4)


def test_the_front_door_says_what_a_vision_run_with_tools_cannot_do(vlm, tmp_path):
    """VerlTrainer with tools and the processor is a vision run even on text rows: what cannot carry images is
    refused naming the way back to a text run; text prompts are refused with the fix, before any model loads."""
    from datasets import Dataset

    from verl_hf import VerlTrainer

    model, processor = vlm
    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": "Look."}]}] * 2)
    with pytest.raises(ValueError, match=r"multi-turn rollouts with a vision-language processor .*adv_estimator='gae'"
                                         r".* \(or pass processing_class=processor.tokenizer for a text run"):
        VerlTrainer(model=model, args=small_config(tmp_path, adv_estimator="gae", tool_call_parser=every_turn_looks),
                    processing_class=processor, train_dataset=chat, tools=[look])
    text = Dataset.from_list([{"prompt": "Look.", "images": [picture(28, 28, 0)]}] * 2)
    with pytest.raises(ValueError, match=r"train row 0: multi-turn rollouts .* need chat prompts"):
        VerlTrainer(model=model, args=small_config(tmp_path, tool_call_parser=every_turn_looks),
                    processing_class=processor, train_dataset=text, tools=[look])


def pictures_seen(completions, messages, **kwargs) -> list[float]:
    """The pictures the tool showed (reward functions get each conversation's messages, images in them)."""
    return [float(sum(isinstance(part, dict) and isinstance(part.get("image"), Image.Image)
                      for m in conversation if m["role"] == "tool" for part in m["content"]))
            for conversation in messages]


def test_grpo_with_a_tool_that_returns_pictures_trains(vlm, tmp_path):
    """VerlTrainer(tools=[look]) with the processor, on rows with a picture and rows without (the tool brings
    theirs): two GRPO steps that play several turns, train the language model and leave the frozen tower; the
    reward functions see the tool's pictures in the conversations' messages. (It trains the module's model: last.)"""
    from datasets import Dataset

    from verl_hf.callbacks import CompletionSamplesCallback
    from verl_hf import VerlTrainer

    model, processor = vlm
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
             "images": [picture(56, 56, i)]} for i in range(3)]
    rows += [{"prompt": [{"role": "user", "content": [{"type": "text", "text": "Look at it."}]}], "images": []}] * 3
    tower = {n: p.detach().clone() for n, p in model.named_parameters() if ".visual." in f".{n}"}
    args = small_config(tmp_path, per_device_train_batch_size=6, num_generations=2, max_steps=2, max_prompt_length=64,
                        max_response_length=96, max_turn_length=6, max_turns=3, tool_call_parser=every_turn_looks,
                        reward_funcs=[pictures_seen], reward_weights=[1.0], learning_rate=1e-3)
    trainer = VerlTrainer(model=model, args=args, processing_class=processor, train_dataset=Dataset.from_list(rows),
                          tools=[look], callbacks=[CompletionSamplesCallback(num_samples=12)])
    trainer.train()
    written = (tmp_path / "out" / "completions" / "samples.jsonl").read_text()
    assert "\"<image 56x" in written  # the tool's pictures, named in the conversations
    logs = [h for h in trainer.state.log_history if "turns/mean" in h]
    assert len(logs) == 2 and logs[0]["turns/mean"] > 1.5 and logs[0]["reward/mean"] > 0, logs
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)
    assert all(torch.equal(p.detach(), tower[n]) for n, p in model.named_parameters() if n in tower)
