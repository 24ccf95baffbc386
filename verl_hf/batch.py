"""`RolloutBatch`: everything one RL step knows about its samples, in one object.

Rows are completions; the rows of one prompt share a `group_ids` value and are adjacent in a round (micro-batches
are cut from rows ordered by length, where they need not be). Fields are filled
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
    # Multi-turn rows: each row's messages after its prompt, its `completions` entry for reward functions (TRL's
    # contract, rewards/contract.py); [] for single-turn rows, whose messages are built from the text.
    completion_messages: list = field(default_factory=list)
    # What reward functions passed to `log_extra`: {column: one value per row}, for CompletionSamplesCallback.
    logged_columns: dict[str, list] = field(default_factory=dict)
    # Vision-language rows: each row's pixel inputs (vision.RowPixels, None for a row without images), joined
    # per micro-batch in row order, never sliced (verl_hf/vision/inputs.py); [] when no row has images.
    pixels: list = field(default_factory=list)
    # GKD's dataset share (gkd_lambda < 1): the rows are the dataset's answers, not samples; such a round is not
    # scored and its task advantages are 0 (verl_hf/dataset_answers.py).
    from_dataset: bool = False
    # Filled by later stages.
    rollout_logprobs: torch.Tensor | None = None  # (B, Lr) from the engine, when it reports them
    # (B, Lr) long: the optimizer steps the weights that sampled each token had seen, from an engine that labels
    # its weights (asynchronous training with partial rollouts: a row may span several); None: not recorded.
    rollout_versions: torch.Tensor | None = None
    # (B,) long: the LoRA adapter version that sampled each row, from an engine that serves the adapter
    # (vllm_lora='adapter'); None: merged weights or no LoRA.
    adapter_versions: torch.Tensor | None = None
    # MoE routing replay (verl_hf/routing.py): int16 expert ids per token and MoE layer, -1 = route live.
    prompt_routes: torch.Tensor | None = None  # (B, Lp, L, k)
    response_routes: torch.Tensor | None = None  # (B, Lr, L, k)
    old_logprobs: torch.Tensor | None = None  # (B, Lr) actor before the update; None = on-policy (use detached)
    ref_logprobs: torch.Tensor | None = None  # (B, Lr)
    teacher_logprobs: torch.Tensor | None = None  # (B, Lr) distillation: the teacher's, of the sampled tokens
    # distill_loss='topk_forward_kl': a served teacher's top-k ids and log-probs at each response position
    teacher_topk_ids: torch.Tensor | None = None  # (B, Lr, k) long
    teacher_topk_logprobs: torch.Tensor | None = None  # (B, Lr, k), -inf where there is no entry
    values: torch.Tensor | None = None  # (B, Lr) critic values at rollout time (PPO)
    reward_baselines: torch.Tensor | None = None  # (B,) ReMax: reward of the prompt's greedy response
    rewards: torch.Tensor | None = None  # (B,) weighted sum over reward functions
    reward_per_function: torch.Tensor | None = None  # (B, F), NaN where a function returned None
    valid: torch.Tensor | None = None  # (B,) False where no reward function scored the row
    token_level_rewards: torch.Tensor | None = None  # (B, Lr)
    advantages: torch.Tensor | None = None  # (B, Lr)
    returns: torch.Tensor | None = None  # (B, Lr)
    # Multi-turn rollouts (verl_hf/agent/): the environment's tokens inside the response (1; attended, never
    # trained on: response_mask is 0 there), and an environment's per-turn rewards on each turn's last token.
    env_mask: torch.Tensor | None = None  # (B, Lr)
    turn_rewards: torch.Tensor | None = None  # (B, Lr)
    # Safe-RLHF (cost_funcs / cost_model_path): costs, the cost critic's values and its regression targets.
    costs: torch.Tensor | None = None  # (B,)
    cost_values: torch.Tensor | None = None  # (B, Lr)
    cost_returns: torch.Tensor | None = None  # (B, Lr)
    # The loss normaliser of the optimizer step this micro-batch belongs to (algorithms.LossNorm: mode, the
    # step's token and sequence counts, the constant), set when a round is cut into micro-batches.
    loss_norm: object = None

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def response_attention_mask(self) -> torch.Tensor:
        """(B, Lr) 1 on every real response token: the model's and, in multi-turn rows, the environment's."""
        return self.response_mask if self.env_mask is None else torch.maximum(self.response_mask, self.env_mask)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_attention_mask], dim=1)

    def completion_ids(self) -> list[list[int]]:
        """Each response's token ids up to and including its EOS (what reward functions receive)."""
        return [ids[mask.bool()].tolist() for ids, mask in zip(self.response_ids, self.response_mask)]

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

    def without_padding(self) -> "RolloutBatch":
        """The same rows without the columns that are padding in every row: prompt columns on the left,
        response columns on the right (one response column is always kept). Positions follow the attention
        mask, so every score of the kept tokens is unchanged; a micro-batch then costs its own longest row,
        not the round's."""
        first = int(self.prompt_mask.any(dim=0).int().argmax()) if self.prompt_mask.numel() else 0
        used = self.response_attention_mask.any(dim=0).nonzero()
        end = int(used[-1]) + 1 if len(used) else 1
        if first == 0 and end == self.response_ids.shape[1]:
            return self
        updates = {name: getattr(self, name)[:, :end] for name in TOKEN_FIELDS if getattr(self, name) is not None}
        updates.update({name: getattr(self, name)[:, first:] for name in PROMPT_FIELDS if getattr(self, name) is not None})
        return replace(self, **updates)

    def split_by_tokens(self, max_tokens: int) -> list["RolloutBatch"]:
        """Consecutive pieces, each as many rows as fit in `max_tokens` once padded to the piece's own longest
        prompt and response (rows x (prompt width + response width)); a row longer than that is a piece alone.
        Order the rows by length first (round.by_length) and the pieces pad little (verl's dynamic batch size)."""
        prompt_lens = self.prompt_mask.sum(dim=1).tolist()
        response_lens = self.response_attention_mask.sum(dim=1).tolist()
        pieces, start, widest_prompt, widest_response = [], 0, 0, 0
        for row, (p, r) in enumerate(zip(prompt_lens, response_lens)):
            p, r = max(widest_prompt, p), max(widest_response, max(r, 1))
            if row > start and (row + 1 - start) * (p + r) > max_tokens:
                pieces.append(self.select(slice(start, row)))
                start, p, r = row, prompt_lens[row], max(response_lens[row], 1)
            widest_prompt, widest_response = p, r
        return pieces + [self.select(slice(start, len(self)))] if len(self) else []

    def split(self, size: int) -> list["RolloutBatch"]:
        """Consecutive micro-batches of `size` rows."""
        return [self.select(slice(i, i + size)) for i in range(0, len(self), size)]

    def to(self, device) -> "RolloutBatch":
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **moved)


