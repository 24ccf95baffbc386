"""Prompt rows -> a planned rollout round: every step between the dataloader and the loss.

`RoundBuilder.build` runs the steps in order, each taking the batch and returning it with one more thing
known: sample -> score (rewards, costs) -> DAPO dynamic sampling -> unscored rows out -> ReMax baselines ->
reference, teacher and behaviour log-probs -> critic values -> advantages -> micro-batches carrying their optimizer
step's loss normaliser. What the algorithm needs (values, groups, a greedy baseline) is asked of the
estimator's registry entry; Safe-RLHF's cost side is the `constraint` (safety.py), called at fixed points.

A round samples once and then feeds every micro-step (gradient accumulation and `ppo_epochs`) it covers.

See it work: tests/test_round.py, tests/test_trainer_e2e.py, examples/custom_loop_ppo.py.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, replace
from functools import partial

import torch

from .algorithms import LossNorm, advantage_spec, group_all_equal, group_stats, kl_penalty, masked_mean
from .algorithms import place_outcome_rewards, turn_rewards_differ
from .batch import RolloutBatch, concat_batches
from .dataset_answers import dataset_answers, samples_on_policy
from .distributed import is_sharded
from .sample_and_score import RewardStage, SamplingSettings, generate, sampling_kwargs, with_turn_rewards
from .settings import Settings
from .state import MetricBuffer, RefillStream, RolloutSeeds


@dataclass(frozen=True)
class PlannedRound:
    """A round ready to train: the scored batch with advantages, its micro-batches (every `ppo_epochs` pass),
    and, when KL rides in the reward, the KL it measured (kl_sum, tokens, samples) for the KL controller."""

    batch: RolloutBatch
    micro_batches: list
    kl_in_reward: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class RoundSettings(Settings):
    """What a round reads from the config: sampling, seeding, dynamic sampling, the estimator and its
    parameters, KL in the reward, the round's and steps' sizes, and where this process sits."""
    sampling: SamplingSettings
    rollout_seed_per_prompt: bool
    seed: int
    overlong_buffer_len: int
    dynamic_sampling: bool
    dynamic_sampling_max_rounds: int
    adv_estimator: str
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    singleton_group_advantage: str
    use_kl_in_reward: bool
    kl_kind: str
    distill_loss: str | None
    gkd_lambda: float
    loss_agg_mode: str
    seq_mean_count_empty_rows: bool
    max_response_length: int
    ppo_epochs: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    prompts_per_round: int
    rollout_generation_batch_size: int
    micro_steps_per_round: int
    process_index: int
    world_size: int
    device: torch.device


class RoundBuilder:
    """Holds: the roles a round calls (actor, reference, critic, rewards, constraint), the KL controller it reads,
    and the two streams a round consumes: dynamic sampling's refill prompts and the per-prompt seeds."""

    def __init__(self, settings: RoundSettings, actor, rewards: RewardStage, *, ref_policy=None, critic=None,
                 constraint, kl_controller, metrics: MetricBuffer, train_dataset=None, reduce_sum=lambda t: t,
                 precision=contextlib.nullcontext, multi_turn=None, teacher=None):
        """`precision`: the context the actor's loss forward runs under (accelerate's autocast); the reference
        and behaviour log-probs are computed under it too, or bf16 training would see KL and ratios off 1 that
        are only rounding. `multi_turn`: an agent.MultiTurnRollout (tools= / environment=), else None.
        `teacher`: a TeacherPolicy (on-policy distillation), else None."""
        self.settings, self.actor, self.rewards, self.precision = settings, actor, rewards, precision
        self.multi_turn = multi_turn
        self.ref_policy, self.critic, self.constraint, self.kl_controller = ref_policy, critic, constraint, kl_controller
        self.teacher = teacher
        self.metrics, self.train_dataset, self.reduce_sum = metrics, train_dataset, reduce_sum
        self.advantage = advantage_spec(settings.adv_estimator)
        self.refill, self.seeds = RefillStream(), RolloutSeeds()

    def build(self, rows: list[dict], step: int, micro_step: int = 0) -> PlannedRound:
        """The round for these prompt rows at optimizer step `step` (seeds and lambda's delay read it)."""
        return self.plan(self.score(self.sample(rows, step)), step, micro_step)  # 1-2. sample, score them

    def plan(self, batch: RolloutBatch, step: int, micro_step: int = 0) -> PlannedRound:
        """The round from its sampled and scored batch (asynchronous training samples and scores it ahead)."""
        batch = self.keep_informative_groups(batch, step, micro_step)  # 2b. DAPO dynamic sampling
        batch = self.exclude_unscored(batch)                           # 2c. unscored rows leave the loss
        batch = self.add_greedy_baselines(batch)                       # 2d. ReMax baselines
        batch = self.add_reference_logprobs(batch)                     # 3. reference log-probs (kl_coef > 0)
        batch = self.add_teacher_logprobs(batch)                       # 3a. teacher log-probs (distillation)
        batch = self.add_old_logprobs(batch)                           # 3b. behaviour log-probs, when stale
        batch = self.add_values(batch)                                 # 3c. critic values (PPO)
        batch, kl_in_reward = self.compute_advantages(batch, step)     # 4. advantages (pure math)
        return PlannedRound(batch, self.plan_micro_batches(batch), kl_in_reward)

    def sample(self, rows: list[dict], step: int, metrics: MetricBuffer | None = None,
               seeds: RolloutSeeds | None = None) -> RolloutBatch:
        """`metrics`, `seeds`: where the rollout's metrics go and the seed stream it draws from (default: the
        builder's; a producer sampling ahead keeps its own, so that a checkpoint holds no call made ahead)."""
        metrics = self.metrics if metrics is None else metrics
        s, stream, seeds = self.settings, (self.seeds if seeds is None else seeds), None
        if s.rollout_seed_per_prompt:  # drawn on dataset rounds too: the stream stays where a resumed run finds it
            seeds = stream.for_rows(s.seed, step, len(rows), s.process_index * len(rows))
        if not samples_on_policy(s.gkd_lambda, s.seed, step):  # GKD's dataset share: the dataset's answers
            metrics.record({"rollout/dataset_answers": 1.0})
            return dataset_answers(rows, self.actor.tokenizer, self.actor.eos_token_ids, s.sampling.num_generations,
                                   s.max_response_length)
        with metrics.timer("rollout") as clock:
            batch, turn_metrics = generate(self.actor, rows, self.multi_turn, row_seeds=seeds,
                                           **sampling_kwargs(s.sampling, train=True))
        metrics.record({**turn_metrics, **({"rollout/dataset_answers": 0.0} if s.gkd_lambda < 1.0 else {})})
        lengths = batch.response_mask.sum(dim=1).float()
        metrics.record({
            "response_length/mean": lengths.mean().item(), "response_length/max": lengths.max().item(),
            "response_length/min": lengths.min().item(),
            "response_length/truncated_frac": batch.truncated.float().mean().item(),
            "rollout/tokens_per_s": lengths.sum().item() / max(clock.seconds, 1e-9),
        })
        if batch.adapter_versions is not None and len(batch):  # which LoRA adapter version sampled the round
            metrics.record({"rollout/adapter_version": batch.adapter_versions.max().item()})
        return batch

    def score(self, batch: RolloutBatch, metrics: MetricBuffer | None = None) -> RolloutBatch:
        """Rewards (and, through the constraint, costs); `valid` says which rows some function scored."""
        metrics = self.metrics if metrics is None else metrics
        if batch.from_dataset:  # nothing the student did to score: every row stays in, rewarded 0 (advantages 0)
            batch.rewards, batch.valid = torch.zeros(len(batch)), torch.ones(len(batch), dtype=torch.bool)
            return batch
        with metrics.timer("reward"):
            batch.rewards, result, penalty = self.rewards.rewards(batch)
        batch.logged_columns = result.logged_columns
        metrics.record({**result.metrics(), **episode_reward_metrics(batch, result.valid)})
        device = batch.response_mask.device
        batch.reward_per_function, batch.valid = result.per_function.to(device), result.valid.to(device)
        # rows whose group's rewards are all equal (no gradient under group baselines): TRL's frac_reward_zero_std
        flat = group_all_equal(with_turn_rewards(batch.rewards, batch), batch.group_ids, batch.valid)
        metrics.record({"reward/frac_zero_std": flat.float().mean().item()})
        if self.settings.overlong_buffer_len:
            metrics.record({"reward/overlong_penalty": penalty.mean().item()})
        batch = self.constraint.score(batch, metrics)
        if not bool(batch.valid.all()):
            metrics.record({"reward/excluded_frac": 1.0 - batch.valid.float().mean().item()})
        return batch

    def keep_informative_groups(self, batch: RolloutBatch, step: int, micro_step: int) -> RolloutBatch:
        """DAPO dynamic sampling (Yu et al. 2025): groups whose rewards are all equal carry no gradient under
        group baselines, so they are dropped and more prompts are sampled until the round is full again.

        Deviation: refill prompts come from a separate shuffled pass over the train set (the Trainer owns the
        dataloader). After `dynamic_sampling_max_rounds` extra rounds the round is completed with dropped
        groups (equal rewards: advantage 0), counted in `dynamic_sampling/filler_groups`, instead of failing.
        """
        s = self.settings
        if not s.dynamic_sampling:
            return batch
        kept, dropped = self._split(batch)
        self.metrics.record({"dynamic_sampling/informative_frac": _num_groups(kept) / max(_num_groups(batch), 1)})
        extra_rounds = 0
        while extra_rounds < s.dynamic_sampling_max_rounds and self._any_process_short(kept):
            more = self.score(self.sample(self._refill_rows(micro_step), step))
            more, more_dropped = self._split(more)
            kept, dropped = self._concat([kept, more]), self._concat([dropped, more_dropped])
            extra_rounds += 1
        self.metrics.record({"dynamic_sampling/extra_rounds": extra_rounds})
        missing = s.prompts_per_round - _num_groups(kept)
        if missing > 0:
            self.metrics.record({"dynamic_sampling/filler_groups": missing})
            kept = self._concat([kept, _first_groups(dropped, missing)])
        kept = _first_groups(kept, s.prompts_per_round)
        if len(kept) != s.rollout_generation_batch_size:
            raise RuntimeError(f"dynamic sampling built a round of {len(kept)} rows, expected "
                               f"{s.rollout_generation_batch_size}; please report this.")
        return kept

    def _any_process_short(self, kept: RolloutBatch | None) -> bool:
        """Whether this round still needs informative groups. With an engine whose calls are collective (a
        tensor-parallel vLLM, the HF engine on ZeRO-3 partitions), or a sharded reward or cost model, every
        process refills as long as any process is short, so that all call them equally often (a full process's
        extra groups are trimmed away)."""
        short = _num_groups(kept) < self.settings.prompts_per_round
        if not (getattr(self.actor.engine, "calls_are_collective", False) or self.scoring_is_collective()):
            return short
        device = self.settings.device if self.settings.world_size > 1 else "cpu"
        return bool(self.reduce_sum(torch.tensor([float(short)], device=device)).item() > 0)

    def scoring_is_collective(self) -> bool:
        """A reward or cost model sharded over the processes (ZeRO-3, FSDP2): every refill's scoring is a
        collective too."""
        funcs = [f for _, f in self.rewards.funcs] + [f for _, f in getattr(self.constraint, "cost_funcs", ())]
        return any(getattr(f, "runs_collectives", False) and isinstance(getattr(f, "model", None), torch.nn.Module)
                   and is_sharded(f.model) for f in funcs)

    def _split(self, batch: RolloutBatch):
        return split_informative(batch, self.constraint, self.settings.singleton_group_advantage == "score",
                                 turn_credit=self.advantage.needs_turn_rewards)

    def _refill_rows(self, micro_step: int) -> list[dict]:
        """The next prompts of an independent shuffled stream over the train set (one per process)."""
        seed = self.settings.seed + 7919 * (self.settings.process_index + 1) + micro_step
        taken = self.refill.take(self.settings.prompts_per_round, len(self.train_dataset), seed)
        return [self.train_dataset[i] for i in taken]

    def _concat(self, batches: list[RolloutBatch | None]) -> RolloutBatch | None:
        batches = [b for b in batches if b is not None and len(b)]
        return concat_batches(batches, self.actor.tokenizer.pad_token_id) if batches else None

    def exclude_unscored(self, batch: RolloutBatch) -> RolloutBatch:
        """Rows no reward function scored (or the safety filter dropped; `valid` says which, counted in
        `reward/excluded_frac` when scored) take no part: no gradient (their response mask becomes 0), and no
        share in their group's baseline (`advantage_groups`)."""
        if bool(batch.valid.all()):
            return batch
        return replace(batch, response_mask=batch.response_mask * batch.valid.unsqueeze(1).to(batch.response_mask.dtype))

    def add_greedy_baselines(self, batch: RolloutBatch) -> RolloutBatch:
        """ReMax (Li et al. 2024): the reward of each prompt's greedy response is its baseline."""
        if not self.advantage.needs_greedy_baseline or batch.from_dataset:  # no advantages on the dataset's answers
            return batch
        firsts = batch.select(_first_index_per_group(batch))
        rows = [{"prompt": firsts.prompts[i], "prompt_ids": ids[m.bool()].tolist(),
                 **{k: v[i] for k, v in firsts.columns.items()}}
                for i, (ids, m) in enumerate(zip(firsts.prompt_ids, firsts.prompt_mask))]
        with self.metrics.timer("baseline"):
            greedy, _ = generate(self.actor, rows, self.multi_turn, **{
                **sampling_kwargs(self.settings.sampling, train=True), "num_return_sequences": 1, "do_sample": False,
                "return_routes": False})
            baseline = with_turn_rewards(self.rewards.rewards(greedy)[0], greedy)
        position = {g: k for k, g in enumerate(firsts.group_ids.tolist())}
        batch.reward_baselines = baseline[[position[g] for g in batch.group_ids.tolist()]]
        self.metrics.record({"reward/greedy_baseline": baseline.mean().item()})
        return batch

    def add_reference_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        if self.ref_policy is not None:
            with self.metrics.timer("ref_logprobs"), self.precision():
                batch.ref_logprobs = self.ref_policy.get_logprobs(batch, self.settings.per_device_train_batch_size)
        return batch

    def add_teacher_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        """On-policy distillation: the teacher's log-probs of every sampled token (the update turns them into
        the reverse-KL advantage against the student's, update.PolicyUpdate.distilled_advantages), and a served
        teacher's top-k at every position (distill_loss='topk_forward_kl'). GKD reads the teacher's whole
        distributions in the update instead."""
        if self.teacher is None or self.settings.distill_loss == "gkd":
            return batch
        with self.metrics.timer("teacher_logprobs"), self.precision():
            if self.settings.distill_loss == "topk_forward_kl":
                batch.teacher_logprobs, batch.teacher_topk_ids, batch.teacher_topk_logprobs = self.teacher.score(batch)
            else:
                batch.teacher_logprobs = self.teacher.get_logprobs(batch, self.settings.per_device_train_batch_size)
        return batch

    def add_old_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        """Behaviour-policy log-probs. One update per round is on-policy: the micro-steps reuse the live
        log-probs (detached) instead of paying an extra forward pass; several updates, or KL in the reward,
        need them stored."""
        s = self.settings
        updates_per_round = s.micro_steps_per_round // s.gradient_accumulation_steps
        if updates_per_round > 1 or (s.use_kl_in_reward and batch.ref_logprobs is not None):
            with self.metrics.timer("old_logprobs"), self.precision():
                batch.old_logprobs = self.actor.get_logprobs(batch, s.per_device_train_batch_size)
            self.metrics.record(self.actor.routing_metrics())  # this pass's replay agreement, if replayed
        return batch

    def add_values(self, batch: RolloutBatch) -> RolloutBatch:
        if self.critic is not None:
            with self.metrics.timer("values"):
                batch.values = self.critic.compute_values(batch, self.settings.per_device_train_batch_size)
                batch = self.constraint.add_values(batch, self.settings.per_device_train_batch_size)
        return batch

    def compute_advantages(self, batch: RolloutBatch, step: int):
        """(batch with token_level_rewards, advantages, returns; the KL measured in the reward or None)."""
        s, kl_in_reward = self.settings, None
        if batch.from_dataset:  # GKD's dataset share: its divergence is the only signal, no policy gradient
            zeros = torch.zeros_like(batch.response_mask, dtype=torch.float32)
            batch.token_level_rewards, batch.advantages, batch.returns = zeros, zeros.clone(), zeros.clone()
            return batch, None
        with self.metrics.timer("advantage"):
            mask = batch.response_mask.float()
            outcome = place_outcome_rewards(batch.rewards, mask)
            token_rewards = outcome  # plus an environment's per-turn rewards, on each turn's last token
            if batch.turn_rewards is not None:
                token_rewards = outcome + batch.turn_rewards.to(outcome)
            if s.use_kl_in_reward and batch.ref_logprobs is not None:
                kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, s.kl_kind) * mask
                token_rewards = token_rewards - self.kl_controller.value * kl
                outcome = outcome - self.kl_controller.value * kl
                self.metrics.record({"kl/in_reward": masked_mean(kl, mask).item(), "kl/coef": self.kl_controller.value})
                kl_in_reward = (float((kl * mask).sum()), float(mask.sum()), float(len(batch)))
            batch.token_level_rewards = token_rewards
            estimate = partial(self.estimate, batch)
            batch.advantages, batch.returns = estimate(token_rewards, batch.values, outcome_rewards=outcome)
            self.constraint.observe_round(batch, step, self.metrics)
            batch.advantages, batch.cost_returns = self.constraint.advantages(
                batch, batch.advantages, token_rewards, estimate, self.metrics)
        response_advantages = batch.advantages[mask.bool()]
        self.metrics.record({"advantages/mean": masked_mean(batch.advantages, mask).item(),
                             "advantages/abs_mean": masked_mean(batch.advantages.abs(), mask).item(),
                             "advantages/max": response_advantages.max().item() if response_advantages.numel() else 0.0,
                             "advantages/min": response_advantages.min().item() if response_advantages.numel() else 0.0})
        return batch, kl_in_reward

    def estimate(self, batch: RolloutBatch, token_rewards: torch.Tensor, values, outcome_rewards=None) -> tuple:
        """(advantages, returns) of the configured estimator for these per-token rewards. The reward's estimate
        also offers the rewards without the environment's turn rewards (`outcome_rewards`, exact rather than
        subtracted back) and the turn rewards (turn-level credit reads both); the costs' has neither."""
        s = self.settings
        turns = None if outcome_rewards is None or batch.turn_rewards is None else batch.turn_rewards.to(token_rewards)
        if self.advantage.needs_turn_rewards and outcome_rewards is not None and (turns is None or not turns.any()):
            warnings.warn(f"adv_estimator={self.advantage.name!r}: the environment rewarded no turn of this round (its "
                          "step() returned no Step.reward), so these advantages are GRPO's.", RuntimeWarning)
        return self.advantage(
            token_level_rewards=token_rewards, response_mask=batch.response_mask.float(),
            group_ids=advantage_groups(batch), values=values, reward_baselines=batch.reward_baselines,
            turn_rewards=turns, outcome_rewards=outcome_rewards, gamma=s.gamma, lam=s.lam,
            norm_by_std=s.norm_adv_by_std_in_grpo, singleton_advantage=s.singleton_group_advantage)

    def plan_micro_batches(self, batch: RolloutBatch) -> list[RolloutBatch]:
        """Cut the round into micro-batches, each carrying its optimizer step's `LossNorm`, so that the
        accumulated gradient equals the gradient of the whole step's loss (not a mean of micro-means).

        Under data parallelism the token count is the step's total over all processes, divided by their
        number: gradients are averaged across processes, so the result is the global token mean (as verl).
        The sequence count, pooled the same way, leaves out rows with no response token left (unscored rows), as
        verl does, unless `seq_mean_count_empty_rows`.
        """
        s = self.settings
        steps = batch.split(s.per_device_train_batch_size * s.gradient_accumulation_steps)
        counts = torch.tensor([[float(part.response_mask.sum()), float(self._sequences(part))] for part in steps],
                              device=s.device)
        if s.world_size > 1:
            counts = self.reduce_sum(counts)
        # An empty step counts 1 (loss 0, never 0/0), clamped before the division by the number of processes.
        counts = counts.clamp(min=1) / s.world_size
        micro = []
        for step_batch, (step_tokens, step_seqs) in zip(steps, counts.tolist()):
            norm = LossNorm(s.loss_agg_mode, num_tokens=step_tokens, num_seqs=step_seqs,
                            constant=s.max_response_length, count_empty_rows=s.seq_mean_count_empty_rows)
            micro += [replace(mb.without_padding(), loss_norm=norm)
                      for mb in by_length(step_batch).split(s.per_device_train_batch_size)]
        return micro * s.ppo_epochs

    def _sequences(self, step_batch: RolloutBatch) -> int:
        if self.settings.seq_mean_count_empty_rows:
            return len(step_batch)
        return int(step_batch.response_mask.any(dim=1).sum())


