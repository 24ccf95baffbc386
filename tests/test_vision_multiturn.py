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


def test_the_engines_image_limit_ends_a_sample_and_sampled_placeholders_cut_a_turn(vlm):
    """An engine that takes at most two images per prompt: a conversation ends ("budget") before a reply would
    bring a third. A turn that samples an image placeholder ends before it ("image_token"): no model token is one,
    and the forward over the conversations still equals the sampling log-probs."""
    from verl_hf.roles import Actor

    model, processor = vlm
    actor = Actor(model, processor, logits_chunk_size=0)
    actor.engine.max_images_per_prompt = 2
    figures = multi_turn(actor)
    assert max(figures["num_images"]) <= 2 and figures["metrics"]["stop/budget"] > 0, figures
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


def test_what_cannot_show_a_picture_is_said_naming_the_sample(vlm, tmp_path):
    """A picture answered to a run without a processor, an image part without its image, an unreadable path, a
    template that renders no placeholder for an image: each an error that names the sample and the fix."""
    from verl_hf.agent import MultiTurnRollout, Step, ToolEnvironment, as_tools
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
    template, processor.tokenizer.chat_template = processor.tokenizer.chat_template, CHAT_TEMPLATE
    try:  # CHAT_TEMPLATE renders a message's content as it is: no placeholder for its picture
        with pytest.raises(ValueError, match=r"the chat template rendered 0 image placeholder\(s\) for 1 image\(s\)"):
            play(actor, answering([{"type": "image", "image": Image.new("RGB", (28, 28))}]), processor)
    finally:
        processor.tokenizer.chat_template = template


def pictures_seen(completions, messages, **kwargs) -> list[float]:
    """The pictures the tool showed (reward functions get each conversation's messages, images in them)."""
    return [float(sum(isinstance(part, dict) and isinstance(part.get("image"), Image.Image)
                      for m in conversation if m["role"] == "tool" for part in m["content"])) for conversation in messages]


def test_grpo_with_a_tool_that_returns_pictures_trains(vlm, tmp_path):
    """VerlTrainer(tools=[look]) with the processor, on rows with a picture and rows without (the tool brings
    theirs): two GRPO steps that play several turns, train the language model and leave the frozen tower; the
    reward functions see the tool's pictures in the conversations' messages. (It trains the module's model: last.)"""
    from datasets import Dataset

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
                          tools=[look])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "turns/mean" in h]
    assert len(logs) == 2 and logs[0]["turns/mean"] > 1.5 and logs[0]["reward/mean"] > 0, logs
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)
    assert all(torch.equal(p.detach(), tower[n]) for n, p in model.named_parameters() if n in tower)
