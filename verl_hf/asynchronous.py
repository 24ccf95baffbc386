"""Where the trainer's rounds come from: sampled when the step needs them, or ahead of it by a producer thread.

Both sources give `next_round(rows, step, micro_step) -> PlannedRound`, own the engine's weight push, and lend
the engine to evaluation at the trainer's weights (`engine_held`).

`SynchronousRounds` (max_staleness=0): push the weights if they changed, then sample, score and plan the round,
as every step did before asynchronous training existed.

`AsynchronousRounds` (max_staleness=k >= 1): a thread samples and scores the rounds to come (their prompts are
the dataloader's: the round sampler gives any round's indices) while the trainer updates on the current one.
The round that trains optimizer step s is sampled by weights that had seen at least s - k steps: the producer
waits at that bound instead of sampling rounds that would be too old, so nothing is dropped for age (dropping
stale samples drops the slow, long ones first and biases the data towards short answers). Generation and the
weight push never overlap (one lock): the trainer pushes whenever the engine is behind and the producer is
between generations, and does not wait for it otherwise. With partial_rollouts the trainer pushes into the
generation in flight instead, inside the engine's pause (engine.paused_for_weights): unfinished responses
continue with the new weights, each token labelled with the version that sampled it. The trainer then plans the
round (reference and proximal log-probs, values, advantages) with its own current weights; rollout_is corrects
for the sampling policy (AReaL's decoupled PPO, algorithms/off_policy.py).

With several training processes (DDP, ZeRO, FSDP2) each process has a producer sampling its own share of the
round from the one server, and the push is collective (the ZeRO-3 / FSDP2 gathers, the failure every process
learns): all processes push together at the start of each round, process 0 feeding the server. Without
partial rollouts each first waits for its producer to end the generation it is in (at k = 1 the producer is
then waiting for these weights anyway) and a barrier holds process 0 until every producer is still; with
them, process 0 pauses the server's generations, every process's, for the push.

A round that feeds m optimizer steps (ppo_epochs, generation_batch_size) counts its staleness at its first
step; weights reach the engine between rounds. A checkpoint does not hold the rounds sampled ahead: a resumed
run samples them again from the resumed weights.

See it work: tests/test_asynchronous.py
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from .algorithms import staleness_metrics
from .batch import RolloutBatch
from .data import round_sampler
from .state import MetricBuffer, RolloutSeeds

POLL_S = 0.05  # how often a waiting trainer looks for an error, a finished round or an idle engine
JOIN_S = 120  # how long close() waits for the generation the producer is in (an HTTP call cannot be cut short)


def make_rounds(args, builder, actor, metrics: MetricBuffer, train_dataset, collate, last_step: Callable[[], int]):
    """The source the config asks for; `collate` turns dataset rows into what the dataloader yields."""
    if args.max_staleness == 0 or train_dataset is None:  # no train_dataset: nothing to sample ahead (evaluate only)
        return SynchronousRounds(builder, actor, metrics)
    if args.partial_rollouts and not actor.engine.pauses_for_weights:
        raise ValueError(f"partial_rollouts=True, but {type(actor.engine).__name__} cannot pause its generation for a "
                         f"weight push (the vLLM server needs /inference/v1/generate: start it with "
                         f"--enable-scale-out, as `verl-hf vllm-serve` does); or set partial_rollouts=False.")
    if args.world_size > 1 and builder.scoring_is_collective():
        raise ValueError(f"max_staleness={args.max_staleness} with {args.world_size} training processes: a reward or "
                         f"cost model sharded over them (ZeRO-3, FSDP2) would score in every process's producer "
                         f"thread, its gathers interleaved with the update's. Give each process a whole copy (DDP, "
                         f"ZeRO-1/2), or set max_staleness=0.")
    sampler = round_sampler(len(train_dataset), args)  # this process's share of each round
    steps = args.optimizer_steps_per_round
    return AsynchronousRounds(builder, actor, metrics,
                              lambda step: collate([train_dataset[i] for i in sampler.round_indices(step // steps)]),
                              max_staleness=args.max_staleness, last_step=last_step, steps_per_round=steps,
                              partial_rollouts=args.partial_rollouts, processes=args.world_size)


class SynchronousRounds:
    """Holds nothing between rounds: each is sampled, scored and planned when the step asks for it."""

    def __init__(self, builder, actor, metrics: MetricBuffer):
        self.builder, self.actor, self.metrics = builder, actor, metrics

    def next_round(self, rows: list[dict], step: int, micro_step: int):
        self.push()                                           # 0b. weights into the engine
        return self.builder.build(rows, step, micro_step)     # 1-4. sample, score, plan

    def push(self) -> None:
        """Only for an engine with its own weights (verl_hf.sync), and only after the weights changed."""
        if self.actor.engine_is_stale:
            with self.metrics.timer("sync"):
                sync_metrics = self.actor.sync_weights()
            self.metrics.record(sync_metrics)

    @contextlib.contextmanager
    def engine_held(self, step: int):
        self.push()
        yield

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ProducedRound:
    """A round sampled and scored ahead: its batch, the prompts it was sampled for, the version of the weights
    that sampled it (the optimizer steps they had seen), and the metrics the producer recorded for it."""

    batch: RolloutBatch
    prompt_ids: list
    version: int
    metrics: MetricBuffer


class AsynchronousRounds(SynchronousRounds):
    """Holds: the producer thread, the rounds it finished (by the step each trains), the version of the engine's weights
    (None before the first push), the lock that keeps generation and the push apart, and the producer's error."""

    def __init__(self, builder, actor, metrics: MetricBuffer, rows_of_round: Callable[[int], list[dict]], *,
                 max_staleness: int, last_step: Callable[[], int], steps_per_round: int = 1,
                 partial_rollouts: bool = False, processes: int = 1):
        """`rows_of_round(s)`: this process's prompt rows of the round whose first optimizer step is s (each
        round feeds `steps_per_round` steps; its staleness is counted at the first, and the bound needs
        max_staleness >= steps_per_round to let the producer sample ahead: config/asynchronous.py); `last_step()`:
        the run's max_steps (no round is sampled past it); `partial_rollouts`: push into a generation in flight,
        paused for it (engine.paused_for_weights); `processes`: the training processes sharing the engine (> 1:
        they push together, once a round)."""
        super().__init__(builder, actor, metrics)
        self.rows_of_round, self.max_staleness, self.last_step = rows_of_round, max_staleness, last_step
        self.steps_per_round = steps_per_round
        self.partial_rollouts, self.processes = partial_rollouts, processes
        self._feeds_engine = actor.weight_sync is None or actor.weight_sync.owns_engine  # process 0 of a shared one
        self._changed, self._engine = threading.Condition(), threading.Lock()
        # `_run` numbers the producers: a producer still inside a generation when close() gave up on it finds
        # its number out of date and its results are dropped (it cannot pass a round of rolled-back weights on).
        self._thread, self._run = None, 0
        self._done: dict[int, ProducedRound] = {}  # by the first step each trains
        self._next, self._version, self._error = 0, None, None

    def next_round(self, rows: list[dict], step: int, micro_step: int):
        self._start_at(step)
        if self.processes > 1:
            self._push_with_the_others(step)
        produced, waited = self._take(step)
        if [list(r["prompt_ids"]) for r in rows] != produced.prompt_ids:
            raise RuntimeError(f"the round sampled ahead for step {step} has other prompts than the dataloader's; "
                               f"please report this.")
        for name, values in produced.metrics.values.items():
            for value in values:
                self.metrics.record({name: value})
        versions = produced.batch.rollout_versions  # per token from an engine that labels its weights
        if versions is None:  # else the version the round was sampled with (proximal_logprobs='loglinear' reads it)
            versions = torch.full_like(produced.batch.response_mask, produced.version, dtype=torch.long)
            produced.batch.rollout_versions = versions
        with self._changed:
            queued = len(self._done)
        self.metrics.record({**staleness_metrics(versions, produced.batch.response_mask, step),
                             "async/trainer_wait_s": waited, "async/queue_size": queued})
        return self.builder.plan(produced.batch, step, micro_step)

    @contextlib.contextmanager
    def engine_held(self, step: int):
        """The engine for evaluation, with the trainer's weights: waits for the producer's generation to end."""
        with self._engine:
            if self.processes == 1:
                self._push_holding_engine(step)
            elif self._behind():
                self._push_in_step(step)
            yield

    def reset(self) -> None:
        """Drop the rounds sampled ahead (a rollback or a new `train()`); the next round starts the producer again."""
        self.close()
        with self._changed:
            self._done, self._version, self._error = {}, None, None

    def close(self) -> None:
        """Stop the producer (it finishes the generation it is in) and wait for its thread to end."""
        with self._changed:
            self._run += 1
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=JOIN_S)
            if self._thread.is_alive():
                warnings.warn(f"the rollout producer did not stop within {JOIN_S} s (a generation that does not "
                              f"end?); its thread is left to end with the process.")
            self._thread = None
        # Only now: a producer between its last check and its sampling must not push (a collective) from its thread
        self.actor.sync_on_sample = True  # sampling outside the producer gets the trainer's weights again

    # ---------------------------------------------------------------- the trainer's side
    def _start_at(self, step: int) -> None:
        if self._thread is None:
            if self.partial_rollouts and self._feeds_engine and self._version is None:
                # a run killed inside a pause for weights (kill -9, OOM) left the server paused, and every
                # request would queue until it timed out: pausing and resuming once leaves it running
                with self.actor.engine.paused_for_weights():
                    pass
            self._next = step
            self.actor.sync_on_sample = False  # the producer samples the weights the engine has: pushed only here
            self._thread = threading.Thread(target=self._produce, args=(self._run,), name="verl_hf-rollout-producer",
                                            daemon=True)
            self._thread.start()

    def _take(self, step: int) -> tuple[ProducedRound, float]:
        """The round for `step` once the producer has it (pushing weights whenever the engine is free); the seconds
        waited. The producer's error is raised here, with its traceback."""
        started, pushing = time.perf_counter(), 0.0
        while True:
            if self.processes == 1:  # several: pushed together with the others before (_push_with_the_others)
                pushing += self._push_if_free(step)
            with self._changed:
                if step in self._done:  # the push is time/sync, not waiting
                    return self._done.pop(step), time.perf_counter() - started - pushing
                if self._error is not None:
                    raise RuntimeError(f"the rollout producer failed while sampling ahead of step {step} (its "
                                       f"traceback above)") from self._error
                if not self._thread.is_alive():
                    raise RuntimeError(f"the rollout producer stopped without the round for step {step}; please "
                                       f"report this.")
                self._changed.wait(timeout=POLL_S)

    def _push_if_free(self, step: int) -> float:
        """Push the weights if the engine is behind and the producer is not generating, or with partial rollouts
        into its generation, paused meanwhile; the seconds it took."""
        if not self._behind():
            return 0.0
        started = time.perf_counter()
        if self._engine.acquire(blocking=False):
            try:
                self._push_holding_engine(step)
            finally:
                self._engine.release()
        elif self.partial_rollouts:
            # the producer holds the engine inside a generation, which continues with these weights
            with self.actor.engine.paused_for_weights():
                self._push_holding_engine(step)
        else:
            return 0.0
        return time.perf_counter() - started

    def _behind(self) -> bool:
        return self.actor.engine_is_stale or self._version is None  # None: no version recorded since a reset

    def _push_with_the_others(self, step: int) -> None:
        """Several training processes: all push here together, at the start of the round (the push is
        collective). Each first stops its producer between generations, unless process 0 pauses them all."""
        if not self._behind():
            return
        if self.partial_rollouts:
            self._push_in_step(step)
        else:
            with self._engine:
                self._push_in_step(step)

    def _push_in_step(self, step: int) -> None:
        """Every process at once; this one's producer is between generations, or partial rollouts pause them."""
        dist.barrier()  # process 0 loads weights only once every producer is still (DDP has no gather to wait in)
        pause = self.actor.engine.paused_for_weights() if self.partial_rollouts and self._feeds_engine else None
        with pause or contextlib.nullcontext():
            self._push_holding_engine(step)
            dist.barrier()  # no producer samples the new version before the server says it has it

    def _push_holding_engine(self, step: int) -> None:
        self.push()
        if self._feeds_engine:
            self.actor.engine.label_weights(step)  # what each token's Rollout.versions says
        with self._changed:
            self._version = step
            self._changed.notify_all()

    # ---------------------------------------------------------------- the producer's side
    def _produce(self, run: int) -> None:
        step = self._next
        try:
            while step < self.last_step():
                produced = self._sample_and_score(self.rows_of_round(step), step, run)
                with self._changed:
                    if produced is None or run != self._run:
                        return
                    # the next round starts at the next multiple of steps_per_round: a round restarted mid-way
                    # (a resume without the checkpoint's round files) covers only the rest of its steps
                    self._done[step] = produced
                    step = self._next = (step // self.steps_per_round + 1) * self.steps_per_round
                    self._changed.notify_all()
        except BaseException as error:  # noqa: BLE001 - handed to the trainer, which raises it
            with self._changed:
                if run == self._run:
                    self._error = error
                    self._changed.notify_all()

    def _sample_and_score(self, rows: list[dict], step: int, run: int) -> ProducedRound | None:
        """Waits until the engine's weights are recent enough for `step` (None once this producer is told to
        stop), then samples holding the engine, and scores after releasing it."""
        metrics, started = MetricBuffer(), time.perf_counter()
        with self._changed:
            while run == self._run and (self._version is None or self._version < step - self.max_staleness):
                self._changed.wait(timeout=0.5)
        with self._engine:  # the version cannot change while the engine is held (partial rollouts: see the labels)
            with self._changed:
                version, current = self._version, run == self._run
            if not current:  # told to stop while it waited (for the bound or for evaluation's hold)
                return None
            waited = time.perf_counter() - started
            # a seed stream of its own: the builder's, checkpointed, must not hold calls made rounds ahead
            batch = self.builder.sample(rows, step, metrics, seeds=RolloutSeeds())
        batch = self.builder.score(batch, metrics)
        metrics.record({"async/producer_wait_s": waited})
        return ProducedRound(batch, [list(r["prompt_ids"]) for r in rows], version, metrics)
