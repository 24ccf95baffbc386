"""The contract every rollout engine implements: `RolloutEngine`, with what it is given and returns.

An engine turns prompt token ids into sampled responses. It returns right-padded responses with a
`response_mask` that covers each response up to and including its EOS; tokens after EOS, and the padding,
are masked out. A response that reached `max_new_tokens` without EOS is `truncated`.

Only `generate` must be written; everything else the Actor, the trainer and the weight sync ask of an engine
is declared on the base class with a default that is right for an engine sampling from the training model
itself. An engine with its own weights says so (`receives_weights`) and implements the weight methods.

See it work: tests/test_rollout_hf.py.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Iterable

import torch


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int
    num_return_sequences: int = 1
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    return_logprobs: bool = False  # sampling log-probs of the chosen tokens (temperature applied)
    # One seed per prompt: its samples then depend on (seed, sample index) only, not on the rest of the batch
    # or the number of processes (vLLM: SamplingParams.seed per request).
    row_seeds: tuple[int, ...] | None = None
    # MoE routing replay: the experts each forward chose, per token (engines with `returns_routes`).
    return_routes: bool = False


@dataclass
class Rollout:
    """Responses for B = len(prompts) * num_return_sequences rows; rows of one prompt are adjacent.

    prompt_ids (B, Lp) left-padded, prompt_mask (B, Lp), response_ids (B, Lr) right-padded with pad_token_id,
    response_mask (B, Lr), truncated (B,) bool, logprobs (B, Lr) sampling log-probs or None.
    prompt_routes (B, Lp, L, k) / response_routes (B, Lr, L, k): int16 expert ids each token was routed to
    in each MoE layer (verl_hf/routing.py; -1: none recorded), when sampled with `return_routes`.
    versions (B, Lr) long: the label (`label_weights`) of the weights that sampled each token, from an engine
    that `pauses_for_weights`, once every token it returned was sampled by labelled weights; 0 on padding.
    adapter_version: the LoRA adapter version that sampled every row (an engine that `serves_adapters`), else None.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    truncated: torch.Tensor
    logprobs: torch.Tensor | None = None
    prompt_routes: torch.Tensor | None = None
    response_routes: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    adapter_version: int | None = None


