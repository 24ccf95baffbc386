"""Vision-language rollouts with HF generate on a tiny random-weight Qwen2-VL built locally: the Actor takes the
model's processor, the rows' images go into the prompts and to the engine, each sample keeps its prompt's pixels,
and the trainer's forward scores the samples as the engine sampled them (1e-4, fp32), in micro-batches of any
size; bad image inputs are refused naming the row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image



def _image(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))


def _row(num_images: int, sizes, question: str) -> dict:
    content = [{"type": "image"}] * num_images + [{"type": "text", "text": question}]
    return {"prompt": [{"role": "user", "content": content}],
            "images": [_image(h, w, i) for i, (h, w) in enumerate(sizes)]}


@pytest.fixture(scope="module")
def actor():
    from verl_hf.demo.tiny_vision import build_tiny_qwen2_vl, build_vision_processor
    from verl_hf.roles import Actor

    processor = build_vision_processor(["What is in the picture? A red square, a blue circle. 0 1 2 3 4 5 6 7 8 9"],
                                       vocab_size=300)
    return Actor(build_tiny_qwen2_vl(processor), processor, logits_chunk_size=0)


def _rows(actor):
    rows = [_row(1, [(56, 84)], "What is it?"), _row(2, [(28, 56), (112, 56)], "Which is larger?"),
            _row(1, [(84, 56)], "What is it?"), {"prompt": [{"role": "user", "content": "No picture here."}],
                                                 "images": []}]
    for i, row in enumerate(rows):
        row["prompt_ids"] = actor.images.prompt_ids(row, f"row {i}")
    return rows


def test_engine_logprobs_equal_the_trainers_forward_with_one_and_two_images(actor):
    """Rows with one image, two images of other sizes, one image of the first's size turned (the same number
    of image tokens on another grid) and none; two samples each."""
    rows = _rows(actor)
    batch = actor.generate_sequences(prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, num_return_sequences=2,
                                     max_new_tokens=12, seed=0)
    assert [p is None for p in batch.pixels] == [False] * 6 + [True] * 2
    assert batch.pixels[0] is batch.pixels[1] and batch.pixels[2].num_images == 2
    mask = batch.response_mask.bool()
    for micro_batch_size in (None, 1, 3):
        scored = actor.get_logprobs(batch, micro_batch_size=micro_batch_size)
        gap = (scored - batch.rollout_logprobs)[mask].abs().max()
        assert gap < 1e-4, (micro_batch_size, gap)
    # The first and the third prompts' pixels swapped (each still fits the other's placeholders): other scores.
    swapped = batch.select(list(range(8)))
    swapped.pixels = batch.pixels[4:6] + batch.pixels[2:4] + batch.pixels[0:2] + batch.pixels[6:]
    gap = ((actor.get_logprobs(swapped) - batch.rollout_logprobs) * mask).abs().amax(dim=1)  # per row
    assert gap[:2].max() > 1e-3 and gap[4:6].max() > 1e-3 and gap[2:4].max() < 1e-4


def test_token_budget_micro_batches_give_the_gradient_of_one_micro_batch(actor):
    rows = _rows(actor)
    batch = actor.generate_sequences(prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, num_return_sequences=2,
                                     max_new_tokens=8, seed=1)
    model = actor.model

    def gradient(pieces):
        model.zero_grad()
        for piece in pieces:
            logprobs, _ = actor.compute_logprobs(piece.without_padding())
            (logprobs * piece.response_mask[:, :logprobs.shape[1]]).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    whole = gradient([batch])
    budget = batch.split_by_tokens(2 * (batch.prompt_ids.shape[1] + batch.response_ids.shape[1]))
    assert len(budget) >= 3
    assert torch.allclose(gradient(budget), whole, atol=1e-5, rtol=1e-4)
    model.zero_grad()


def test_bad_image_inputs_are_refused_naming_the_row(actor, tmp_path):
    from verl_hf.roles import Actor

    cases = [({"prompt": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "images": [_image(28, 28, 0)]},
              r"row 0: 1 image\(s\) in column 'images' but 0 image part"),
             ({"prompt": "Describe it.", "images": [_image(28, 28, 0)]}, "row 0: 1 image.* but a text prompt"),
             (_row(2, [(28, 28)], "Two?"), r"row 0: 1 image\(s\) in column 'images' but 2 image part"),
             ({**_row(1, [], "Hi"), "images": [str(tmp_path / "missing.png")]}, "row 0, column 'images': no image file")]
    for row, message in cases:
        with pytest.raises(ValueError, match=message):
            actor.images.prompt_ids(row, "row 0")
    text_actor = Actor(actor.model, actor.tokenizer)
    assert text_actor.images is None
