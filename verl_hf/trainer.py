"""`VerlTrainer`: online RL as a drop-in `transformers.Trainer`.

`training_step` runs the numbered steps of one RL iteration on the roles (roles/); the math lives in
algorithms/. A rollout round samples once and then feeds every micro-step (gradient accumulation and
`ppo_epochs`) it covers; the Trainer's loop, optimizer, scheduler, callbacks, logging and checkpoints are
the stock ones.

See it work: tests/test_trainer_e2e.py, examples/swap_trainer.py.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import fields

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, Trainer, TrainingArguments
from transformers.trainer_utils import speed_metrics

from .algorithms import (
    agg_loss, get_advantage_estimator, get_policy_loss, kl_penalty, masked_mean, place_outcome_rewards,
)
from .batch import RolloutBatch
from .config import VerlConfig
from .data import RoundBatchSampler, RoundDataLoader, keep_rows, prepare_prompts
from .metrics import accuracy_metric
from .rewards import resolve_reward_funcs, score_completions
from .roles import Actor, ReferencePolicy, RewardModel

logger = logging.getLogger(__name__)


class VerlTrainer(Trainer):
    """RL post-training with the Trainer you know. Swap `Trainer` -> `VerlTrainer`, `TrainingArguments` ->
    `VerlConfig`, and pass `reward_funcs`.

    Args:
        model / actor: the policy, a model id or path, or a `PreTrainedModel` (`actor=` is the seed posts' name).
        args: a `VerlConfig` (a plain `TrainingArguments` is converted, RL fields at their defaults).
        ref_policy: the KL reference (model, id or path); default a frozen copy of the starting policy
            (adapters disabled for PEFT). Only loaded when `kl_coef > 0`.
        reward_funcs: callables or names (see `VerlConfig.reward_funcs`); added to those in `args`.
        reward_model: a sequence-classification model (or id/path) scored as one more reward function.
        processing_class / tokenizer: the tokenizer; default loaded from the model's path.
        peft_config: a `peft` config; the actor becomes a PEFT model.
    """

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, *, actor=None, ref_policy=None, reward_funcs=None, reward_model=None,
                 tokenizer=None, callbacks=None, peft_config=None, optimizers=(None, None), **trainer_kwargs):
        model = _one_of_aliases("model", model, "actor", actor)
        if model is None:
            raise ValueError("VerlTrainer needs a policy: model='<id or path>' or a PreTrainedModel (or actor=...).")
        args = _as_verl_config(args, model)
        _check_trainer_support(args)
        # Cheap checks first: rewards, tokenizer and data fail here, before any model is loaded.
        self.reward_funcs = _resolve_rewards(args, reward_funcs, reward_model)
        self.reward_weights = list(args.reward_weights or [1.0] * len(self.reward_funcs))
        tokenizer = _load_tokenizer(_one_of_aliases("processing_class", processing_class, "tokenizer", tokenizer), model)
        prepare = lambda ds, split: prepare_prompts(ds, tokenizer, args.data_key_map, args.max_prompt_length, split)
        train_dataset = prepare(train_dataset, "train") if train_dataset is not None else None
        if isinstance(eval_dataset, dict):
            eval_dataset = {k: prepare(v, f"eval[{k}]") for k, v in eval_dataset.items()}
        elif eval_dataset is not None:
            eval_dataset = prepare(eval_dataset, "eval")

        model = _load_policy(model, peft_config)
        super().__init__(
            model=model, args=args, data_collator=data_collator or keep_rows, train_dataset=train_dataset,
            eval_dataset=eval_dataset, processing_class=tokenizer, callbacks=callbacks, optimizers=optimizers,
            **trainer_kwargs,
        )
        self.actor = Actor(self.model, tokenizer, temperature=args.temperature)
        self.ref_policy = _make_reference(ref_policy, self.model, args) if args.kl_coef > 0 else None
        self.advantage_fn = get_advantage_estimator(args.adv_estimator)
        self.policy_loss_fn = get_policy_loss(args.policy_loss)
        self._round: list[RolloutBatch] = []
        self._micro_step = 0
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._last_phase_seconds = 0.0

    # ------------------------------------------------------------------ the RL step
    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-step. The first micro-step of a round samples and prepares the whole round."""
        if self._micro_step % self.args.micro_steps_per_round == 0:
            batch = self._rollout(inputs)                       # 1. sample responses for the round
            batch = self._score(batch)                          # 2. rewards
            batch = self._add_reference_logprobs(batch)         # 3. reference log-probs (for KL)
            batch = self._add_old_logprobs(batch)               # 3b. behaviour log-probs, if the round spans updates
            batch = self._compute_advantages(batch)             # 4. advantages (pure math)
            self._round = self._plan_micro_batches(batch)
        micro_batch = self._round[self._micro_step % self.args.micro_steps_per_round]
        self._micro_step += 1
        return self._policy_update(model, micro_batch)          # 5. loss and backward

    def _rollout(self, rows: list[dict]) -> RolloutBatch:
        with self._timer("rollout"):
            batch = self.actor.generate_sequences(
                prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, **self._sampling(train=True))
        lengths = batch.response_mask.sum(dim=1).float()
        self._record({
            "response_length/mean": lengths.mean().item(), "response_length/max": lengths.max().item(),
            "response_length/truncated_frac": batch.truncated.float().mean().item(),
            "rollout/tokens_per_s": lengths.sum().item() / max(self._last_phase_seconds, 1e-9),
        })
        return batch

    def _sampling(self, train: bool) -> dict:
        """Sampling arguments of `Actor.generate_sequences` for training rollouts or evaluation."""
        args = self.args
        return dict(max_new_tokens=args.max_response_length, temperature=args.temperature, top_p=args.top_p,
                    top_k=args.top_k, num_return_sequences=args.num_generations if train else args.eval_num_generations,
                    do_sample=True if train else args.eval_do_sample, return_logprobs=False)

    def _score(self, batch: RolloutBatch) -> RolloutBatch:
        with self._timer("reward"):
            result = self._run_reward_funcs(batch)
        self._record(result.metrics())
        batch.rewards = torch.nan_to_num(result.rewards, nan=0.0)
        batch.reward_per_function, batch.valid = result.per_function, result.valid
        if not bool(result.valid.all()):
            # Unscored rows take no part: no gradient (mask 0) and a group of their own (advantage 0).
            batch.response_mask = batch.response_mask * result.valid.unsqueeze(1).to(batch.response_mask.dtype)
            batch.group_ids = torch.where(result.valid, batch.group_ids, -1 - torch.arange(len(batch)))
            self._record({"reward/excluded_frac": 1.0 - result.valid.float().mean().item()})
        return batch

    def _run_reward_funcs(self, batch: RolloutBatch):
        completion_ids = [ids[mask.bool()].tolist() for ids, mask in zip(batch.response_ids, batch.response_mask)]
        return score_completions(
            self.reward_funcs, self.reward_weights, prompts=batch.prompts, completions=batch.completions,
            completion_ids=completion_ids, columns=batch.columns,
        )

    def _add_reference_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        if self.ref_policy is not None:
            with self._timer("ref_logprobs"):
                batch.ref_logprobs = self.ref_policy.get_logprobs(batch, self.args.per_device_train_batch_size)
        return batch

    def _add_old_logprobs(self, batch: RolloutBatch) -> RolloutBatch:
        """Behaviour-policy log-probs. One update per round is on-policy: the micro-steps reuse the live
        log-probs (detached) instead of paying an extra forward pass; several updates need them stored."""
        args = self.args
        updates_per_round = args.micro_steps_per_round // args.gradient_accumulation_steps
        if updates_per_round > 1:
            with self._timer("old_logprobs"):
                batch.old_logprobs = self.actor.get_logprobs(batch, args.per_device_train_batch_size)
        return batch

    def _compute_advantages(self, batch: RolloutBatch) -> RolloutBatch:
        args = self.args
        with self._timer("advantage"):
            mask = batch.response_mask.float()
            token_rewards = place_outcome_rewards(batch.rewards, mask)
            if args.use_kl_in_reward and batch.ref_logprobs is not None:
                old = batch.old_logprobs if batch.old_logprobs is not None else self._current_logprobs(batch)
                kl = kl_penalty(old, batch.ref_logprobs, args.kl_kind) * mask
                token_rewards = token_rewards - args.kl_coef * kl
                self._record({"kl/in_reward": masked_mean(kl, mask).item()})
            batch.token_level_rewards = token_rewards
            batch.advantages, batch.returns = self.advantage_fn(
                token_level_rewards=token_rewards, response_mask=mask, group_ids=batch.group_ids,
                norm_by_std=args.norm_adv_by_std_in_grpo, gamma=1.0, lam=1.0,
            )
        self._record({"advantages/mean": masked_mean(batch.advantages, mask).item(),
                      "advantages/abs_mean": masked_mean(batch.advantages.abs(), mask).item()})
        return batch

    def _current_logprobs(self, batch):
        batch.old_logprobs = self.actor.get_logprobs(batch, self.args.per_device_train_batch_size)
        return batch.old_logprobs

    def _plan_micro_batches(self, batch: RolloutBatch) -> list[RolloutBatch]:
        """Cut the round into micro-batches, each carrying its optimizer step's loss normalisers, so that the
        accumulated gradient equals the gradient of the whole step's loss (not a mean of micro-means)."""
        args = self.args
        step_rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
        micro = []
        for step_batch in batch.split(step_rows):
            tokens = float(step_batch.response_mask.sum())
            for mb in step_batch.split(args.per_device_train_batch_size):
                mb.step_num_tokens, mb.step_num_seqs = max(tokens, 1.0), float(len(step_batch))
                micro.append(mb)
        return micro * args.ppo_epochs

    def _policy_update(self, model, mb: RolloutBatch) -> torch.Tensor:
        args = self.args
        started = time.perf_counter()
        mb = mb.to(self.args.device)
        model.train()
        with self.compute_loss_context_manager():
            logprobs, entropy = self.actor.compute_logprobs(
                mb, model=model, with_entropy=True, entropy_grad=args.entropy_coef > 0)
            loss = self._loss(mb, logprobs, entropy)
        kwargs = {"scale_wrt_gas": False} if self.is_deepspeed_enabled else {}
        self.accelerator.backward(loss, **kwargs)
        self._record({"time/update": time.perf_counter() - started})
        return loss.detach()

    def _loss(self, mb: RolloutBatch, logprobs, entropy):
        args, mask = self.args, mb.response_mask.float()
        norms = {"num_tokens": mb.step_num_tokens, "num_seqs": mb.step_num_seqs, "norm_constant": args.max_response_length}
        old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
        loss, metrics = self.policy_loss_fn(
            old, logprobs, mb.advantages, mask, loss_agg_mode=args.loss_agg_mode, clip_ratio_low=args.clip_ratio_low,
            clip_ratio_high=args.clip_ratio_high, clip_ratio_c=args.clip_ratio_c, **norms,
        )
        self._record({f"actor/{k}": v for k, v in metrics.items()})
        self._record({"actor/entropy": masked_mean(entropy.detach(), mask).item()})
        if mb.ref_logprobs is not None:
            kl = kl_penalty(logprobs, mb.ref_logprobs, args.kl_kind)
            self._record({"kl": masked_mean(kl.detach(), mask).item()})
            if not args.use_kl_in_reward:
                loss = loss + args.kl_coef * agg_loss(kl, mask, args.loss_agg_mode, **norms)
        if args.entropy_coef:
            loss = loss - args.entropy_coef * agg_loss(entropy, mask, args.loss_agg_mode, **norms)
        return loss

    def floating_point_ops(self, inputs) -> int:
        """Training FLOPs of the micro-step just run (6 x parameters x tokens), for `total_flos`."""
        micro_batch = self._round[(self._micro_step - 1) % self.args.micro_steps_per_round] if self._round else None
        if micro_batch is None:
            return 0
        if not hasattr(self, "_num_params"):
            self._num_params = sum(p.numel() for p in self.model.parameters())
        return 6 * self._num_params * int(micro_batch.attention_mask.sum())

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
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _evaluate_rewards(self, dataset, prefix: str) -> dict[str, float]:
        args = self.args
        shard = dataset.shard(args.world_size, args.process_index, contiguous=True) if args.world_size > 1 else dataset
        rewards, first, lengths = [], [], []
        for start in range(0, len(shard), args.per_device_eval_batch_size):
            rows = [shard[i] for i in range(start, min(start + args.per_device_eval_batch_size, len(shard)))]
            batch = self.actor.generate_sequences(
                prompt_ids=[r["prompt_ids"] for r in rows], rows=rows, **self._sampling(train=False))
            result = self._run_reward_funcs(batch)
            rewards.append(result.per_function)
            first.append(result.per_function[:, 0])
            lengths.append(batch.response_mask.sum(dim=1).float())
        per_function = self.accelerator.gather_for_metrics(torch.cat(rewards).to(args.device)).cpu()
        first_scores = per_function[:, 0]
        correct = (first_scores >= args.eval_correct_threshold).long()
        weights = torch.tensor(self.reward_weights)
        total = torch.nansum(per_function * weights, dim=1)
        metrics = {f"{prefix}_reward": total.mean().item(),
                   f"{prefix}_accuracy": accuracy_metric().compute(predictions=correct.tolist(),
                                                                    references=[1] * len(correct))["accuracy"],
                   f"{prefix}_response_length": self.accelerator.gather_for_metrics(
                       torch.cat(lengths).to(args.device)).mean().item()}
        for j, (name, _) in enumerate(self.reward_funcs):
            scored = per_function[:, j][~torch.isnan(per_function[:, j])]
            if scored.numel():
                metrics[f"{prefix}_reward/{name}"] = scored.mean().item()
        return metrics

    # ------------------------------------------------------------------ logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the RL metrics gathered since the last log (means) to the Trainer's training logs."""
        if not any(key.startswith("eval_") for key in logs):
            logs = {**logs, **{k: sum(v) / len(v) for k, v in self._metrics.items() if v}}
            self._metrics.clear()
        super().log(logs, start_time)

    def _record(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._metrics[key].append(float(value))

    @contextmanager
    def _timer(self, phase: str):
        started = time.perf_counter()
        yield
        self._last_phase_seconds = time.perf_counter() - started
        self._record({f"time/{phase}": self._last_phase_seconds})


# Estimators that need inputs VerlTrainer does not produce yet (a critic's values, a greedy baseline).
_NEEDS_ROLES = {"gae": "a critic (PPO)", "remax": "a greedy baseline rollout (ReMax)"}


def _check_trainer_support(args) -> None:
    if args.adv_estimator in _NEEDS_ROLES:
        raise ValueError(
            f"adv_estimator={args.adv_estimator!r} needs {_NEEDS_ROLES[args.adv_estimator]}, which VerlTrainer does "
            f"not run yet; write the loop over the roles instead (examples/custom_loop_ppo.py, "
            f"examples/custom_loop_remax.py), or pick grpo / rloo."
        )


def _one_of_aliases(name, value, alias, alias_value):
    if value is not None and alias_value is not None:
        raise ValueError(f"pass either {name}= or {alias}= (they are the same thing), not both.")
    return value if value is not None else alias_value


def _as_verl_config(args, model) -> VerlConfig:
    if args is None:
        name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "model")
        return VerlConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-verl")
    if isinstance(args, VerlConfig):
        return args
    if isinstance(args, TrainingArguments):
        logger.warning("VerlTrainer got TrainingArguments: converting to VerlConfig with the RL fields at their defaults.")
        values = {f.name: getattr(args, f.name) for f in fields(TrainingArguments) if f.init}
        return VerlConfig(**values)
    raise TypeError(f"args must be a VerlConfig (or TrainingArguments), got {type(args).__name__}.")


def _resolve_rewards(args: VerlConfig, reward_funcs, reward_model):
    specs = list(args.reward_funcs or [])
    if reward_funcs is not None:
        specs += list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if reward_model is not None:
        specs.append(_as_reward_model(reward_model))
    if not specs:
        raise ValueError("no reward: pass reward_funcs=[...] (callables or names such as 'gsm8k') or reward_model=.")
    funcs = resolve_reward_funcs(specs)
    if args.reward_weights is not None and len(args.reward_weights) != len(funcs):
        raise ValueError(f"reward_weights has {len(args.reward_weights)} entries for {len(funcs)} reward functions "
                         f"({[n for n, _ in funcs]}); give one weight per function.")
    return funcs


def _as_reward_model(reward_model) -> RewardModel:
    if isinstance(reward_model, RewardModel):
        return reward_model
    if isinstance(reward_model, str):
        return RewardModel.from_pretrained(reward_model)
    path = getattr(reward_model.config, "_name_or_path", None)
    if not path:
        raise ValueError("reward_model has no path to load its tokenizer from; pass "
                         "reward_model=RewardModel(model, tokenizer=...).")
    return RewardModel(reward_model, tokenizer=AutoTokenizer.from_pretrained(path))


def _load_tokenizer(tokenizer, model):
    if tokenizer is None:
        path = model if isinstance(model, str) else getattr(model.config, "_name_or_path", None)
        if not path:
            raise ValueError("pass processing_class=<tokenizer>: the model has no path to load one from.")
        tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token.")
        logger.warning(f"the tokenizer has no pad token; using its EOS token {tokenizer.eos_token!r} for padding.")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_policy(model, peft_config):
    if isinstance(model, str):
        model = AutoModelForCausalLM.from_pretrained(model)
    if not isinstance(model, (PreTrainedModel, torch.nn.Module)):
        raise TypeError(f"model must be an id, a path or a PreTrainedModel, got {type(model).__name__}.")
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
    return model


def _make_reference(ref_policy, actor_model, args) -> ReferencePolicy:
    if ref_policy is None:
        return ReferencePolicy.from_actor(actor_model, args.temperature)
    if isinstance(ref_policy, ReferencePolicy):
        return ref_policy
    if isinstance(ref_policy, str):
        ref_policy = AutoModelForCausalLM.from_pretrained(ref_policy)
    return ReferencePolicy(ref_policy.to(args.device), args.temperature)
