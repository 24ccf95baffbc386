"""The rollout interface every engine implements (HF `generate` now; vLLM next).

An engine turns prompt token ids into sampled responses. It returns right-padded responses with a
`response_mask` that covers each response up to and including its EOS; tokens after EOS, and the padding,
are masked out. A response that reached `max_new_tokens` without EOS is `truncated`.

See it work: tests/test_rollout_hf.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

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


@dataclass
class Rollout:
    """Responses for B = len(prompts) * num_return_sequences rows; rows of one prompt are adjacent.

    prompt_ids (B, Lp) left-padded, prompt_mask (B, Lp), response_ids (B, Lr) right-padded with pad_token_id,
    response_mask (B, Lr), truncated (B,) bool, logprobs (B, Lr) sampling log-probs or None.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    truncated: torch.Tensor
    logprobs: torch.Tensor | None = None


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], params: SamplingConfig) -> Rollout: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...


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
