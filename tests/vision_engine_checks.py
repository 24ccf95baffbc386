"""What the vision tests measure on any engine that receives weights (colocated vLLM, the vLLM server): the
engine's log-probs against the trainer's forward with one and two images, after a first full sync, a sync with the
tower frozen and one with it trained; token-budget gradients of its samples; and the names each sync pushed."""

import numpy as np
import torch
from PIL import Image

PROMPT_WORDS = "What is in the picture? A red square, a blue circle. 0 1 2 3 4 5 6 7 8 9"


def picture(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))


def image_row(num_images: int, sizes, question: str) -> dict:
    content = [{"type": "image"}] * num_images + [{"type": "text", "text": question}]
    return {"prompt": [{"role": "user", "content": content}],
            "images": [picture(h, w, i) for i, (h, w) in enumerate(sizes)]}


def image_rows(actor) -> list[dict]:
    """One image, two images of other sizes, one image of the first's size turned, and no image."""
    rows = [image_row(1, [(56, 84)], "What is it?"), image_row(2, [(28, 56), (112, 56)], "Which is larger?"),
            image_row(1, [(84, 56)], "What is it?"), {"prompt": [{"role": "user", "content": "No picture here."}],
                                                      "images": []}]
    for i, row in enumerate(rows):
        row["prompt_ids"] = actor.images.prompt_ids(row, f"row {i}")
    return rows


def measure(actor) -> dict:
    """The figures tests/test_vision_vllm.py asserts on, for `actor`'s engine; the policy's tower starts frozen."""
    model, engine, figures = actor.model, actor.engine, {}
    for p in model.model.visual.parameters():
        p.requires_grad_(False)
    pushed = []  # the names each sync hands the engine (the real engine loads them)
    load_weights = engine.load_weights
    engine.load_weights = lambda tensors: (pushed.extend(n for n, _ in tensors), load_weights(tensors))[-1]
    rows = image_rows(actor)

    def sample(seed: int):
        batch = actor.generate_sequences(prompt_ids=[r["prompt_ids"] for r in rows], rows=rows,
                                         num_return_sequences=2, max_new_tokens=12, seed=seed)
        mask = batch.response_mask.bool()
        gaps = {str(size): (actor.get_logprobs(batch, micro_batch_size=size) - batch.rollout_logprobs)[mask]
                .abs().max().item() for size in (None, 1, 3)}
        return batch, {"gaps": gaps, "tokens": int(mask.sum()), "names": list(pushed),
                       "rows_with_pixels": [p is not None for p in batch.pixels]}

    def update_and_sample(seed: int) -> dict:
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.02)
        actor.mark_weights_changed()
        pushed.clear()
        return sample(seed)[1]

    batch, figures["first"] = sample(seed=0)
    pieces, whole, budget = budget_gradients(actor, batch)
    figures["budget_pieces"], figures["budget_gradient_gap"] = pieces, (budget - whole).abs().max().item()
    figures["frozen"] = update_and_sample(seed=1)
    for p in model.model.visual.parameters():
        p.requires_grad_(True)
    figures["unfrozen"] = update_and_sample(seed=2)
    figures["engine_names"] = engine.weight_names()
    engine.load_weights = load_weights
    return figures


def budget_gradients(actor, batch) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(pieces, the gradient of one micro-batch, the gradient of token-budget micro-batches of two rows' worth)."""
    model = actor.model

    def gradient(pieces):
        model.zero_grad()
        for piece in pieces:
            logprobs, _ = actor.compute_logprobs(piece.without_padding())
            (logprobs * piece.response_mask[:, :logprobs.shape[1]]).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    whole = gradient([batch])
    pieces = batch.split_by_tokens(2 * (batch.prompt_ids.shape[1] + batch.response_ids.shape[1]))
    budget = gradient(pieces)
    model.zero_grad()
    return len(pieces), whole, budget
