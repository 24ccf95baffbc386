"""`VerlTrainer`: online RL as a drop-in `transformers.Trainer`.

`training_step` runs the numbered steps of one RL iteration on the roles (roles/); the math lives in
algorithms/. A rollout round samples once and then feeds every micro-step (gradient accumulation and
`ppo_epochs`) it covers; the Trainer's loop, optimizer, scheduler, callbacks, logging and checkpoints are
the stock ones. PPO's critic has its own optimizer and is saved in every checkpoint.

See it work: tests/test_trainer_e2e.py, tests/test_algorithms_e2e.py, examples/swap_trainer.py.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, speed_metrics

from . import publish
from . import trainer_setup as setup
from .algorithms import agg_loss, get_advantage_estimator, get_policy_loss, kl_penalty, masked_mean
from .algorithms import lagrangian_advantages, place_outcome_rewards, rollout_is_weights, value_loss
from .batch import RolloutBatch, concat_batches
from .data import RoundBatchSampler, RoundDataLoader, keep_rows, prepare_prompts
from .metrics import accuracy_metric
from .rewards import score_completions
from .rewards.shaping import overlong_penalty
from .roles import Actor

CRITIC_DIR = "critic"
COST_CRITIC_DIR = "cost_critic"
KL_CTRL_FILE = "kl_controller.json"
ROUND_FILE = "rl_round_{}.pt"
REFERENCE_FILE = "reference.safetensors"  # a KL reference that SyncRefModelCallback moved  # per process: the rollout round in progress, so a resume continues it exactly
SAFETY_FILE = "safety.json"


class VerlTrainer(Trainer):
    """RL post-training with the Trainer you know. Swap `Trainer` -> `VerlTrainer`, `TrainingArguments` ->
    `VerlConfig`, and pass `reward_funcs`.

    Args:
        model / actor: the policy, a model id or path, or a `PreTrainedModel` (`actor=` is the seed posts' name).
        args: a `VerlConfig` (a plain `TrainingArguments` is converted, RL fields at their defaults).
        ref_policy: the KL reference (model, id or path); default a frozen copy of the starting policy
            (adapters disabled for PEFT). Only loaded when `kl_coef > 0`.
        critic: PPO's value model (`Critic`, token-classification model, id or path); default a value head on
            the policy's checkpoint. Only used with `adv_estimator="gae"`.
        reward_funcs: callables or names (see `VerlConfig.reward_funcs`); added to those in `args`.
        reward_model: a `RewardModel`, a sequence-classification model, or an id/path; one more reward function.
        processing_class / tokenizer: the tokenizer; default loaded from the model's path.
        peft_config: a `peft` config; the actor becomes a PEFT model.
    """

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, *, actor=None, ref_policy=None, critic=None, reward_funcs=None,
                 reward_model=None, tokenizer=None, callbacks=None, peft_config=None, optimizers=(None, None),
                 **trainer_kwargs):
        model = setup.one_of_aliases("model", model, "actor", actor)
        if model is None:
            raise ValueError("VerlTrainer needs a policy: model='<id or path>' or a PreTrainedModel (or actor=...).")
        args = setup.as_verl_config(args, model)
        # Cheap checks first: rewards, tokenizer and data fail here, before any model is loaded.
        self.reward_funcs = setup.resolve_rewards(args, reward_funcs, reward_model)
        self.reward_weights = list(args.reward_weights or [1.0] * len(self.reward_funcs))
        tokenizer = setup.load_tokenizer(
            setup.one_of_aliases("processing_class", processing_class, "tokenizer", tokenizer), model)
        train_dataset, eval_dataset = _prepare_datasets(train_dataset, eval_dataset, tokenizer, args)

        policy = setup.load_policy(model, peft_config)
        super().__init__(
            model=policy, args=args, data_collator=data_collator or keep_rows, train_dataset=train_dataset,
            eval_dataset=eval_dataset, processing_class=tokenizer, callbacks=callbacks, optimizers=optimizers,
            **trainer_kwargs,
        )
        engine = setup.make_engine(self, args)
        self.actor = Actor(self.model, tokenizer, engine=engine, temperature=args.temperature,
                           weight_sync=setup.make_weight_sync(args, engine))
        self.add_callback(_EngineWeightsChanged(self.actor))
        setup.place_reward_models(self, self.reward_funcs)
        self.ref_policy = setup.make_reference(self, ref_policy, args) if args.kl_coef > 0 else None
        self.critic = setup.make_critic(critic, model, args, trainer=self)
        self.safety = setup.make_safety(self, model, args)  # Safe-RLHF: costs, lambda, cost critic
        self.kl_ctrl = setup.make_kl_ctrl(args)
        self.advantage_fn = get_advantage_estimator(args.adv_estimator)
        self.policy_loss_fn = get_policy_loss(args.policy_loss)
        self._round: list[RolloutBatch] = []
        self._micro_step = 0
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._last_phase_seconds = 0.0
        self._refill_order: list[int] = []
        self._rollout_calls: dict[int, int] = {}
        self.last_round: RolloutBatch | None = None  # the latest scored round (CompletionSamplesCallback reads it)
        for callback in self.callback_handler.callbacks:
            _bind(callback, self)

    def add_callback(self, callback):
        super().add_callback(callback)
        if hasattr(self, "last_round"):  # after __init__: bind now (during it, the loop above does)
            for added in self.callback_handler.callbacks:
                if added is callback or type(added) is callback:
                    _bind(added, self)

    def restore_checkpoint(self, checkpoint: str) -> None:
        """Back to a checkpoint in-process (KLGuardCallback's rollback): policy weights, optimizer, scheduler
        and the RL state (critic, KL controller, lambda); the step counter goes on, and a fresh round starts."""
        self._restoring = True  # the round in progress is not brought back: a fresh one starts
        try:
            self._load_from_checkpoint(checkpoint)
            self._load_optimizer_and_scheduler(checkpoint)
        finally:
            self._restoring = False
        rounds = self.args.micro_steps_per_round
        self._round, self._kl_seen = [], None
        self._micro_step = -(-self._micro_step // rounds) * rounds  # the next round boundary
        self.actor.mark_weights_changed()

    # ------------------------------------------------------------------ the RL step
    def train(self, *args, **kwargs):
        self._position_synced = False  # a resumed run may start in the middle of a round
        self.actor.mark_weights_changed()  # a resume loads other weights after any earlier sync
        return super().train(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-step. The first micro-step of a round samples and prepares the whole round."""
        self._sync_round_position()
        if self._micro_step % self.args.micro_steps_per_round == 0 or not self._round:
            self._flush_kl_measurement()                        # 0. KL control from the last round's updates
            self._sync_engine_weights()                         # 0b. current weights into the rollout engine
            batch = self._score(self._rollout(inputs))          # 1-2. sample responses, score them
            batch = self._keep_informative_groups(batch)        # 2b. DAPO dynamic sampling (when enabled)
            batch = self._add_greedy_baselines(batch)           # 2c. ReMax baselines (when adv_estimator="remax")
            batch = self._add_reference_logprobs(batch)         # 3. reference log-probs (when kl_coef > 0)
            batch = self._add_old_logprobs(batch)               # 3b. behaviour log-probs, if the round spans updates
            batch = self._add_values(batch)                     # 3c. critic values (PPO)
            batch = self._compute_advantages(batch)             # 4. advantages (pure math)
            self._round, self.last_round = self._plan_micro_batches(batch), batch
            self._free_engine_memory()                          # 4b. vLLM sleep mode: memory to the update
        micro_batch = self._round[self._micro_step % self.args.micro_steps_per_round]
        self._micro_step += 1
        return self._update(model, micro_batch)                 # 5. losses and backward

    def _sync_round_position(self) -> None:
        """After a resume, continue at the right micro-step of the round (the dataloader repeats the round's
        prompts once per micro-step, and the Trainer skipped the ones already trained)."""
        if not getattr(self, "_position_synced", True):
            steps = self.state.global_step * self.args.gradient_accumulation_steps
            self._micro_step, self._round = steps % self.args.micro_steps_per_round, []
            self._position_synced = True

    def _sync_engine_weights(self) -> None:
        """Only for an engine with its own weights (verl_hf.sync), and only after the weights changed."""
        if not self.actor.engine_is_stale:
            return
        with self._timer("sync"):
            metrics = self.actor.sync_weights()
        self._record(metrics)

    def _free_engine_memory(self) -> None:
        """An engine with a sleep mode releases its memory for the updates; the next sync wakes it (the
        updates change the weights, so a sync always comes before the next generation)."""
        if hasattr(self.actor.engine, "sleep"):
            self.actor.engine.sleep()

    def _rollout(self, rows: list[dict], train: bool = True) -> RolloutBatch:
        with self._timer("rollout"):
            batch = self.actor.generate_sequences(
                prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, row_seeds=self._row_seeds(len(rows), train),
                **self._sampling(train))
        lengths = batch.response_mask.sum(dim=1).float()
        self._record({
            "response_length/mean": lengths.mean().item(), "response_length/max": lengths.max().item(),
            "response_length/truncated_frac": batch.truncated.float().mean().item(),
            "rollout/tokens_per_s": lengths.sum().item() / max(self._last_phase_seconds, 1e-9),
        })
        return batch

    def _row_seeds(self, count: int, train: bool) -> list[int] | None:
        """With `rollout_seed_per_prompt`: a seed per prompt from (seed, step, call of the step, the prompt's
        place in the global round), the same whatever the number of processes."""
        if not (train and self.args.rollout_seed_per_prompt):
            return None
        calls = self._rollout_calls.get(self.state.global_step, 0)
        self._rollout_calls = {self.state.global_step: calls + 1}
        first = self.args.process_index * count
        return [hash((self.args.seed, self.state.global_step, calls, first + i)) for i in range(count)]

    def _sampling(self, train: bool) -> dict:
        """Sampling arguments of `Actor.generate_sequences` for training rollouts or evaluation."""
        args = self.args
        return dict(max_new_tokens=args.max_response_length, temperature=args.temperature, top_p=args.top_p,
                    top_k=args.top_k, num_return_sequences=args.num_generations if train else args.eval_num_generations,
                    do_sample=True if train else args.eval_do_sample,
                    return_logprobs=train and args.rollout_is is not None)

    def _score(self, batch: RolloutBatch) -> RolloutBatch:
        with self._timer("reward"):
            batch.rewards, result, penalty = self._rewards(batch)
        self._record(result.metrics())
        device = batch.response_mask.device
        batch.reward_per_function, batch.valid = result.per_function.to(device), result.valid.to(device)
        if self.args.overlong_buffer_len:
            self._record({"reward/overlong_penalty": penalty.mean().item()})
        if self.safety is not None:
            batch = self._score_costs(batch)
        if not bool(batch.valid.all()):
            # Unscored rows take no part: no gradient (mask 0), and no share in their group's baseline
            # (see _advantage_groups).
            batch.response_mask = batch.response_mask * batch.valid.unsqueeze(1).to(batch.response_mask.dtype)
            self._record({"reward/excluded_frac": 1.0 - batch.valid.float().mean().item()})
        return batch

    def _score_costs(self, batch: RolloutBatch) -> RolloutBatch:
        """Safe-RLHF costs; the safety filter drops responses over its threshold like unscored ones."""
        with self._timer("cost"):
            costs, metrics = self.safety.costs(batch.prompts, batch.completions, self._completion_ids(batch),
                                               batch.columns)
        batch.costs = costs.to(batch.response_mask.device)
        self._record(metrics)
        if self.args.safety_filter_threshold is not None:
            keep = batch.costs <= self.args.safety_filter_threshold
            batch.valid = batch.valid & keep
            self._record({"safety/filtered_frac": 1.0 - keep.float().mean().item()})
        return batch

    def _rewards(self, batch: RolloutBatch):
        """(rewards (B,) with shaping, the functions' RewardResult, overlong penalty (B,)); records nothing."""
        result = self._run_reward_funcs(batch)
        penalty = overlong_penalty(batch.response_mask.sum(dim=1), self.args.max_response_length,
                                   self.args.overlong_buffer_len, self.args.overlong_penalty_factor)
        return torch.nan_to_num(result.rewards.to(penalty.device), nan=0.0) + penalty, result, penalty

    def _run_reward_funcs(self, batch: RolloutBatch):
        return score_completions(
            self.reward_funcs, self.reward_weights, prompts=batch.prompts, completions=batch.completions,
            completion_ids=self._completion_ids(batch), columns=batch.columns, on_error=self.args.reward_on_error,
        )

    @staticmethod
    def _completion_ids(batch: RolloutBatch) -> list[list[int]]:
        return [ids[mask.bool()].tolist() for ids, mask in zip(batch.response_ids, batch.response_mask)]

    def _keep_informative_groups(self, batch: RolloutBatch) -> RolloutBatch:
        """DAPO dynamic sampling (Yu et al. 2025): groups whose rewards are all equal carry no gradient under
        group baselines, so they are dropped and more prompts are sampled until the round is full again.

        Deviation: refill prompts come from a separate shuffled pass over the train set (the Trainer owns the
        dataloader). After `dynamic_sampling_max_rounds` extra rounds the round is completed with dropped
        groups (advantage 0), counted in `dynamic_sampling/filler_groups`, instead of failing the run.
        """
        args = self.args
        if not args.dynamic_sampling:
            return batch
        kept, dropped = _split_informative(batch)
        self._record({"dynamic_sampling/informative_frac": _num_groups(kept) / max(_num_groups(batch), 1)})
        extra_rounds = 0
        while _num_groups(kept) < args.prompts_per_round and extra_rounds < args.dynamic_sampling_max_rounds:
            more, more_dropped = _split_informative(self._score(self._rollout(self._refill_rows())))
            kept, dropped = self._concat([kept, more]), self._concat([dropped, more_dropped])
            extra_rounds += 1
        self._record({"dynamic_sampling/extra_rounds": extra_rounds})
        missing = args.prompts_per_round - _num_groups(kept)
        if missing > 0:
            self._record({"dynamic_sampling/filler_groups": missing})
            kept = self._concat([kept, _first_groups(dropped, missing)])
        kept = _first_groups(kept, args.prompts_per_round)
        if len(kept) != args.rollout_generation_batch_size:
            raise RuntimeError(f"dynamic sampling built a round of {len(kept)} rows, expected "
                               f"{args.rollout_generation_batch_size}; please report this.")
        return kept

    def _refill_rows(self) -> list[dict]:
        """The next prompts of an independent shuffled stream over the train set (one per process)."""
        need = self.args.prompts_per_round
        if len(self._refill_order) < need:
            seed = self.args.seed + 7919 * (self.args.process_index + 1) + self._micro_step
            order = torch.randperm(len(self.train_dataset), generator=torch.Generator().manual_seed(seed))
            self._refill_order += order.tolist()
        take, self._refill_order = self._refill_order[:need], self._refill_order[need:]
        return [self.train_dataset[i] for i in take]

    def _concat(self, batches: list[RolloutBatch | None]) -> RolloutBatch | None:
        batches = [b for b in batches if b is not None and len(b)]
        return concat_batches(batches, self.processing_class.pad_token_id) if batches else None

    def _add_greedy_baselines(self, batch: RolloutBatch) -> RolloutBatch:
        """ReMax (Li et al. 2024): the reward of each prompt's greedy response is its baseline."""
        if self.args.adv_estimator != "remax":
            return batch
        first_rows = _first_index_per_group(batch)
        firsts = batch.select(first_rows)
        rows = [{"prompt": firsts.prompts[i], "prompt_ids": ids[m.bool()].tolist(),
                 **{k: v[i] for k, v in firsts.columns.items()}}
                for i, (ids, m) in enumerate(zip(firsts.prompt_ids, firsts.prompt_mask))]
        with self._timer("baseline"):
            greedy = self.actor.generate_sequences(
                prompt_ids=[r["prompt_ids"] for r in rows], rows=rows,
                **{**self._sampling(train=True), "num_return_sequences": 1, "do_sample": False})
            baseline = self._rewards(greedy)[0]
        position = {g: k for k, g in enumerate(firsts.group_ids.tolist())}
        batch.reward_baselines = baseline[[position[g] for g in batch.group_ids.tolist()]]
        self._record({"reward/greedy_baseline": baseline.mean().item()})
        return batch

    def _add_reference_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        if self.ref_policy is not None:
            with self._timer("ref_logprobs"):
                batch.ref_logprobs = self.ref_policy.get_logprobs(batch, self.args.per_device_train_batch_size)
        return batch

    def _add_old_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        """Behaviour-policy log-probs. One update per round is on-policy: the micro-steps reuse the live
        log-probs (detached) instead of paying an extra forward pass; several updates, or KL in the reward,
        need them stored."""
        args = self.args
        updates_per_round = args.micro_steps_per_round // args.gradient_accumulation_steps
        if updates_per_round > 1 or (args.use_kl_in_reward and batch.ref_logprobs is not None):
            with self._timer("old_logprobs"):
                batch.old_logprobs = self.actor.get_logprobs(batch, args.per_device_train_batch_size)
        return batch

    def _add_values(self, batch: RolloutBatch) -> RolloutBatch:
        if self.critic is not None:
            with self._timer("values"):
                batch.values = self.critic.compute_values(batch, self.args.per_device_train_batch_size)
                if self.safety is not None and self.safety.cost_critic is not None:
                    batch.cost_values = self.safety.cost_critic.compute_values(
                        batch, self.args.per_device_train_batch_size)
        return batch

    def _compute_advantages(self, batch: RolloutBatch) -> RolloutBatch:
        args = self.args
        with self._timer("advantage"):
            mask = batch.response_mask.float()
            token_rewards = place_outcome_rewards(batch.rewards, mask)
            if args.use_kl_in_reward and batch.ref_logprobs is not None:
                kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, args.kl_kind) * mask
                token_rewards = token_rewards - self.kl_ctrl.value * kl
                self._record({"kl/in_reward": masked_mean(kl, mask).item(), "kl/coef": self.kl_ctrl.value})
                self._kl_seen = [float((kl * mask).sum()), float(mask.sum()), float(len(batch))]
            batch.token_level_rewards = token_rewards
            batch.advantages, batch.returns = self._estimate(batch, token_rewards, batch.values)
            if self.safety is not None:
                batch.advantages = self._lagrangian_advantages(batch, batch.advantages, token_rewards)
        self._record({"advantages/mean": masked_mean(batch.advantages, mask).item(),
                      "advantages/abs_mean": masked_mean(batch.advantages.abs(), mask).item()})
        return batch

    def _estimate(self, batch: RolloutBatch, token_rewards: torch.Tensor, values) -> tuple:
        """(advantages, returns) of the configured estimator for these per-token rewards."""
        args = self.args
        return self.advantage_fn(
            token_level_rewards=token_rewards, response_mask=batch.response_mask.float(),
            group_ids=_advantage_groups(batch), values=values, reward_baselines=batch.reward_baselines,
            gamma=args.gamma, lam=args.lam, norm_by_std=args.norm_adv_by_std_in_grpo)

    def _lagrangian_advantages(self, batch: RolloutBatch, reward_advantages, token_rewards) -> torch.Tensor:
        """Safe-RLHF: lambda steps on the windowed episode cost, cost advantages come from the same estimator
        (GAE with the cost critic, or group-normalised), and the policy follows (A_r - lambda A_c) / (1 + lambda).
        KL in the reward enters the cost with the opposite sign, so its weight stays kl_coef whatever lambda
        (Safe-RLHF's code puts half in each; that is the same up to kl_coef)."""
        mask = batch.response_mask.float()
        # Once per round, on the round that trains (after dynamic sampling): every process adds every process's
        # costs to its window, so lambda agrees everywhere without being sent.
        everyone = batch.costs.tolist()
        if self.args.world_size > 1:
            from accelerate.utils import gather_object

            everyone = gather_object(everyone)
        self.safety.observe(everyone)
        self._record(self.safety.update_lambda(self.state.global_step))
        token_costs = place_outcome_rewards(batch.costs, mask)
        kl_in_reward = token_rewards - place_outcome_rewards(batch.rewards, mask)  # -beta * KL, or zeros
        cost_advantages, batch.cost_returns = self._estimate(batch, token_costs - kl_in_reward, batch.cost_values)
        self._record({"advantages/reward_mean": masked_mean(reward_advantages, mask).item(),
                      "advantages/cost_mean": masked_mean(cost_advantages, mask).item()})
        return lagrangian_advantages(reward_advantages, cost_advantages, self.safety.lagrange_lambda)

    def _flush_kl_measurement(self) -> None:
        """Update the KL coefficient once per round from the round's token-mean KL, summed over processes
        (so every rank keeps the same coefficient). Adaptive control counts samples (Ziegler et al.); PID
        takes one update as its time step."""
        seen, self._kl_seen = getattr(self, "_kl_seen", None), None
        if seen is None or self.args.kl_controller == "fixed":
            return
        totals = torch.tensor(seen, device=self.args.device)
        if self.args.world_size > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        kl_sum, tokens, samples = totals.tolist()
        self.kl_ctrl.update(kl_sum / max(tokens, 1.0), 1 if self.args.kl_controller == "pid" else int(samples))

    def _plan_micro_batches(self, batch: RolloutBatch) -> list[RolloutBatch]:
        """Cut the round into micro-batches, each carrying its optimizer step's loss normalisers, so that the
        accumulated gradient equals the gradient of the whole step's loss (not a mean of micro-means).

        Under data parallelism the token count is the step's total over all processes, divided by their
        number: gradients are averaged across processes, so the result is the global token mean (as verl).
        """
        args = self.args
        step_rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self._round_size = len(batch)
        steps = batch.split(step_rows)
        tokens = torch.tensor([float(s.response_mask.sum()) for s in steps], device=args.device)
        if args.world_size > 1:
            tokens = self.accelerator.reduce(tokens, reduction="sum") / args.world_size
        micro = []
        for step_batch, step_tokens in zip(steps, tokens.tolist()):
            for mb in step_batch.split(args.per_device_train_batch_size):
                mb.step_num_tokens, mb.step_num_seqs = max(step_tokens, 1.0), float(len(step_batch))
                micro.append(mb)
        return micro * args.ppo_epochs

    def _update(self, model, mb: RolloutBatch) -> torch.Tensor:
        """Actor loss and backward (skipped during critic warm-up), then the critic's (PPO)."""
        started = time.perf_counter()
        mb = mb.to(self.args.device)
        if self.state.global_step >= self.args.critic_warmup_steps:
            model.train()
            with self.compute_loss_context_manager():
                logprobs, entropy = self.actor.compute_logprobs(
                    mb, model=model, with_entropy=self._entropy_needed(), entropy_grad=self.args.entropy_coef > 0)
                loss = self._actor_loss(mb, logprobs, entropy)
            kwargs = {"scale_wrt_gas": False} if self.is_deepspeed_enabled else {}
            self.accelerator.backward(loss, **kwargs)
        else:
            loss = torch.zeros((), device=self.args.device)
        if self.critic is not None:
            self._critic_update(mb, self.critic, mb.values, mb.returns, "critic")
        if self.safety is not None and self.safety.cost_critic is not None:
            self._critic_update(mb, self.safety.cost_critic, mb.cost_values, mb.cost_returns, "cost_critic")
        self._record({"time/update": time.perf_counter() - started})
        return loss.detach()

    def _entropy_needed(self) -> bool:
        """Entropy over the vocabulary is costly: only for an entropy bonus, or on steps that will be logged."""
        if self.args.entropy_coef > 0 or self.args.logging_strategy != "steps":
            return True
        every = self.state.logging_steps or 1
        return (self.state.global_step + 1) % every == 0 or self.state.global_step == 0

    def _loss_norms(self, mb: RolloutBatch) -> dict:
        return {"num_tokens": mb.step_num_tokens, "num_seqs": mb.step_num_seqs,
                "norm_constant": self.args.max_response_length}

    def _actor_loss(self, mb: RolloutBatch, logprobs, entropy):
        args, mask, norms = self.args, mb.response_mask.float(), self._loss_norms(mb)
        old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
        clips = {k: getattr(args, k) for k in ("clip_ratio_low", "clip_ratio_high") if getattr(args, k) is not None}
        loss, metrics = self.policy_loss_fn(
            old, logprobs, self._corrected_advantages(mb, old), mask, loss_agg_mode=args.loss_agg_mode,
            clip_ratio_c=args.clip_ratio_c, **clips, **norms, **args.policy_loss_kwargs,
        )
        self._record({f"actor/{k}": v for k, v in metrics.items()})
        if entropy is not None:
            self._record({"actor/entropy": masked_mean(entropy.detach(), mask).item()})
        if mb.ref_logprobs is not None:
            kl = kl_penalty(logprobs, mb.ref_logprobs, args.kl_kind)
            self._record({"kl": masked_mean(kl.detach(), mask).item()})
            if not args.use_kl_in_reward:
                loss = loss + self.kl_ctrl.value * agg_loss(kl, mask, args.loss_agg_mode, **norms)
                self._record({"kl/coef": self.kl_ctrl.value})
                self._accumulate_kl(kl.detach(), mask)
        if args.entropy_coef:
            loss = loss - args.entropy_coef * agg_loss(entropy, mask, args.loss_agg_mode, **norms)
        return loss

    def _corrected_advantages(self, mb: RolloutBatch, old_logprobs: torch.Tensor) -> torch.Tensor:
        """With `rollout_is`: advantages x the truncated/masked weights pi_old / pi_rollout (see
        algorithms/rollout_correction.py for why weighting the advantages is the same gradient)."""
        args = self.args
        if args.rollout_is is None:
            return mb.advantages
        weights, metrics = rollout_is_weights(old_logprobs, mb.rollout_logprobs, mb.response_mask, args.rollout_is,
                                              args.rollout_is_mode, args.rollout_is_threshold,
                                              args.rollout_is_threshold_low)
        self._record(metrics)
        return mb.advantages * weights

    def _accumulate_kl(self, kl, mask) -> None:
        """Token-weighted KL of this round's updates; samples = the round's rows (not x ppo_epochs)."""
        seen = getattr(self, "_kl_seen", None) or [0.0, 0.0, float(self._round_size)]
        self._kl_seen = [seen[0] + float((kl * mask).sum()), seen[1] + float(mask.sum()), seen[2]]

    def _critic_update(self, mb: RolloutBatch, critic, old_values, returns, prefix: str) -> None:
        """Clipped value loss on the same micro-batch; the critic steps with the actor's optimizer steps."""
        values = critic.forward_values(mb)
        loss, metrics = value_loss(values, old_values, returns, mb.response_mask.float(),
                                   cliprange_value=self.args.cliprange_value, loss_agg_mode=self.args.loss_agg_mode,
                                   **self._loss_norms(mb))
        critic.backward(loss)
        self._record({f"{prefix}/value_loss": loss.item(), **{f"{prefix}/{k}": v for k, v in metrics.items()}})
        if critic.steps_every_micro_step or self._micro_step % self.args.gradient_accumulation_steps == 0:
            norm = critic.step()
            if norm is not None:
                self._record({f"{prefix}/grad_norm": norm})

    # ------------------------------------------------------------------ saving and publishing the actor
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save (weights, tokenizer), plus verl_config.json; PEFT runs with save_merged_model
        write the merged model (checkpoints keep the adapter, which resuming needs)."""
        super().save_model(output_dir, _internal_call)
        output_dir = output_dir or self.args.output_dir
        if not self.args.should_save:
            return
        if self.args.save_merged_model and not os.path.basename(os.path.normpath(output_dir)).startswith(
                PREFIX_CHECKPOINT_DIR):
            self._save_merged(output_dir)
        publish.write_run_config(self, output_dir)

    def _save_merged(self, output_dir: str) -> None:
        """The adapter merged into the base weights, in place and undone afterwards: one CPU copy of the merged
        weights, no second model on the device."""
        model = self.accelerator.unwrap_model(self.model)
        if not hasattr(model, "merge_adapter"):
            return  # not a PEFT model: the plain save already wrote the full model
        if self.is_deepspeed_enabled:
            raise ValueError("save_merged_model under DeepSpeed: save the adapter (save_merged_model=False) and merge "
                             "it afterwards with peft's merge_and_unload().")
        base = model.get_base_model()
        model.merge_adapter()
        try:
            merged = {name.replace(".base_layer.", "."): p.detach().to("cpu", copy=True)
                      for name, p in base.state_dict().items() if "lora_" not in name}
        finally:
            model.unmerge_adapter()
        base.save_pretrained(output_dir, state_dict=merged)
        for name in ("adapter_model.safetensors", "adapter_model.bin", "adapter_config.json"):
            path = os.path.join(output_dir, name)
            if os.path.exists(path):
                os.remove(path)

    def create_model_card(self, model_name: str | None = None, **kwargs) -> None:
        """README.md for the Hub: algorithm, base model, data, a reward table and how to load the actor."""
        if not self.is_world_process_zero():
            return
        repo_id = self.hub_model_id or model_name or os.path.basename(os.path.normpath(self.args.output_dir))
        with open(os.path.join(self.args.output_dir, "README.md"), "w") as f:
            f.write(publish.model_card(publish.run_info(self), repo_id))

    # ------------------------------------------------------------------ checkpoints: the critic travels along
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        self._save_round_state(output_dir)
        if self.ref_policy is not None and getattr(self.ref_policy, "moved", False) and self.args.should_save:
            from safetensors.torch import save_model  # a reference moved by SyncRefModelCallback

            save_model(self.ref_policy.model, os.path.join(output_dir, REFERENCE_FILE))
        if self.args.should_save:
            with open(os.path.join(output_dir, KL_CTRL_FILE), "w") as f:
                json.dump({"controller": self.kl_ctrl.state_dict()}, f)  # its pending sums: per process, below
        if self.critic is not None:
            self.critic.save_checkpoint(os.path.join(output_dir, CRITIC_DIR), main_process=self.args.should_save)
        if self.safety is not None:
            if self.args.should_save:
                with open(os.path.join(output_dir, SAFETY_FILE), "w") as f:
                    json.dump(self.safety.state_dict(), f)
            if self.safety.cost_critic is not None:
                self.safety.cost_critic.save_checkpoint(os.path.join(output_dir, COST_CRITIC_DIR),
                                                        main_process=self.args.should_save)

    def _save_round_state(self, output_dir: str) -> None:
        """The round being trained (its planned micro-batches: samples, behaviour log-probs, advantages), where
        in it the run is, the refill stream of dynamic sampling and the metrics not yet logged. Without them a
        checkpoint taken inside a multi-step round would resume on a freshly sampled round."""
        state = {"round": self._round, "micro_step": self._micro_step, "last_round": self.last_round,
                 "round_size": getattr(self, "_round_size", None), "refill_order": self._refill_order,
                 "rollout_calls": self._rollout_calls, "metrics": dict(self._metrics),
                 "kl_seen": getattr(self, "_kl_seen", None), "world_size": self.args.world_size}
        os.makedirs(output_dir, exist_ok=True)  # the main process may not have created it yet
        torch.save(state, os.path.join(output_dir, ROUND_FILE.format(self.args.process_index)))

    def _load_round_state(self, checkpoint: str) -> None:
        """Every process continues its saved round, or (a checkpoint without them, from an older version) all
        start a fresh one together: a mix would enter different collectives."""
        path = os.path.join(checkpoint, ROUND_FILE.format(self.args.process_index))
        state = torch.load(path, weights_only=False) if os.path.exists(path) else None  # our own file
        if state is not None and state["world_size"] != self.args.world_size:
            raise ValueError(f"{checkpoint} was saved by {state['world_size']} processes and holds their rollout "
                             f"rounds; resume it with {state['world_size']} processes (or delete its rl_round_*.pt "
                             f"files to start a fresh round).")
        everyone = torch.tensor([0.0 if state is None else 1.0], device=self.args.device)
        if self.args.world_size > 1:
            everyone = self.accelerator.reduce(everyone, reduction="sum")
        if everyone.item() < self.args.world_size:  # the round restarts (see _sync_round_position)
            return
        self._round, self._micro_step, self.last_round = state["round"], state["micro_step"], state["last_round"]
        self._round_size, self._refill_order = state["round_size"], state["refill_order"]
        self._rollout_calls, self._kl_seen = state["rollout_calls"], state["kl_seen"]
        self._metrics = defaultdict(list, state["metrics"])
        self._position_synced = True

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and not getattr(self, "_restoring", False):
            self._load_round_state(checkpoint)
        if checkpoint is not None and os.path.exists(os.path.join(checkpoint, REFERENCE_FILE)):
            from safetensors.torch import load_model  # a reference moved by SyncRefModelCallback

            load_model(self.ref_policy.model, os.path.join(checkpoint, REFERENCE_FILE))
            self.ref_policy.moved = True
        if checkpoint is not None and os.path.exists(os.path.join(checkpoint, KL_CTRL_FILE)):
            with open(os.path.join(checkpoint, KL_CTRL_FILE)) as f:
                saved = json.load(f)
            self.kl_ctrl.load_state_dict(saved["controller"])
            if "pending" in saved:  # older checkpoints; newer ones keep it per process (the round file)
                self._kl_seen = saved["pending"]
        if checkpoint is None:
            return
        if self.safety is not None:
            self._load_safety(checkpoint)
        if self.critic is None:
            return
        critic_dir = os.path.join(checkpoint, CRITIC_DIR)
        if not os.path.isdir(critic_dir):
            raise FileNotFoundError(f"{checkpoint} has no {CRITIC_DIR}/ folder: it was not saved by a PPO run.")
        self.critic.load_checkpoint(critic_dir)

    def _load_safety(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, SAFETY_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{checkpoint} has no {SAFETY_FILE}: it was not saved by a Safe-RLHF run "
                                    f"(cost_funcs / cost_model_path).")
        with open(path) as f:
            self.safety.load_state_dict(json.load(f))
        if self.safety.cost_critic is not None:
            self.safety.cost_critic.load_checkpoint(os.path.join(checkpoint, COST_CRITIC_DIR))

    # ------------------------------------------------------------------ data
    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("VerlTrainer: training requires a train_dataset with a 'prompt' column.")
        args = self.args
        sampler = RoundBatchSampler(
            len(self.train_dataset), args.prompts_per_round, args.micro_steps_per_round,
            num_processes=args.world_size, process_index=args.process_index, seed=args.data_seed or args.seed,
        )
        return RoundDataLoader(self.train_dataset, batch_sampler=sampler, collate_fn=self.data_collator,
                               num_workers=args.dataloader_num_workers)

    def floating_point_ops(self, inputs) -> int:
        """Training FLOPs of the micro-step just run (6 x parameters x tokens), for `total_flos`."""
        micro_batch = self._round[(self._micro_step - 1) % self.args.micro_steps_per_round] if self._round else None
        if micro_batch is None:
            return 0
        if not hasattr(self, "_num_params"):
            self._num_params = sum(p.numel() for p in self.model.parameters())
        return 6 * self._num_params * int(micro_batch.attention_mask.sum())

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """Generate on the eval prompts (greedy unless `eval_do_sample`) and report reward and accuracy."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("VerlTrainer.evaluate needs an eval_dataset with a 'prompt' column.")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        if "prompt_ids" not in dataset.column_names:
            dataset = prepare_prompts(dataset, self.processing_class, self.args.data_key_map,
                                      self.args.max_prompt_length, metric_key_prefix)
        started = time.time()
        metrics = self._evaluate_rewards(dataset, metric_key_prefix)
        metrics.update(speed_metrics(metric_key_prefix, started, num_samples=len(dataset)))
        self._evaluating = True
        try:
            self.log(metrics)
        finally:
            self._evaluating = False
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _evaluate_rewards(self, dataset, prefix: str) -> dict[str, float]:
        """Each process scores every world_size-th prompt; shards are padded to the same number of generate
        calls (ZeRO-3 and NCCL collectives need every rank in step) and the padding is dropped again."""
        args = self.args
        self._sync_engine_weights()
        indices = list(range(args.process_index, len(dataset), args.world_size))
        per_rank = -(-len(dataset) // args.world_size)
        real = len(indices)
        indices += [indices[-1] if indices else 0] * (per_rank - real)
        scores, lengths, costs = [], [], []
        for start in range(0, len(indices), args.per_device_eval_batch_size):
            rows = [dataset[i] for i in indices[start : start + args.per_device_eval_batch_size]]
            batch = self.actor.generate_sequences(
                prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, **self._sampling(train=False))
            scores += self._run_reward_funcs(batch).per_function.tolist()
            lengths += batch.response_mask.sum(dim=1).float().tolist()
            if self.safety is not None:
                costs += self.safety.costs(batch.prompts, batch.completions, self._completion_ids(batch),
                                           batch.columns)[0].tolist()
        keep = real * args.eval_num_generations
        scores, lengths, costs = scores[:keep], lengths[:keep], costs[:keep]
        if args.world_size > 1:
            from accelerate.utils import gather_object

            scores, lengths, costs = gather_object(scores), gather_object(lengths), gather_object(costs)
        per_function = torch.tensor(scores, dtype=torch.float32).view(-1, len(self.reward_funcs))
        correct = (per_function[:, 0] >= args.eval_correct_threshold).long()
        total = torch.nansum(per_function * torch.tensor(self.reward_weights), dim=1)
        metrics = {f"{prefix}_reward": total.mean().item(),
                   f"{prefix}_accuracy": accuracy_metric().compute(predictions=correct.tolist(),
                                                                    references=[1] * len(correct))["accuracy"],
                   f"{prefix}_response_length": sum(lengths) / max(len(lengths), 1)}
        for j, (name, _) in enumerate(self.reward_funcs):
            scored = per_function[:, j][~torch.isnan(per_function[:, j])]
            if scored.numel():
                metrics[f"{prefix}_reward/{name}"] = scored.mean().item()
        if costs:
            metrics[f"{prefix}_cost"] = sum(costs) / len(costs)
            metrics[f"{prefix}_unsafe_rate"] = sum(c > 0 for c in costs) / len(costs)
        return metrics

    # ------------------------------------------------------------------ logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the RL metrics gathered since the last log (means over steps and processes) to training logs."""
        if not getattr(self, "_evaluating", False):
            logs = {**logs, **self._metric_means()}
            self._metrics.clear()
        super().log(logs, start_time)

    def _metric_means(self) -> dict[str, float]:
        """Mean of every recorded metric, pooled over all processes (every rank calls `log` together)."""
        local = {k: [sum(v), len(v)] for k, v in self._metrics.items() if v}
        if self.args.world_size > 1:
            from accelerate.utils import gather_object

            pooled: dict[str, list[float]] = {}
            for part in gather_object([local]):
                for k, (total, count) in part.items():
                    pooled.setdefault(k, [0.0, 0])
                    pooled[k][0] += total
                    pooled[k][1] += count
            local = pooled
        return {k: total / count for k, (total, count) in local.items()}

    def _record(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._metrics[key].append(float(value))

    @contextmanager
    def _timer(self, phase: str):
        started = time.perf_counter()
        yield
        self._last_phase_seconds = time.perf_counter() - started
        self._record({f"time/{phase}": self._last_phase_seconds})


def _bind(callback, trainer) -> None:
    """Callbacks that need the trainer (its last round, reference, checkpoints) define `bind(trainer)`."""
    if hasattr(callback, "bind"):
        callback.bind(trainer)


class _EngineWeightsChanged(TrainerCallback):
    """Every optimizer step changes the weights: the actor's engine copy (if any) is stale until the next sync,
    also for generation that does not go through training_step (evaluation, a user's callback)."""

    def __init__(self, actor: Actor):
        self.actor = actor

    def on_step_end(self, args, state, control, **kwargs):
        self.actor.mark_weights_changed()


def _prepare_datasets(train_dataset, eval_dataset, tokenizer, args):
    def prepare(ds, split):
        return prepare_prompts(ds, tokenizer, args.data_key_map, args.max_prompt_length, split)

    train = prepare(train_dataset, "train") if train_dataset is not None else None
    if isinstance(eval_dataset, dict):
        return train, {k: prepare(v, f"eval[{k}]") for k, v in eval_dataset.items()}
    return train, prepare(eval_dataset, "eval") if eval_dataset is not None else None


def _advantage_groups(batch: RolloutBatch) -> torch.Tensor:
    """Group ids for the estimators: an unscored row becomes a group of its own (advantage 0) so that it
    does not shift its prompt's baseline."""
    if batch.valid is None or bool(batch.valid.all()):
        return batch.group_ids
    own = -1 - torch.arange(len(batch), device=batch.group_ids.device)
    return torch.where(batch.valid.to(batch.group_ids.device), batch.group_ids, own)


def _group_all_equal(batch: RolloutBatch, values: torch.Tensor) -> torch.Tensor:
    """(B,) True where the row's group has fewer than two distinct `values` (B,) among its scored rows."""
    _, inverse = torch.unique(batch.group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1 if len(inverse) else 0
    valid = batch.valid if batch.valid is not None else torch.ones_like(values, dtype=torch.bool)
    high = torch.full((groups,), -torch.inf, device=values.device).scatter_reduce(
        0, inverse, torch.where(valid, values, -torch.inf), "amax")
    low = torch.full((groups,), torch.inf, device=values.device).scatter_reduce(
        0, inverse, torch.where(valid, values, torch.inf), "amin")
    return (high <= low)[inverse]


def _split_informative(batch: RolloutBatch):
    """(informative rows, flat rows). With Safe-RLHF costs a group also informs when only its costs differ:
    its cost advantages are not zero."""
    flat = _group_all_equal(batch, batch.rewards)
    if batch.costs is not None:
        flat = flat & _group_all_equal(batch, batch.costs.to(batch.rewards.device))
    return batch.select(~flat), batch.select(flat)


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