class RolloutEngine(abc.ABC):
    """A rollout engine. Subclasses implement `generate`; the other members have safe defaults.

    The weight sync (verl_hf.sync.WeightSync) calls, on an engine that `receives_weights`:
    `weight_names()` once, then per sync `prepare_for_weights()`, `load_weights(bucket)` per bucket (tensors
    cast to `dtype`), `finish_sync()`; `get_weights(names)` only under `sync_verify`. The trainer calls
    `sleep()` once a round is sampled, before its updates.
    """

    receives_weights: bool = False
    """True: the engine keeps its own weights, which the weight sync fills before the first generation and
    after every update (the Actor then owns a WeightSync). False: it samples from the training model."""

    shared_by_processes: bool = False
    """True: one engine serves every training process (e.g. a vLLM server); process 0 alone pushes weights."""

    calls_are_collective: bool = False
    """True: every process of a group must call `generate` equally often (a tensor-parallel colocated vLLM
    samples the group's prompts together); multi-turn rollouts then call it every turn, with no prompts once a
    process's conversations have all ended (it returns an empty Rollout)."""

    serves_requests_concurrently: bool = False
    """True: `generate` may be called from many threads at once inside `serve_while`, each call's prompts
    sampled as they arrive (a server batches them itself, colocated vLLM steps its engine for them); multi-turn
    samples then advance independently (verl_hf/agent/loop.py)."""

    returns_routes: bool = False
    """True: `generate` with `return_routes` fills the Rollout's MoE routes (for routing replay)."""

    keeps_weights: bool = True
    """True: weights the sync loaded stay until it loads others, so a sync may send only the layers that train (an
    engine whose sleep drops its weights sets False: every sync then sends them all)."""

    accepts_images: bool = False
    """True: `generate` takes `pixels=`, the images of vision-language prompts (verl_hf/vision/)."""

    max_images_per_prompt: int | None = None
    """The most images one prompt may hold (None: no limit the engine knows of); multi-turn samples whose
    environment answers with more end before."""

    pauses_for_weights: bool = False
    """True: a weight sync may run while `generate` calls are in flight, inside `paused_for_weights()`: their
    unfinished sequences continue with the new weights once it ends (partial rollouts), and `generate` returns
    each token's weight label in `Rollout.versions`."""

    serves_adapters: bool = False
    """True: the engine applies a LoRA adapter itself (vllm_lora='adapter'): the weight sync pushes the base weights
    once, then only the adapter (`load_adapter`) after every update, and `generate` samples with the latest
    adapter loaded (never with the base alone)."""

    dtype: torch.dtype | None = None
    """The dtype the sync casts weights to before `load_weights`; None pushes them in the training dtype."""

    def serve_while(self, work):
        """`work()`'s result; while it runs, an engine that `serves_requests_concurrently` serves the `generate`
        calls it makes from its threads. Default: just `work()` (a server needs nothing more)."""
        return work()

    @abc.abstractmethod
    def generate(self, prompt_ids: list[list[int]], params: SamplingConfig) -> Rollout:
        """Sample `params.num_return_sequences` responses for each prompt (token ids, no padding). An engine that
        `accepts_images` also takes `pixels=`: one `vision.RowPixels` or None per prompt, the pixel inputs of
        the images whose expanded placeholders are in its ids (passed only when a prompt has images)."""

    def generates_from(self, model: torch.nn.Module) -> bool:
        """True when the engine samples from `model`'s own parameters (then nothing can be stale, also under
        ZeRO-3). Default: False, the engine has weights of its own."""
        return False

    def weight_names(self) -> list[str]:
        """The (plain HF) names of every weight the sync must set, each tied weight once."""
        raise NotImplementedError(self._no_weights("weight_names"))

    def prepare_for_weights(self) -> None:
        """Called before the first bucket of every sync (e.g. wake a sleeping engine's weights). Default: nothing."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy one bucket of (name, full tensor) pairs into the engine; the tensors are valid during the call only."""
        raise NotImplementedError(self._no_weights("load_weights"))

    def finish_sync(self) -> None:
        """Called after the last bucket of every sync (e.g. drop caches computed with the old weights).
        Default: nothing."""

    def load_adapter(self, tensors: dict[str, torch.Tensor], config: dict) -> int:
        """Load a LoRA adapter (PEFT's names, e.g. 'base_model.model.<module>.lora_A.weight'; `config`: the
        adapter_config.json fields) as a new version, free the versions no sampling can use any more, and return
        the new version; `generate` samples with it from now on."""
        raise NotImplementedError(f"{type(self).__name__} does not serve LoRA adapters (serves_adapters=False); "
                                  f"use vllm_lora='merge'.")

    def get_weights(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The engine's current tensors under these names, for `sync_verify`'s bitwise check."""
        raise NotImplementedError(self._no_weights("get_weights") + " (sync_verify needs it; or set sync_verify=False)")

    def label_weights(self, version: int) -> None:
        """Name the weights now loaded (the optimizer steps they have seen): the label `Rollout.versions` gives
        the tokens they sample. Default: nothing (an engine without per-token versions)."""

    def paused_for_weights(self):
        """A context manager (engines that `pauses_for_weights`): generation stops within it, unfinished
        sequences kept, so that a weight sync can load new weights; they continue with those after it."""
        raise NotImplementedError(f"{type(self).__name__} cannot pause generation for a weight sync "
                                  f"(pauses_for_weights=False).")

    def sleep(self) -> None:
        """Free the engine's memory while training updates the weights; the next sync wakes it (an update
        always changes the weights, so a sync comes before the next generation). Default: nothing to free."""

    def _no_weights(self, method: str) -> str:
        return (f"{type(self).__name__} has no {method}: an engine with its own weights sets receives_weights = "
                f"True and implements weight_names, load_weights and get_weights.")


def empty_rollout(with_logprobs: bool) -> Rollout:
    """The Rollout of no prompts (a collective call a process joins with nothing to sample)."""
    nothing = torch.zeros((0, 1), dtype=torch.long)
    return Rollout(nothing, nothing, nothing, nothing, torch.zeros(0, dtype=torch.bool),
                   torch.zeros((0, 1)) if with_logprobs else None)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (len(sequences), longest): ids left-padded with pad_id."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def mask_after_eos(response_ids: torch.Tensor, eos_ids: list[int], pad_id: int):
    """(response_ids with pad after the first EOS, response_mask, truncated).

    The mask keeps tokens up to and including the first EOS. `truncated` marks rows without any EOS.
    """
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, device=response_ids.device))
    # eos_seen[t] = number of EOS strictly before t; a token is valid while no EOS came before it.
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    mask = (eos_before == 0).long()
    ids = response_ids.masked_fill(mask == 0, pad_id)
    truncated = ~is_eos.any(dim=1)
    return ids, mask, truncated
