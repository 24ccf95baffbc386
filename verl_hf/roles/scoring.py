"""Log-probs (and entropies) of response tokens under a causal LM, without holding the (B, T, V) logits.

`sequence_logprobs(model, batch, ...)` runs the model's own forward (so DDP, DeepSpeed and PEFT wrappers do
their work: gradient hooks, ZeRO-3 gathers, adapters) with the LM head's forward swapped, for that one call,
for a head that maps its hidden states straight to (log-prob, entropy) per token through
`algorithms.linear_logprobs`: the logits exist one chunk of rows at a time. The head is still called once
per forward, as a module, so a ZeRO-3 head is gathered once per micro-batch (and once in backward), never
per chunk.

Models whose forward post-processes the logits (Gemma-2/3 soft-capping, Cohere's logit scale, Granite's
logits scaling, Falcon-H1's multiplier) and heads that are not a plain `nn.Linear` (a LoRA-adapted or
`modules_to_save` head) keep the full-logits path, which gives the same numbers with more memory.

See it work: tests/test_scoring.py.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from ..algorithms import entropy_from_logits, logprobs_from_logits
from ..algorithms.linear_logprobs import linear_logprobs
from ..vision.inputs import join_rows
from ..vision.positions import bidirectional_image_inputs, position_ids

# Config attributes (top level or text config) under which a transformers forward changes the logits after
# the LM head, or slices them.
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "lm_head_multiplier",
                        "output_multiplier", "unpadded_vocab_size")
logger = logging.getLogger(__name__)
_reported: set[str] = set()  # model classes whose full-logits fallback was logged once
# fp32 logits held at once by the chunked path when `chunk_size` is left to us (about 64 MiB).
AUTO_CHUNK_BYTES = 64 * 2**20


def output_head(model) -> torch.nn.Linear | None:
    """The plain `nn.Linear` LM head of `model` (through DDP/DeepSpeed/PEFT wrappers), or None where the
    chunked path cannot stand in for the model's own logits (the reason is logged once per model class)."""
    inner = model
    while hasattr(inner, "module") and isinstance(inner.module, torch.nn.Module):  # DDP, DeepSpeed engines
        inner = inner.module
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    reason = _why_full_logits(getattr(inner, "config", None), head)
    if reason is None:
        return head
    if type(inner).__name__ not in _reported:
        _reported.add(type(inner).__name__)
        logger.info("log-probs of %s use the full logits (logits_chunk_size does not apply): %s",
                    type(inner).__name__, reason)
    return None


def logits_postprocessing(config) -> str | None:
    """The config attribute under which the model's forward changes the logits after its LM head, or None."""
    configs = [config]
    if config is not None and hasattr(config, "get_text_config"):
        configs.append(config.get_text_config(decoder=True))
    post = [name for c in configs for name in LOGIT_POSTPROCESSING if getattr(c, name, None) not in (None, 1, 1.0)]
    return post[0] if post else None


def _why_full_logits(config, head) -> str | None:
    post = logits_postprocessing(config)
    if post:
        return f"its forward changes the logits after the head ({post})"
    if _unwrapped_class(head) is not torch.nn.Linear:
        return f"its head is a {type(head).__name__}, not a plain nn.Linear (e.g. LoRA on lm_head)"
    if "forward" in head.__dict__ or hasattr(head, "_hf_hook"):
        return "its head's forward is already replaced (accelerate hooks: device_map / offload)"
    return None


