"""`RolloutBatch`: everything one RL step knows about its samples, in one object.

Rows are completions; the rows of one prompt share a `group_ids` value and are adjacent. Fields are filled
stage by stage (rollout, rewards, reference, advantages) and the batch is then cut into micro-batches.

See it work: tests/test_batch.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch


@dataclass
class RolloutBatch:
    """B rows of prompt + response. Shapes: (B, Lp) for prompt_*, (B, Lr) for token-level fields, (B,) else."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    group_ids: torch.Tensor
    truncated: torch.Tensor
    # Python-side data, one entry per row: prompt text/messages, decoded completion, dataset columns.
    prompts: list = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    columns: dict[str, list] = field(default_factory=dict)
    # Filled by later stages.
    rollout_logprobs: torch.Tensor | None = None  # (B, Lr) from the engine, when it reports them
    old_logprobs: torch.Tensor | None = None  # (B, Lr) actor before the update; None = on-policy (use detached)
    ref_logprobs: torch.Tensor | None = None  # (B, Lr)
    values: torch.Tensor | None = None  # (B, Lr) critic values at rollout time (PPO)
    rewards: torch.Tensor | None = None  # (B,) weighted sum over reward functions
    reward_per_function: torch.Tensor | None = None  # (B, F), NaN where a function returned None
    valid: torch.Tensor | None = None  # (B,) False where no reward function scored the row
    token_level_rewards: torch.Tensor | None = None  # (B, Lr)
    advantages: torch.Tensor | None = None  # (B, Lr)
    returns: torch.Tensor | None = None  # (B, Lr)
    # Loss normalisers of the optimizer step this micro-batch belongs to (see algorithms.agg_loss).
    step_num_tokens: float | None = None
    step_num_seqs: float | None = None

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def select(self, index) -> "RolloutBatch":
        """The rows `index` (a slice, a list of ints or a bool tensor), every field cut alike."""
        if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
            index = index.nonzero().flatten().tolist()
        rows = list(range(len(self)))[index] if isinstance(index, slice) else list(index)
        updates = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                updates[f.name] = value[rows]
            elif isinstance(value, list) and value:
                updates[f.name] = [value[i] for i in rows]
            elif isinstance(value, dict):
                updates[f.name] = {k: [v[i] for i in rows] for k, v in value.items()}
        return replace(self, **updates)

    def split(self, size: int) -> list["RolloutBatch"]:
        """Consecutive micro-batches of `size` rows."""
        return [self.select(slice(i, i + size)) for i in range(0, len(self), size)]

    def to(self, device) -> "RolloutBatch":
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **moved)


# The name the single-controller posts use for what `Actor.generate_sequences` returns.
GenerationOutput = RolloutBatch
