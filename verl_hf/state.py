"""The named state of an RL run that lives between training steps, one small object per kind.

Each object says what it holds and owns its `state_dict()` / `load_state_dict()`; `checkpoint.RLCheckpoint`
saves them by name, so a run killed in the middle of a round resumes exactly.

- `MetricBuffer`: the metric values recorded since the last log, pooled over processes when logged
  (`token_weighted` merges the metrics of one micro-step's token-budget pieces into one record first).
- `KLMeter`: the KL measured since the last KL-controller update (the controller steps once per round).
- `RoundInProgress`: the planned micro-batches of the round being trained and the position in it.
- `RefillStream`: dynamic sampling's own shuffled pass over the train set.
- `RolloutSeeds`: per-prompt sampling seeds (`rollout_seed_per_prompt`), independent of batching.

See it work: tests/test_state.py, tests/test_resume.py.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch


@dataclass
class PhaseClock:
    """The seconds a timed phase took, readable after its `with` block."""

    seconds: float = 0.0


def token_weighted(parts: list[tuple[dict, float]]) -> dict[str, float]:
    """One metrics dict from the pieces' dicts: masked means averaged with each piece's token count as weight;
    value losses (already divided by the whole step's normaliser) summed. One piece: its dict as it is."""
    if len(parts) == 1:
        return parts[0][0]
    sums, weights = {}, {}
    for metrics, tokens in parts:
        for key, value in metrics.items():
            additive = key.endswith("/value_loss")
            sums[key] = sums.get(key, 0.0) + value * (1.0 if additive else tokens)
            weights[key] = 1.0 if additive else weights.get(key, 0.0) + tokens
    return {key: sums[key] / weights[key] if weights[key] else 0.0 for key in sums}


class MetricBuffer:
    """Holds: every metric value recorded since the last log, by name (one list per name)."""

    def __init__(self):
        self.values: dict[str, list[float]] = defaultdict(list)

    def record(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.values[key].append(float(value))

    @contextmanager
    def timer(self, phase: str):
        """Records `time/<phase>`; yields a `PhaseClock` that holds the seconds once the block ends."""
        clock, started = PhaseClock(), time.perf_counter()
        yield clock
        clock.seconds = time.perf_counter() - started
        self.record({f"time/{phase}": clock.seconds})

    def pooled(self, world_size: int) -> dict[str, float]:
        """Every recorded metric over all processes and the steps since the last log (every rank calls this
        together), then cleared: the mean, or for a name ending in `max` or `min` (`response_length/max`,
        `advantages/min`) the largest or smallest value, so that a maximum stays a maximum when it is pooled."""
        local = {k: (sum(v), len(v), max(v), min(v)) for k, v in self.values.items() if v}
        self.values.clear()
        parts = [local]
        if world_size > 1:
            from accelerate.utils import gather_object

            parts = gather_object([local])
        pooled = {}
        for key in dict.fromkeys(k for part in parts for k in part):
            rows = [part[key] for part in parts if key in part]
            if key.endswith("max"):
                pooled[key] = max(row[2] for row in rows)
            elif key.endswith("min"):
                pooled[key] = min(row[3] for row in rows)
            else:
                pooled[key] = sum(row[0] for row in rows) / sum(row[1] for row in rows)
        return pooled

    def state_dict(self) -> dict:
        return {"values": dict(self.values)}

    def load_state_dict(self, state: dict) -> None:
        self.values = defaultdict(list, state["values"])


class KLMeter:
    """Holds: this process's KL since the last controller update: the token-weighted KL sum, the token count,
    and the rows of the round it was measured on (adaptive control counts samples, not ppo_epochs passes)."""

    def __init__(self):
        self.pending: list[float] | None = None  # [kl_sum, tokens, samples]

    def observe(self, kl_sum: float, tokens: float, samples: float) -> None:
        """Adds one measurement; the sample count is the round's, kept from its first measurement."""
        seen = self.pending or [0.0, 0.0, float(samples)]
        self.pending = [seen[0] + kl_sum, seen[1] + tokens, seen[2]]

    def update_controller(self, controller, kind: str, reduce_sum, device) -> None:
        """One controller step from the pending KL, summed over processes by `reduce_sum` (a tensor on `device`,
        so every rank keeps the same coefficient); the meter starts over. Adaptive control counts samples
        (Ziegler et al.); PID takes one update as its time step."""
        seen, self.pending = self.pending, None
        if seen is None or kind == "fixed":
            return
        kl_sum, tokens, samples = reduce_sum(torch.tensor(seen, device=device)).tolist()
        controller.update(kl_sum / max(tokens, 1.0), 1 if kind == "pid" else int(samples))

    def observe_reward_kl(self, kl_in_reward: tuple[float, float, float] | None) -> None:
        """A round's KL in the reward (use_kl_in_reward), measured once when it is planned; None: not there."""
        if kl_in_reward is not None:
            self.observe(*kl_in_reward)

    def reset(self) -> None:
        self.pending = None

    def state_dict(self) -> dict:
        return {"pending": self.pending}

    def load_state_dict(self, state: dict) -> None:
        self.pending = state["pending"]


@dataclass
class RoundInProgress:
    """Holds: the planned micro-batches of the round being trained (all `ppo_epochs` passes), the micro-steps
    taken so far in the run, the latest scored round (for CompletionSamplesCallback) and its row count.
    `needs_position` is set when a run resumes without its round: the position is then recomputed from the
    Trainer's step and a fresh round is sampled from the prompts the dataloader gives for it."""

    micro_batches: list = field(default_factory=list)
    micro_step: int = 0
    last_round: object = None
    size: int | None = None
    needs_position: bool = False

    def start(self, planned) -> None:
        """The planned round (round.PlannedRound) becomes the one trained. It is kept for callbacks without its
        MoE routes and a served teacher's top-k: only the micro-batches use them, so these (rows x tokens x k)
        tensors are held, and checkpointed, once."""
        self.micro_batches, self.size = planned.micro_batches, len(planned.batch)
        self.last_round = replace(planned.batch, prompt_routes=None, response_routes=None, teacher_topk_ids=None,
                                  teacher_topk_logprobs=None)

    def starts_new(self, micro_steps_per_round: int) -> bool:
        return self.micro_step % micro_steps_per_round == 0 or not self.micro_batches

    def take_next(self, micro_steps_per_round: int):
        """The micro-batch of this micro-step; the position moves on."""
        micro_batch = self.micro_batches[self.micro_step % micro_steps_per_round]
        self.micro_step += 1
        return micro_batch

    def last_taken(self, micro_steps_per_round: int):
        return self.micro_batches[(self.micro_step - 1) % micro_steps_per_round] if self.micro_batches else None

    def place(self, global_step: int, gradient_accumulation_steps: int, micro_steps_per_round: int) -> None:
        """After a resume without a saved round: continue at the right micro-step of a fresh round (the
        dataloader repeats a round's prompts once per micro-step, and the Trainer skipped those already trained)."""
        if self.needs_position:
            steps = global_step * gradient_accumulation_steps
            self.micro_step, self.micro_batches = steps % micro_steps_per_round, []
            self.needs_position = False

    def restart_at_boundary(self, micro_steps_per_round: int) -> None:
        """Drop the round; the next micro-step starts a fresh one at the next round boundary."""
        self.micro_batches = []
        self.micro_step = -(-self.micro_step // micro_steps_per_round) * micro_steps_per_round

    def state_dict(self) -> dict:
        return {"micro_batches": self.micro_batches, "micro_step": self.micro_step, "last_round": self.last_round,
                "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        self.micro_batches, self.micro_step = state["micro_batches"], state["micro_step"]
        self.last_round, self.size, self.needs_position = state["last_round"], state["size"], False


class RefillStream:
    """Holds: the train-set indices still to come in dynamic sampling's own shuffled pass (one per process; the
    Trainer owns the main dataloader)."""

    def __init__(self):
        self.order: list[int] = []

    def take(self, count: int, dataset_size: int, seed: int) -> list[int]:
        """The next `count` indices; a new shuffled pass (seeded by `seed`) is appended when too few are left."""
        if len(self.order) < count:
            self.order += torch.randperm(dataset_size, generator=torch.Generator().manual_seed(seed)).tolist()
        taken, self.order = self.order[:count], self.order[count:]
        return taken

    def state_dict(self) -> dict:
        return {"order": self.order}

    def load_state_dict(self, state: dict) -> None:
        self.order = state["order"]


class RolloutSeeds:
    """Holds: how many training rollouts the current optimizer step has made (dynamic sampling refills make
    more than one), so each gets its own seeds."""

    def __init__(self):
        self.calls: dict[int, int] = {}

    def for_rows(self, seed: int, step: int, count: int, first_row: int) -> list[int]:
        """A seed per prompt from (seed, step, call of the step, the prompt's place in the global round): the
        same whatever the number of processes."""
        calls = self.calls.get(step, 0)
        self.calls = {step: calls + 1}
        return [hash((seed, step, calls, first_row + i)) for i in range(count)]

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]