def _unwrapped_class(module) -> type:
    """The module's own class: FSDP2's `fully_shard` swaps in a subclass (e.g. FSDPLinear) whose forward is
    the original one, run inside FSDP's gather hooks."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    if isinstance(module, FSDPModule):
        return next(c for c in cls.__mro__[1:] if not issubclass(c, FSDPModule))
    return cls


def auto_chunk_size(vocab_size: int) -> int:
    """Rows per chunk so that one chunk of fp32 logits is about `AUTO_CHUNK_BYTES` (at least 16 rows)."""
    return max(16, AUTO_CHUNK_BYTES // (4 * vocab_size))


DIVERGENCE_TEMPORARIES = 8  # (rows, V) fp32 tensors a divergence chunk holds at once in backward (measured below)


def divergence_chunk_size(vocab_size: int) -> int:
    """Rows per chunk for a divergence between the student's and a teacher's distributions (GKD, top-k forward
    KL). Recomputed in backward, a chunk holds both models' logits and log-probs, the mixture and the KL terms at
    once, about DIVERGENCE_TEMPORARIES times one logits chunk, so its rows are that share of auto_chunk_size's:
    a GKD step then peaks within 1.3x of a GRPO step of the same shape (benchmarks/distill_memory.py)."""
    return max(16, auto_chunk_size(vocab_size) // DIVERGENCE_TEMPORARIES)


def per_position(row_divergence):
    """A divergence over rows, row_divergence(hidden (N, H), weight, bias) -> (N,), as `scored_responses(
    divergence=...)` calls it: hidden (B, K, H) -> (B, K), the rows in (b, k) order (flatten(0, 1))."""
    def divergence(hidden, weight, bias):
        batch, positions, _ = hidden.shape
        return row_divergence(hidden.reshape(batch * positions, -1), weight, bias).view(batch, positions)

    return divergence


@contextlib.contextmanager
def head_scores(head: torch.nn.Linear, targets: torch.Tensor, temperature: float, chunk_size: int,
                with_entropy: bool, vocab: int | None = None, divergence=None):
    """While inside, `head(hidden (B, K, H))` returns the log-probs of `targets` (B, K) as (B, K, 1) instead of
    (B, K, V) logits; the entropies (B, K) of that call, when asked for, are yielded in a list, and so are the
    values of `divergence(hidden, weight, bias) -> (B, K)` when given (GKD against a teacher: the same hidden
    states through the same head, gathered once under ZeRO-3).
    `vocab`: normalise over ids [0, vocab) only (a teacher whose trailing rows are padding the student lacks).

    The entropies leave by the list rather than as a second column of the output: a column that the loss
    does not use would still send a zero gradient back and pay for the entropy's backward."""
    entropies, divergences = [], []

    def forward(hidden):
        weight, bias = head.weight, head.bias
        if vocab is not None and vocab < weight.shape[0]:
            weight, bias = weight[:vocab], bias[:vocab] if bias is not None else None
        logprobs, entropy = linear_logprobs(hidden, weight, targets, bias, temperature=temperature,
                                            chunk_size=chunk_size, with_entropy=with_entropy)
        entropies.append(entropy)
        if divergence is not None:
            divergences.append(divergence(hidden, weight, bias))
        return logprobs.unsqueeze(-1)

    # An instance attribute: hooks registered with register_forward_*_hook (ZeRO-3 gathers) still run around
    # it. output_head refuses heads whose forward is already an instance attribute (accelerate's hooks).
    head.forward = forward
    try:
        yield entropies, divergences
    finally:
        del head.forward


def forward_inputs(model, batch) -> dict:
    """The ids, attention mask and positions of the batch's rows, with their images' pixel inputs: positions
    follow the attention mask (left padding shifts them, as `generate` numbered them), or for a model with
    multimodal rotary positions (Qwen2-VL family) are its own, per row (verl_hf/vision/positions.py)."""
    ids, mask = batch.input_ids, batch.attention_mask
    pixels = join_rows(batch.pixels, ids.device)
    if pixels:  # Gemma-3: each image's tokens attend both ways, as in generate
        pixels.update(bidirectional_image_inputs(model, ids))
    return dict(input_ids=ids, attention_mask=mask, position_ids=position_ids(model, ids, mask, pixels.get(
        "image_grid_thw")), **pixels)


def sequence_logprobs(model, batch, temperature: float = 1.0, with_entropy: bool = False,
                      entropy_grad: bool = False, chunk_size: int | None = None, vocab: int | None = None):
    """Log-probs (B, Lr) of the response tokens under `model`, and their entropies (B, Lr) or None: see
    `scored_responses`."""
    logprobs, entropy, _ = scored_responses(model, batch, temperature, with_entropy, entropy_grad, chunk_size, vocab)
    return logprobs, entropy