# Fields shaped (B, Lr, ...): padded on the right when batches are joined; (B, Lp, ...): on the left.
TOKEN_FIELDS = ("response_ids", "response_mask", "rollout_logprobs", "rollout_versions", "old_logprobs",
                "ref_logprobs", "teacher_logprobs", "teacher_topk_ids", "teacher_topk_logprobs", "values",
                "token_level_rewards", "advantages", "returns", "cost_values", "cost_returns", "response_routes",
                "env_mask", "turn_rewards")
PROMPT_FIELDS = ("prompt_ids", "prompt_mask", "prompt_routes")
# What joined batches are padded with, where it is not 0 (pad ids; routes: -1, route live; top-k: no entry).
PAD_VALUES = {"response_routes": -1, "prompt_routes": -1, "teacher_topk_logprobs": -float("inf")}


def row_columns(rows: list[dict], num_return_sequences: int) -> dict[str, list]:
    """The dataset rows' columns (all but the prompt and its ids), each value repeated for the row's
    `num_return_sequences` adjacent samples: what reward functions receive beside the completions."""
    return {k: [row[k] for row in rows for _ in range(num_return_sequences)] for k in rows[0]
            if k not in ("prompt", "prompt_ids")}


def concat_batches(batches: list[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Rows of several batches in one: prompts re-left-padded, responses re-right-padded to the widest.

    Group ids are offset per batch so that groups of different batches never merge.
    """
    prompt_width = max(b.prompt_ids.shape[1] for b in batches)
    response_width = max(b.response_ids.shape[1] for b in batches)
    pads = {name: (prompt_width, "left", PAD_VALUES.get(name, 0)) for name in PROMPT_FIELDS}
    pads["prompt_ids"] = (prompt_width, "left", pad_token_id)
    merged, offset = {}, 0
    for f in fields(RolloutBatch):
        values = [getattr(b, f.name) for b in batches]
        if all(v is None for v in values) or f.name == "loss_norm":
            continue
        if isinstance(values[0], torch.Tensor):
            if f.name in pads or f.name in TOKEN_FIELDS:
                fill = pad_token_id if f.name == "response_ids" else PAD_VALUES.get(f.name, 0)
                width, side, fill = pads.get(f.name, (response_width, "right", fill))
                values = [_pad(v, width, side, fill) for v in values]
            if f.name == "group_ids":
                shifted = []
                for v in values:
                    shifted.append(v - v.min() + offset if len(v) else v)
                    offset = int(shifted[-1].max()) + 1 if len(v) else offset
                values = shifted
            merged[f.name] = torch.cat(values)
        elif isinstance(values[0], list):  # a batch without images has pixels [] where another has one per row
            merged[f.name] = [x for v, b in zip(values, batches) for x in (v or [None] * len(b))] if any(values) else []
        elif isinstance(values[0], dict):  # a column one batch lacks is None in its rows
            keys = dict.fromkeys(k for v in values for k in v)
            merged[f.name] = {k: [x for v, b in zip(values, batches) for x in v.get(k, [None] * len(b))]
                              for k in keys}
    return RolloutBatch(**merged)


def _pad(t: torch.Tensor, width: int, side: str, fill) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra == 0:
        return t
    pad = torch.full((t.shape[0], extra, *t.shape[2:]), fill, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if side == "left" else [t, pad], dim=1)


# The name the single-controller posts use for what `Actor.generate_sequences` returns.
GenerationOutput = RolloutBatch
