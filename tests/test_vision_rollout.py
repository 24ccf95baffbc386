"""Vision-language rollouts with HF generate on tiny random-weight Qwen2-VL, Qwen2.5-VL, Gemma-3 and Qwen3-VL-MoE
built locally: the Actor takes the model's processor, the rows' images go into the prompts and to the engine, each
sample keeps its prompt's pixels, and the trainer's forward scores the samples as the engine sampled them (1e-4,
fp32), in micro-batches of any size (the MoE with routing replay and chunked log-probs); bad image inputs are
refused naming the row."""

from __future__ import annotations

import pytest
import torch
from vision_engine_checks import PROMPT_WORDS, budget_gradients, image_row, image_rows, picture


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl", "gemma3", "qwen3_vl_moe"])
def actor(request):
    """A tiny Qwen2-VL (images of any size, 3-D rotary positions), Qwen2.5-VL (the same, windowed attention in its
    tower), Gemma-3 (every image resized to one square, its tokens attending to each other both ways) or
    Qwen3-VL-MoE (16-pixel patches, DeepStack, a mixture of experts in every layer: here with routing replay and
    chunked log-probs, the others on the full logits) and its processor."""
    from verl_hf.demo.tiny_vision import (build_gemma3_processor, build_qwen3_vl_processor, build_tiny_gemma3,
                                          build_tiny_qwen2_5_vl, build_tiny_qwen2_vl, build_tiny_qwen3_vl_moe,
                                          build_vision_processor)
    from verl_hf.roles import Actor

    words = [PROMPT_WORDS]
    if request.param == "gemma3":
        processor = build_gemma3_processor(words, vocab_size=300)
        return Actor(build_tiny_gemma3(processor), processor, logits_chunk_size=0)
    if request.param == "qwen3_vl_moe":
        processor = build_qwen3_vl_processor(words, vocab_size=300)
        return Actor(build_tiny_qwen3_vl_moe(processor), processor, logits_chunk_size=5, routing_replay=True)
    processor = build_vision_processor(words, vocab_size=300)
    build = build_tiny_qwen2_5_vl if request.param == "qwen2_5_vl" else build_tiny_qwen2_vl
    return Actor(build(processor), processor, logits_chunk_size=0)


def test_engine_logprobs_equal_the_trainers_forward_with_one_and_two_images(actor):
    """Rows with one image, two images of other sizes, one image of the first's size turned (the same number
    of image tokens on another grid) and none; two samples each."""
    rows = image_rows(actor)
    batch = actor.generate_sequences(prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, num_return_sequences=2,
                                     max_new_tokens=12, seed=0)
    assert [p is None for p in batch.pixels] == [False] * 6 + [True] * 2
    assert batch.pixels[0] is batch.pixels[1] and batch.pixels[2].num_images == 2
    mask = batch.response_mask.bool()
    for micro_batch_size in (None, 1, 3):
        scored = actor.get_logprobs(batch, micro_batch_size=micro_batch_size)
        gap = (scored - batch.rollout_logprobs)[mask].abs().max()
        assert gap < 1e-4, (micro_batch_size, gap)
    if actor.routing is not None:  # every prompt token routed, image tokens included; the forwards replayed them
        image_tokens = batch.prompt_ids == actor.images.processor.image_token_id
        assert image_tokens.sum() > 20 and (batch.prompt_routes[image_tokens] >= 0).all()
        assert actor.routing_metrics()["moe/replay_agreement"] == 1.0
    # The first and the third prompts' pixels swapped (each still fits the other's placeholders): other scores.
    swapped = batch.select(list(range(8)))
    swapped.pixels = batch.pixels[4:6] + batch.pixels[2:4] + batch.pixels[0:2] + batch.pixels[6:]
    gap = ((actor.get_logprobs(swapped) - batch.rollout_logprobs) * mask).abs().amax(dim=1)  # per row
    assert gap[:2].max() > 1e-3 and gap[4:6].max() > 1e-3 and gap[2:4].max() < 1e-4


def test_token_budget_micro_batches_give_the_gradient_of_one_micro_batch(actor):
    rows = image_rows(actor)
    batch = actor.generate_sequences(prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, num_return_sequences=2,
                                     max_new_tokens=8, seed=1)
    pieces, whole, budget = budget_gradients(actor, batch)
    assert pieces >= 3
    assert torch.allclose(budget, whole, atol=1e-5, rtol=1e-4)


def test_bad_image_inputs_are_refused_naming_the_row(actor, tmp_path):
    from verl_hf.roles import Actor

    text_only = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    cases = [({"prompt": text_only, "images": [picture(28, 28, 0)]},
              r"row 0: 1 image\(s\) in column 'images' but 0 image part"),
             ({"prompt": "Describe it.", "images": [picture(28, 28, 0)]}, "row 0: 1 image.* but a text prompt"),
             (image_row(2, [(28, 28)], "Two?"), r"row 0: 1 image\(s\) in column 'images' but 2 image part"),
             ({**image_row(1, [], "Hi"), "images": [str(tmp_path / "missing.png")]},
              "row 0, column 'images': no image file"),
             ({"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://a.b/c.png"}},
                                                       {"type": "text", "text": "Hi"}]}], "images": []},
              "row 0: message 0 has a 'image_url' part, which is not read here"),
             (image_row(1, [(28, 28)], f"And {actor.images.processor.image_token}?"),
              "row 0: its rendered prompt holds another number of image placeholders than its 1 image")]
    for row, message in cases:
        with pytest.raises(ValueError, match=message):
            actor.images.prompt_ids(row, "row 0")
    text_actor = Actor(actor.model, actor.tokenizer)
    assert text_actor.images is None