def scored_responses(model, batch, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                     chunk_size: int | None = None, vocab: int | None = None, divergence=None):
    """(log-probs (B, Lr) of the response tokens under `model`, their entropies (B, Lr) or None, the values of
    `divergence` (B, Lr) or None).

    Positions follow the attention mask (left padding shifts them), exactly as `generate` numbered them.
    Only the response positions go through the LM head (`logits_to_keep`), not the prompt's. Entropies carry
    gradients only with `entropy_grad` (an entropy bonus); as a metric they cost no graph.
    `chunk_size`: rows per LM-head chunk (None: about 64 MiB of logits per chunk; 0: the full-logits path).
    `vocab`: the distributions over ids [0, vocab) only (None: every row of the head).
    `divergence(hidden (B, K, H), weight, bias) -> (B, K)`: computed from the response positions' hidden states
    through the head inside the same forward (GKD); it needs the chunked path (a plain head).
    """
    if chunk_size is not None and chunk_size < 0:
        raise ValueError(f"chunk_size must be >= 0 (0: full logits), got {chunk_size}")
    inputs = dict(**forward_inputs(model, batch), use_cache=False, logits_to_keep=batch.response_ids.shape[1] + 1)
    head = output_head(model) if chunk_size != 0 or divergence is not None else None
    if head is None:
        if divergence is not None:
            raise ValueError(f"{type(model).__name__}: a divergence against a teacher needs a plain nn.Linear LM head "
                             f"whose logits the forward does not change (see output_head's log message).")
        return (*_from_full_logits(model(**inputs).logits[..., :vocab], batch.response_ids, temperature, with_entropy,
                                   entropy_grad), None)
    # Position t predicts token t+1: the last kept position predicts nothing (its target is a dummy 0).
    targets = torch.nn.functional.pad(batch.response_ids, (0, 1))
    rows = chunk_size or auto_chunk_size(head.out_features)
    with head_scores(head, targets, temperature, rows, with_entropy, vocab, divergence) as (entropies, divergences):
        scores = model(**inputs).logits
    if len(entropies) != 1 or scores.shape[-1] != 1:
        # The forward did not call its head module exactly once (a custom forward using head.weight, or
        # several heads): what came back is not log-probs; score this model through the full logits.
        logger.warning("%s did not call its LM head module once per forward; scoring it through the full "
                       "logits (set logits_chunk_size=0 to skip this check)", type(model).__name__)
        if divergence is not None:
            raise ValueError(f"{type(model).__name__} did not call its LM head module once per forward: no "
                             f"divergence against a teacher can be computed from its hidden states.")
        return (*_from_full_logits(model(**inputs).logits[..., :vocab], batch.response_ids, temperature, with_entropy,
                                   entropy_grad), None)
    logprobs = scores[:, :-1, 0]
    entropy = None
    if with_entropy:
        entropy = entropies[0][:, :-1]
        entropy = entropy if entropy_grad and torch.is_grad_enabled() else entropy.detach()
    return logprobs, entropy, divergences[0][:, :-1] if divergences else None


@torch.no_grad()
def response_hidden_states(model, batch) -> torch.Tensor:
    """The hidden states (B, Lr, H) that `model`'s LM head receives at the positions predicting each response
    token (a teacher's side of GKD), without computing its logits; positions follow the attention mask."""
    head = output_head(model)
    if head is None:
        raise ValueError(f"{type(model).__name__}: its hidden states cannot stand in for its logits (see output_head's "
                         f"log message), so no divergence can be computed through its head in chunks.")
    captured = []

    def capture(hidden):
        captured.append(hidden)
        return hidden.new_zeros(*hidden.shape[:-1], 1)

    head.forward = capture
    try:
        model(**forward_inputs(model, batch), use_cache=False, logits_to_keep=batch.response_ids.shape[1] + 1)
    finally:
        del head.forward
    if len(captured) != 1:
        raise ValueError(f"{type(model).__name__} called its LM head module {len(captured)} times in one forward: its "
                         f"hidden states cannot stand in for its logits.")
    return captured[0][:, :-1]


def _from_full_logits(logits, response_ids, temperature, with_entropy, entropy_grad):
    logits = logits[:, :-1].float() / temperature
    logprobs = logprobs_from_logits(logits, response_ids)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return logprobs, entropy