def by_length(batch: RolloutBatch) -> RolloutBatch:
    """The rows ordered by their token count (prompt + response; stable), so that the micro-batches cut from
    them hold rows of similar length and pad little. The step's gradient is a sum over its rows, so the order
    does not change it."""
    lengths = batch.prompt_mask.sum(dim=1) + batch.response_attention_mask.sum(dim=1)
    order = torch.sort(lengths, stable=True).indices
    return batch if bool((order == torch.arange(len(order))).all()) else batch.select(order.tolist())


def episode_reward_metrics(batch: RolloutBatch, valid: torch.Tensor) -> dict[str, float]:
    """With an environment's per-turn rewards: reward/mean and reward/std of the whole episodes' rewards (as
    evaluation's eval_reward counts them), and reward/turns/mean, their turn rewards' part. {} without any."""
    if batch.turn_rewards is None or not bool(batch.turn_rewards.ne(0).any()) or not bool(valid.any()):
        return {}
    valid = valid.to(batch.rewards.device)
    episode, turns = with_turn_rewards(batch.rewards, batch)[valid], batch.turn_rewards.sum(dim=1)[valid.cpu()]
    return {"reward/mean": episode.mean().item(), "reward/std": episode.std(unbiased=False).item(),
            "reward/turns/mean": turns.mean().item()}


