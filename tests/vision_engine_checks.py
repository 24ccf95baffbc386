"""What the vision tests measure on any engine that receives weights (colocated vLLM, the vLLM server): the
engine's log-probs against the trainer's forward with one and two images, after a first full sync, a sync with the
tower frozen and one with it trained; token-budget gradients of its samples; the names each sync pushed; and
(on every engine, HF generate too) multi-turn conversations whose tool answers with pictures (`multi_turn`)."""

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


def look(text: str):
    """Look again: a picture whose size depends on what was asked (so that a conversation's images differ in size).

    Args:
        text: What to look at.
    """
    rows = 28 * (1 + len(text) % 3)
    return [picture(rows, 56, seed=len(text)), "Here it is."]


def every_turn_looks(text: str):
    """A parser of our own: every turn with text is one call to `look` (a random model writes no tool calls)."""
    from verl_hf.agent import ToolCall

    return [ToolCall("look", {"text": text.strip()[:8]})] if text.strip() else []


def ending_turns(model, eos_token_id: int, scale: float = 60.0) -> None:
    """Make a random model end its turns after a few tokens (its eos logit is scaled up): a multi-turn sample only
    continues after a turn that ends with eos."""
    with torch.no_grad():
        model.get_output_embeddings().weight[eos_token_id] *= scale


def multi_turn(actor, max_new_tokens: int = 6) -> dict:
    """Conversations of up to three turns whose tool answers every turn with a picture and text (`look`), from rows
    with one image, two images and none (4 samples each), through `actor.generate_conversations` on its engine;
    the figures test_vision_multiturn.py and test_vision_vllm.py assert on."""
    from verl_hf.agent import MultiTurnRollout, ToolEnvironment, as_tools

    tokenizer, processor = actor.tokenizer, actor.images.processor
    rows = [r for i, r in enumerate(image_rows(actor)) if i != 2]
    rollout = MultiTurnRollout(lambda: ToolEnvironment(as_tools([look]), every_turn_looks), processor, None,
                               max_turns=3, max_tokens=160, env_timeout_s=30)
    batch, metrics = actor.generate_conversations(rollout, rows, max_new_tokens=max_new_tokens,
                                                  num_return_sequences=4, seed=0)
    model_tokens, env = batch.response_mask.bool(), batch.env_mask.bool()
    scores = actor.get_logprobs(batch)
    image_token = processor.image_token_id
    tool_replies = [sum(1 for m in messages if m["role"] == "tool") for messages in batch.columns["messages"]]
    runs = [_runs(batch.response_ids[r][env[r]].tolist(), image_token) for r in range(len(batch))]
    grids = [p.tensors["image_grid_thw"].prod(dim=1).div(4).long().tolist() if p is not None else []
             for p in batch.pixels]
    return dict(metrics=metrics, logprob_gap=(scores - batch.rollout_logprobs)[model_tokens].abs().max().item(),
                gap_in_ones=(actor.get_logprobs(batch, micro_batch_size=1) - batch.rollout_logprobs)[model_tokens]
                .abs().max().item(), model_tokens=int(model_tokens.sum()), tool_replies=tool_replies,
                sampled_placeholders=int((batch.response_ids[model_tokens] == image_token).sum()),
                prompt_images=[len(rows[r // 4]["images"]) for r in range(len(batch))],
                num_images=[p.num_images if p is not None else 0 for p in batch.pixels], env_image_runs=runs,
                image_tokens=grids, read_later_images=_reads_later_images(actor, batch, scores))


def _runs(ids: list[int], token: int) -> list[int]:
    """The lengths of the runs of `token` in `ids`."""
    lengths = []
    for i, t in enumerate(ids):
        if t == token:
            lengths += [1] if i == 0 or ids[i - 1] != token else []
            lengths[-1] += 0 if i == 0 or ids[i - 1] != token else 1
    return lengths


def _reads_later_images(actor, batch, scores) -> list[tuple[float, float]]:
    """For each conversation whose tool answered with a picture: the largest change of its model tokens' scores
    before and after that picture when the last picture's pixels are changed (before: 0, causal; after: > 0,
    read where it stands)."""
    import dataclasses

    from verl_hf.vision.inputs import RowPixels

    image_token, out = actor.images.processor.image_token_id, []
    for row, pixels in enumerate(batch.pixels):
        in_env = batch.env_mask[row].bool() & (batch.response_ids[row] == image_token)
        if not in_env.any():
            continue
        patches = int(pixels.tensors["image_grid_thw"][-1].prod())  # the last picture's
        values = pixels.tensors["pixel_values"].clone()
        values[-patches:] = values[-patches:].flip(0)
        changed = list(batch.pixels)
        changed[row] = RowPixels({**pixels.tensors, "pixel_values": values}, pixels.num_images, pixels.images)
        diff = (actor.get_logprobs(dataclasses.replace(batch, pixels=changed))[row] - scores[row]).abs()
        at, model = int(in_env.nonzero()[-1]), batch.response_mask[row].bool()
        before, after = diff[:at][model[:at]], diff[at:][model[at:]]
        out.append((before.max().item() if len(before) else 0.0, after.max().item() if len(after) else float("nan")))
    return out


def assert_multi_turn(figures: dict) -> None:
    """What every engine must show (the figures of `multi_turn`): tools' pictures appended in some
    conversations, each expanded to its own grid's tokens after the prompt's images; log-probs equal to the
    trainer's forward; a later picture changes the scores after it and none before."""
    assert figures["metrics"]["tool_calls/mean"] > 0.5, figures["metrics"]
    appended = [len(runs) for runs in figures["env_image_runs"]]
    assert sum(appended) >= 3 and sum(a > 0 for a in appended) >= 2, figures
    for prompt, runs, grids, count in zip(figures["prompt_images"], figures["env_image_runs"],
                                          figures["image_tokens"], figures["num_images"]):
        assert count == prompt + len(runs) and grids[prompt:] == runs, figures
    assert figures["logprob_gap"] < 1e-4 and figures["gap_in_ones"] < 1e-4, figures
    reads = figures["read_later_images"]
    assert reads and all(before == 0.0 for before, _ in reads), reads
    assert sum(after > 1e-3 for _, after in reads) >= 2, reads
