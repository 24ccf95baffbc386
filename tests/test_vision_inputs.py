"""Vision inputs (verl_hf/vision/): images read from every form a dataset holds them in, or refused naming the
row; each row's pixels kept with it and joined per micro-batch in row order; Qwen2-VL's 3-D rotary positions
computed per row. On a tiny random-weight Qwen2-VL built locally (verl_hf/demo/tiny_vision.py)."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from verl_hf.vision.images import read_image, row_images
from verl_hf.vision.inputs import collapse_placeholders, join_rows, process_row
from verl_hf.vision.positions import position_ids


def _image(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))


@pytest.fixture(scope="module")
def tiny_vlm():
    from verl_hf.demo.tiny_vision import build_tiny_qwen2_vl, build_vision_processor

    processor = build_vision_processor(["What is in the picture? A red square, a blue circle. 0 1 2 3 4 5 6 7 8 9"],
                                       vocab_size=300)
    return build_tiny_qwen2_vl(processor).eval(), processor


def _prompt(processor, num_images: int, question: str) -> str:
    content = [{"type": "image"}] * num_images + [{"type": "text", "text": question}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)


def test_images_are_read_from_pil_paths_bytes_and_dataset_dicts_or_refused_naming_the_row(tmp_path):
    picture = _image(20, 30, 0)
    path = tmp_path / "p.png"
    picture.save(path)
    data = path.read_bytes()
    for value in (picture, str(path), path, data, {"bytes": data, "path": None}, {"bytes": None, "path": str(path)}):
        image = read_image(value, "row 0")
        assert image.size == (30, 20) and image.mode == "RGB"
        assert np.array_equal(np.asarray(image), np.asarray(picture))
    assert [i.size for i in row_images({"images": [str(path), data]}, "images", "row 0")] == [(30, 20)] * 2
    assert row_images({"images": None}, "images", "row 0") == [] and len(row_images({"images": data}, "images", "r")) == 1
    (tmp_path / "broken.png").write_bytes(b"not an image")
    cases = [(str(tmp_path / "missing.png"), "train row 4, column 'images': no image file at"),
             (str(tmp_path / "broken.png"), "train row 4, column 'images': cannot read the image"),
             (b"\x89PNG garbage", "train row 4, column 'images': cannot read the image"),
             (12, "train row 4, column 'images': int is not an image")]
    for value, message in cases:
        with pytest.raises(ValueError, match=message):
            row_images({"images": value}, "images", "train row 4")
    with pytest.raises(ValueError, match="eval row 2, column 'pics', image 1: no image file"):
        row_images({"pics": [data, "nowhere.png"]}, "pics", "eval row 2")


def test_each_placeholder_becomes_its_images_tokens_and_the_pixels_stay_with_the_row(tiny_vlm):
    _, processor = tiny_vlm
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    ids, pixels = process_row(processor, _prompt(processor, 2, "Same?"), [_image(56, 84, 0), _image(112, 56, 1)])
    grids = pixels.tensors["image_grid_thw"]
    assert grids.tolist() == [[1, 4, 6], [1, 8, 4]] and pixels.num_images == 2
    assert pixels.tensors["pixel_values"].shape[0] == 24 + 32  # every patch of both images, in order
    assert ids.count(pad) == (24 + 32) // 4  # 2x2 patches merge into one token
    text_ids, none = process_row(processor, _prompt(processor, 0, "Same?"), [])
    assert none is None and pad not in text_ids
    # vLLM takes the images themselves, with each image's placeholders collapsed back to one
    assert [im.size for im in pixels.images] == [(84, 56), (56, 112)]
    collapsed = collapse_placeholders(ids, pad)
    assert collapsed.count(pad) == 2 and len(collapsed) == len(ids) - (24 + 32) // 4 + 2
    # a checkpoint's round keeps the tensors, not the images (only sampling reads them)
    restored = pickle.loads(pickle.dumps(pixels))
    assert restored.images == () and restored.num_images == 2
    assert all(torch.equal(restored.tensors[k], v) for k, v in pixels.tensors.items())


def _logprobs(model, ids: torch.Tensor, mask: torch.Tensor, pixels: dict, positions) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, **pixels).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


def test_a_micro_batch_of_rows_with_different_images_scores_each_row_as_alone_and_swapped_pixels_do_not(tiny_vlm):
    """Two rows, one with two images and one with a single image of another size, left-padded into one
    micro-batch: each row's log-probs equal those of the row alone (1e-5), with the pixels joined in row order
    and the 3-D positions computed per row. Joined in the other order the log-probs change (the test the
    slicing bug fails), and 1-D positions are wrong."""
    model, processor = tiny_vlm
    rows = [process_row(processor, _prompt(processor, 2, "Which is larger?"), [_image(56, 84, 0), _image(28, 56, 1)]),
            process_row(processor, _prompt(processor, 1, "What is it?"), [_image(112, 56, 2)])]
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r, _ in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r, _ in rows])
    joined = join_rows([p for _, p in rows])
    together = _logprobs(model, ids, mask, joined, position_ids(model, ids, mask, joined["image_grid_thw"]))
    for i, (row_ids, pixels) in enumerate(rows):
        alone_ids, alone_mask = torch.tensor([row_ids]), torch.ones(1, len(row_ids), dtype=torch.long)
        alone = _logprobs(model, alone_ids, alone_mask, pixels.tensors,
                          position_ids(model, alone_ids, alone_mask, pixels.tensors["image_grid_thw"]))
        real = (mask[i, :-1] * mask[i, 1:]).bool()  # a real token after a real one
        assert torch.allclose(together[i][real], alone[0], atol=1e-5), (together[i][real] - alone[0]).abs().max()
    # The same images in the other row's order: same patch count, other pixels under each row's tokens.
    swapped_rows = [rows[0][1], rows[1][1]]
    swapped = {"pixel_values": torch.cat([swapped_rows[1].tensors["pixel_values"],
                                          swapped_rows[0].tensors["pixel_values"]]),
               "image_grid_thw": joined["image_grid_thw"]}
    wrong = _logprobs(model, ids, mask, swapped, position_ids(model, ids, mask, joined["image_grid_thw"]))
    assert (wrong - together)[mask[:, 1:].bool()].abs().max() > 1e-3
    flat = _logprobs(model, ids, mask, joined, (mask.cumsum(1) - 1).clamp(min=0))
    assert (flat - together)[mask[:, 1:].bool()].abs().max() > 1e-4  # 1-D positions: silently wrong


def test_positions_are_the_rows_own_wherever_the_padding_is(tiny_vlm):
    """Computed on a padded batch (prompt left-padded, response right-padded), a row's positions at its real
    tokens equal those of the row alone, so pad columns may be removed afterwards."""
    model, processor = tiny_vlm
    row, pixels = process_row(processor, _prompt(processor, 1, "Size?"), [_image(56, 56, 3)])
    grid = pixels.tensors["image_grid_thw"]
    alone = position_ids(model, torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long), grid)
    padded_ids = torch.tensor([[0, 0] + row + [0]])
    padded_mask = torch.tensor([[0, 0] + [1] * len(row) + [0]])
    padded = position_ids(model, padded_ids, padded_mask, grid)
    assert padded.shape == (4, 1, len(row) + 3)
    assert torch.equal(padded[:, :, 2:-1], alone)
    text_model = torch.nn.Linear(1, 1)  # no rotary index of its own: the text positions
    assert torch.equal(position_ids(text_model, padded_ids, padded_mask), (padded_mask.cumsum(1) - 1).clamp(min=0))
