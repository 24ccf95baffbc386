"""Asynchronous training: how far generation may run ahead of the update (`max_staleness`), and what it cannot
be combined with yet."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from ..algorithms import advantage_spec
from .applies import Applies, VLLM_SERVER, _help, one_of, raise_first_failed

IN_PROCESS = ("the producer samples while the trainer updates; the in-process engines (the HF engine, colocated "
              "vLLM) would sample on the cores, memory and interpreter the update uses (measured on 2 CPU cores: an "
              "HF generate thread beside an update thread, one core each, took 0.82x the speed of the two one "
              "after the other on both cores; benchmarks/in_process_overlap.py), so no producer is built for them: "
              "the vLLM server samples in its own process, on its own cores or GPUs")

ASYNCHRONOUS = Applies("max_staleness >= 1 (asynchronous training)", lambda c, g: c.max_staleness >= 1,
                       ("max_staleness",)).because("a synchronous step never loads weights while it samples")


@dataclass
class AsyncFields:
    max_staleness: Annotated[int, VLLM_SERVER.because(IN_PROCESS)] = field(
        default=0,
        metadata=_help("0: synchronous, every round is sampled by the weights it trains (as before). k >= 1: a "
                       "producer samples and scores the next rounds while the trainer updates, each round by weights "
                       "at most k optimizer steps older than those it trains; it waits at that bound rather than "
                       "sampling rounds that would be too old (nothing is dropped for age). The ratio is then taken "
                       "against the trainer's weights at the step's start and the sampling policy corrected by "
                       "rollout_is (AReaL's decoupled PPO). A round that feeds m optimizer steps (ppo_epochs, "
                       "generation_batch_size) counts its staleness at its first step; k >= m is needed to sample "
                       "ahead. Evaluation samples with the trainer's weights; a "
                       "callback sampling through trainer.actor during training gets the server's (at most k steps "
                       "old). Logs async/staleness_mean, async/staleness_max, async/trainer_wait_s, "
                       "async/producer_wait_s, async/queue_size, async/partial_frac."),
    )
    partial_rollouts: Annotated[bool, ASYNCHRONOUS] = field(
        default=False,
        metadata=_help("True: a weight push does not wait for the generation in flight: the server pauses it, "
                       "loads the new weights and continues each unfinished response from the tokens it has, "
                       "recomputing their keys and values with the new weights, so a response may be sampled by "
                       "several versions (each token keeps the version and the log-prob it was sampled with; "
                       "async/partial_frac is the share of such responses). Long responses then stop holding the "
                       "weights back. False: a push waits until the generation ends. Needs the server's "
                       "/inference/v1/generate (`verl-hf vllm-serve` starts it with --enable-scale-out)."),
    )
    proximal_logprobs: Annotated[str, ASYNCHRONOUS] = field(
        default="recompute",
        metadata=_help("The PPO ratio's proximal policy (AReaL's decoupled PPO) under max_staleness >= 1. "
                       "'recompute': the trainer's weights at the step's start, exact (with one update per round "
                       "these are the live log-probs detached: no extra forward). 'loglinear': AReaL's "
                       "approximation, each token's behaviour log-prob moved towards the current policy's by "
                       "s / (s + 1) for a token s steps stale (a fresh token keeps its behaviour log-prob, so its "
                       "rollout_is weight is 1); see verl_hf/algorithms/off_policy.py."),
    )


def _not_yet(cfg) -> list[tuple[bool, str]]:
    """(holds, why it cannot run asynchronously yet) for each setting the producer does not cover."""
    steps_per_round = cfg.optimizer_steps_per_round
    return [
        (cfg.max_staleness < steps_per_round,
         f"rounds that feed {steps_per_round} optimizer steps (ppo_epochs={cfg.ppo_epochs}, generation_batch_size="
         f"{cfg.generation_batch_size}): a round's staleness is counted at its first step, and weights change only "
         f"between rounds, so below max_staleness={steps_per_round} the producer could sample a round only once the "
         f"one before is fully trained (synchronous). Set max_staleness >= {steps_per_round}"),
        (steps_per_round > 1 and cfg.proximal_logprobs == "loglinear",
         f"proximal_logprobs='loglinear' and rounds that feed {steps_per_round} optimizer steps: the interpolation "
         f"assumes the policy being optimised is one step past the proximal one; use proximal_logprobs='recompute'"),
        (cfg.ignore_data_skip, "ignore_data_skip=True: a resumed run's dataloader starts its epoch again, while the "
                               "producer samples the rounds that the step count says"),
        (cfg.dynamic_sampling, "dynamic_sampling=True: its refills sample from the engine inside the trainer's step, "
                               "while the producer holds it"),
        (advantage_spec(cfg.adv_estimator).needs_greedy_baseline,
         f"adv_estimator={cfg.adv_estimator!r}: its greedy baselines sample from the engine inside the trainer's step"),
        (cfg.safe_rl, "Safe-RLHF (cost_funcs or cost_model_path): the cost window is kept by the trainer's step"),
        (bool(cfg.tools), "tools: multi-turn rollouts are not produced ahead yet"),
        (cfg.gkd_lambda < 1.0, f"gkd_lambda={cfg.gkd_lambda}: asynchronous rounds need rollout_is, and the "
                               f"dataset's answers have no sampling log-probs for it; set gkd_lambda=1"),
    ]  # routing_replay needs no entry: the vLLM server engine refuses it already (config/generation.py)


PROXIMAL_LOGPROBS = ("recompute", "loglinear")


def check_async(cfg) -> None:
    raise_first_failed(cfg, [("max_staleness", cfg.max_staleness >= 0, "must be >= 0 (0: synchronous)")])
    one_of("proximal_logprobs", cfg.proximal_logprobs, PROXIMAL_LOGPROBS)
    if cfg.max_staleness == 0 or cfg.rollout_engine != "vllm_server":
        return  # another engine: refused by the field's condition, with its reason (applies.py)
    for holds, why in _not_yet(cfg):  # first: what cannot run asynchronously at all, before what to add
        if holds:
            raise ValueError(f"max_staleness={cfg.max_staleness} cannot run with {why}. Set max_staleness=0 for this "
                             f"setup.")
    if cfg.rollout_is is None:
        raise ValueError(f"max_staleness={cfg.max_staleness} samples from policies up to {cfg.max_staleness} steps "
                         f"older than the one trained, and rollout_is=None would treat those samples as on-policy: set "
                         f"rollout_is='token' (the importance weight of AReaL's decoupled PPO, truncated at "
                         f"rollout_is_threshold), or max_staleness=0.")