def split_informative(batch: RolloutBatch, constraint, singleton_informs: bool = False, turn_credit: bool = False):
    """(informative rows, flat rows) for dynamic sampling: a group whose scored rewards are all equal is flat;
    the constraint adds its own rule (with Safe-RLHF, a group whose costs differ informs). With
    `singleton_informs` (singleton_group_advantage="score", verl's rule) a group of one scored row informs: its
    advantage is its score (verl's DAPO filter keeps groups of one too). With `turn_credit` (mt_grpo) a group
    whose rewards for some turn differ informs, even when its episodes' totals are equal."""
    rewards = with_turn_rewards(batch.rewards, batch)
    flat = constraint.flat_groups(batch, group_all_equal(rewards, batch.group_ids, batch.valid))
    if turn_credit and batch.turn_rewards is not None:
        differ = turn_rewards_differ(batch.turn_rewards, batch.response_mask, batch.group_ids, batch.valid)
        flat = flat & ~differ.to(flat)
    if singleton_informs:
        flat = flat & (group_stats(rewards, batch.group_ids, batch.valid).count != 1)
    return batch.select(~flat), batch.select(flat)


def advantage_groups(batch: RolloutBatch) -> torch.Tensor:
    """Group ids for the estimators: an unscored row becomes a group of its own (its mask is 0, so it gets no
    gradient) so that it does not shift its prompt's baseline. A prompt left with one scored row is then a
    group of one, which `singleton_group_advantage` covers (verl's rule by default: its score)."""
    if batch.valid is None or bool(batch.valid.all()):
        return batch.group_ids
    own = -1 - torch.arange(len(batch), device=batch.group_ids.device)
    return torch.where(batch.valid.to(batch.group_ids.device), batch.group_ids, own)


def _num_groups(batch: RolloutBatch | None) -> int:
    return 0 if batch is None or not len(batch) else int(torch.unique(batch.group_ids).numel())


def _first_index_per_group(batch: RolloutBatch) -> list[int]:
    seen, first = set(), []
    for i, g in enumerate(batch.group_ids.tolist()):
        if g not in seen:
            seen.add(g)
            first.append(i)
    return first


def _first_groups(batch: RolloutBatch, count: int) -> RolloutBatch:
    """The rows of the first `count` groups (in order of appearance)."""
    keep = set(batch.group_ids[_first_index_per_group(batch)[:count]].tolist())
    return batch.select(torch.tensor([g in keep for g in batch.group_ids.tolist()], dtype=torch.bool))
