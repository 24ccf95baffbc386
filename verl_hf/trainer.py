"""`VerlTrainer`: online RL as a drop-in `transformers.Trainer`, a thin adapter over the RL parts.

`training_step` runs one RL iteration in numbered steps: the round builder (round.py) turns the
dataloader's prompt rows into a planned round (sample, score, log-probs, values, advantages, micro-batches),
and the policy update (update.py) turns each micro-batch into the actor's and critics' losses. A round
samples once and then feeds every micro-step (gradient accumulation and `ppo_epochs`) it covers. The
Trainer's loop, optimizer, scheduler, callbacks, logging and checkpoints are the stock ones; the RL state
between steps lives in named objects (state.py) that `RLCheckpoint` (checkpoint.py) saves beside them.

See it work: tests/test_trainer_e2e.py, tests/test_algorithms_e2e.py, examples/swap_trainer.py.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
from transformers import Trainer
from transformers.trainer_utils import speed_metrics

from . import publish, saving
from . import trainer_setup as setup
from .asynchronous import make_rounds
from .checkpoint import CheckpointSettings, RLCheckpoint
from .config import fsdp_version_wanted
from .data import keep_rows, prepare_datasets, round_dataloader
from .distributed import (actor_already_prepared, close_process_group_at_exit, install_cpu_fsdp, is_sharded,
                          shard_actor, sum_over_processes)
from .evaluation import as_eval_prompts, evaluate_rewards
from .nonfinite import NonFiniteGuard, check_finite_loss, check_finite_weights
from .placement import Placement
from .roles import Actor, EngineWeightsChanged, TeacherPolicy
from .roles.dropout import original_rates_restored
from .roles.scoring import output_head
from .rollout import make_rollout_engine
from .round import RoundBuilder, RoundSettings
from .routing import moe_routers
from .safety import NoConstraint
from .metric_names import with_trl_names
from .sample_and_score import RewardSettings, RewardStage
from .state import KLMeter, MetricBuffer, RoundInProgress, token_weighted
from .sync import WeightSync
from .adapter_setup import lora_serving
from .sync.adapter import lora_config_of
from .teacher_setup import check_teacher, distill_divergence, make_teacher
from .update import PolicyUpdate, UpdateSettings, entropy_needed
from .vision.prompts import ImagePrompts
from .vision.setup import check_vision_inputs, datasets_with_images, load_processor, share_chat_template


class VerlTrainer(Trainer):
    """RL post-training with the Trainer you know. Swap `Trainer` -> `VerlTrainer`, `TrainingArguments` ->
    `VerlConfig`, and pass `reward_funcs`.

    Args:
        model / actor: the policy, a model id or path, or a `PreTrainedModel` (`actor=` is the seed posts' name).
        args: a `VerlConfig` (a plain `TrainingArguments` is converted, RL fields at their defaults).
        ref_policy: the KL reference (model, id or path); default a frozen copy of the starting policy
            (adapters disabled for PEFT). Only loaded when `kl_coef > 0`.
        critic: PPO's value model (`Critic`, token-classification model, id or path); default a value head on
            the policy's checkpoint. Only used by estimators that need values (`adv_estimator="gae"`).
        reward_funcs: callables or names (see `VerlConfig.reward_funcs`); added to those in `args`.
        reward_model: a `RewardModel`, a sequence-classification model, or an id/path; one more reward function.
        tools: callables (sync or async, with type hints and a docstring) the model may call, or
            "pkg.module:function" strings: rollouts become conversations (README, "Multi-turn: tools and
            environments"); added to `args.tools`.
        environment: a factory (a class, or a function of no arguments) called once per sample for an object
            with `reset(row)` and `step(message) -> verl_hf.agent.Step`: rollouts become conversations with it.
        teacher: on-policy distillation's teacher (`TeacherPolicy`, causal LM, id or path; or
            `teacher_model_path`): scores every sampled token, and the student moves towards it (`distill_loss`).
            Its tokenizer must be the student's (checked before any model loads).
        processing_class / tokenizer: the tokenizer, or a vision-language policy's processor (AutoProcessor: the
            rows' images, column `image_column`, go into the prompts; verl_hf/vision/); default loaded from the
            model's path.
        peft_config: a `peft` config; the actor becomes a PEFT model.

    The parts, public for callbacks, tests and custom loops: `placement` (where the models live), `actor`,
    `ref_policy`, `teacher`, `critic`, `constraint` (Safe-RLHF, or a `NoConstraint`), `kl_ctrl`, `rewards`,
    `round_builder`, `policy_update`, and the state `metrics`, `kl_meter`, `round_in_progress`, saved by
    `rl_checkpoint`.
    """

    _callbacks_bound = False  # callbacks added after __init__ are bound at once
    _evaluating = False  # evaluation logs leave the RL metrics for the next training log
    _restoring = False  # a rollback loads weights and RL state, but starts a fresh round
    checkpoint_staging: str | None = None  # while a checkpoint is written: the folder it goes to first (saving.py)

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, *, actor=None, ref_policy=None, critic=None, reward_funcs=None,
                 reward_model=None, tokenizer=None, callbacks=None, peft_config=None, optimizers=(None, None),
                 tools=None, environment=None, teacher=None, **trainer_kwargs):
        setup.check_trainer_hooks()
        model = setup.given_policy(model, actor)
        args = setup.as_verl_config(args, model)
        setup.check_model_paths(model, args, ref_policy, critic, teacher)
        # Cheap checks first: rewards, tokenizer, teacher and data fail here, before any model is loaded.
        lora = lora_config_of(model, peft_config)  # None: the policy trains no LoRA adapter
        processing_class = setup.one_of_aliases("processing_class", processing_class, "tokenizer", tokenizer)
        with_images = datasets_with_images({"train": train_dataset, "eval": eval_dataset}, args.image_column)
        processor = load_processor(processing_class, model, bool(with_images))  # vision-language, or None
        setup.refuse_settings_without_effect(args, tools, environment, teacher, lora, vision=processor is not None)
        multi_turn = setup.is_multi_turn(args, tools, environment)
        self.reward_funcs, self.reward_weights = setup.resolve_rewards(args, reward_funcs, reward_model, environment,
                                                                       teacher)
        setup.check_offline_ids(setup.given_models(model, args, ref_policy, critic, teacher))
        tokenizer = setup.load_tokenizer(processor.tokenizer if processor else processing_class, model, args)
        if processor is not None:
            share_chat_template(processor, tokenizer)
        given_teacher = teacher is not None
        teacher = check_teacher(teacher, args, tokenizer, model)  # the ids it shares with the student
        vision = check_vision_inputs(model, processor, args, with_images, multi_turn, given_teacher)
        adapter = lora_serving(args, lora, vision)  # vLLM serves the adapter itself, or None: merged weights
        # None: one turn per sample
        self.multi_turn = setup.make_multi_turn(args, tools, environment, tokenizer, processor if vision else None)
        images = ImagePrompts(processor, args.image_column) if vision else None
        train_dataset, eval_dataset = prepare_datasets(train_dataset, eval_dataset, tokenizer, args, self.multi_turn,
                                                       images)

        super().__init__(
            model=setup.load_policy(model, peft_config, args, vision), args=args,
            data_collator=data_collator or keep_rows, train_dataset=train_dataset, eval_dataset=eval_dataset,
            processing_class=processor if vision else tokenizer, callbacks=callbacks, optimizers=optimizers, **trainer_kwargs,
        )
        setup.check_vocabulary(tokenizer, self.model, self.train_dataset)
        self.placement = placement = Placement.of(self.accelerator, args.device)  # one process/DDP/ZeRO/FSDP2
        if placement.num_processes > 1:
            close_process_group_at_exit()  # else gloo may abort the process after a successful run
        self.model = self.model_wrapped = shard_actor(self.accelerator, self.model)  # FSDP2: sharded from the start
        self._reduce_sum = sum_over_processes(self.accelerator)
        if args.routing_replay:
            moe_routers(self.model)  # not an MoE model, or unknown routers: said before any engine starts
        engine = make_rollout_engine(self.model, tokenizer, args, placement, adapter=adapter,
                                     processor=processor if vision else None)
        self.actor = Actor(self.model, processor if vision else tokenizer, engine=engine, image_column=args.image_column, temperature=args.temperature,
                           weight_sync=WeightSync.for_engine(engine, bucket_mb=args.sync_bucket_mb,
                                                             verify=args.sync_verify, adapter_config=adapter),
                           logits_chunk_size=args.logits_chunk_size,
                           routing_replay=args.routing_replay)
        self.add_callback(EngineWeightsChanged(self.actor))
        setup.place_reward_models(placement, self.reward_funcs)
        self.ref_policy = setup.make_reference(placement, self.model, ref_policy, args) if args.kl_coef > 0 else None
        self.teacher = make_teacher(placement, teacher, args, self.model)  # on-policy distillation, else None
        self.critic = setup.make_critic(setup.reward_critic_start(critic, args), model, args, placement)
        self.constraint = setup.make_safety(placement, model, args) or NoConstraint()  # Safe-RLHF: costs, lambda
        self.kl_ctrl = setup.make_kl_ctrl(args)
        self._build_rl_parts()
        for callback in self.callback_handler.callbacks:
            _bind(callback, self)
        self._callbacks_bound = True

    def create_accelerator_and_postprocess(self) -> None:
        """The Trainer's accelerator; on a machine without GPUs an FSDP config really shards (distributed.py)."""
        super().create_accelerator_and_postprocess()
        if fsdp_version_wanted(self.args) and install_cpu_fsdp(self.accelerator, self.args.fsdp_plugin_args):
            self.is_fsdp_enabled = True
            setup.check_fsdp_plugin(self.accelerator.state.fsdp_plugin, self.args)  # the Trainer's own FSDP checks

    def _prepare_for_training(self, *args, **kwargs):
        """The Trainer's `prepare`; under FSDP2 the policy was sharded at construction (distributed.shard_actor)."""
        with actor_already_prepared(self.accelerator):
            return super()._prepare_for_training(*args, **kwargs)

    def _build_rl_parts(self) -> None:
        """The round builder, the update and the named state between steps, and the checkpoint that saves it."""
        args = self.args
        self.metrics, self.kl_meter, self.round_in_progress = MetricBuffer(), KLMeter(), RoundInProgress()
        self.rewards = RewardStage(self.reward_funcs, self.reward_weights, RewardSettings.of(args),
                                   trainer_state=lambda: self.state)
        self.round_builder = RoundBuilder(
            RoundSettings.of(args), self.actor, self.rewards, ref_policy=self.ref_policy, critic=self.critic,
            constraint=self.constraint, kl_controller=self.kl_ctrl, metrics=self.metrics,
            train_dataset=self.train_dataset, reduce_sum=self._reduce_sum, precision=self.accelerator.autocast,
            multi_turn=self.multi_turn, teacher=self.teacher)
        self.rounds = make_rounds(args, self.round_builder, self.actor, self.metrics, self.train_dataset,
                                  self.data_collator, last_step=lambda: self.state.max_steps)
        self.policy_update = PolicyUpdate(UpdateSettings.of(args), self.kl_ctrl)
        self.critics = [(self.critic, "values", "returns", "critic")] if self.critic is not None else []
        self.critics += self.constraint.critics()
        self._num_params = sum(p.numel() for p in self.model.parameters())  # for floating_point_ops
        self.nonfinite = NonFiniteGuard(args.on_nonfinite)
        per_process = {"round": self.round_in_progress, "refill": self.round_builder.refill,
                       "seeds": self.round_builder.seeds, "metrics": self.metrics, "kl_meter": self.kl_meter,
                       "nonfinite": self.nonfinite}
        self.rl_checkpoint = RLCheckpoint(CheckpointSettings.of(args), per_process=per_process, critic=self.critic,
                                          constraint=self.constraint, kl_controller=self.kl_ctrl,
                                          ref_policy=self.ref_policy, reduce_sum=self._reduce_sum)

    @property
    def safety(self):
        """The Safe-RLHF constraint (costs, lambda, cost critic), or None in a run without costs."""
        return self.constraint if self.constraint.enabled else None

    @property
    def last_round(self):
        """The latest scored round (CompletionSamplesCallback reads it)."""
        return self.round_in_progress.last_round

    def add_callback(self, callback):
        super().add_callback(callback)
        if self._callbacks_bound:  # during __init__ the loop at its end binds them
            for added in self.callback_handler.callbacks:
                if added is callback or type(added) is callback:
                    _bind(added, self)

    def restore_checkpoint(self, checkpoint: str) -> None:
        """Back to a checkpoint in-process (KLGuardCallback's rollback): policy weights, optimizer, scheduler
        and the RL state (critic, KL controller, lambda); the step counter goes on, and a fresh round starts."""
        self._restoring = True
        try:
            self._load_from_checkpoint(checkpoint)
            self._load_optimizer_and_scheduler(checkpoint)
        finally:
            self._restoring = False
        self.kl_meter.reset()
        self.round_in_progress.restart_at_boundary(self.args.micro_steps_per_round)
        self.actor.mark_weights_changed()
        self.rounds.reset()  # rounds sampled ahead came from the weights rolled back

    # ------------------------------------------------------------------ the RL step
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """The Trainer's loop; `resume_from_checkpoint=True` takes the newest complete checkpoint (saving.py)."""
        resume_from_checkpoint = saving.resolve_resume(resume_from_checkpoint, self.args.output_dir)
        self.round_in_progress.needs_position = True  # a resumed run may start in the middle of a round
        self.actor.mark_weights_changed()  # a resume loads other weights after any earlier sync
        self.rounds.reset()  # nothing sampled ahead by an earlier train() or before the resume
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self.rounds.close()  # the producer stops with the run, however it ends

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-step. The first micro-step of a round samples and prepares the whole round."""
        args, progress = self.args, self.round_in_progress
        progress.place(self.state.global_step, args.gradient_accumulation_steps, args.micro_steps_per_round)
        if progress.starts_new(args.micro_steps_per_round):
            self.kl_meter.update_controller(self.kl_ctrl, args.kl_controller, self._reduce_sum, args.device)  # 0
            # 0b-4. weights into the engine, then the round sampled, scored and planned (or sampled ahead)
            planned = self.rounds.next_round(inputs, self.state.global_step, progress.micro_step)
            progress.start(planned)                                             # 4b. the round to train on
            self.kl_meter.observe_reward_kl(planned.kl_in_reward)               # 4c. KL in the reward (control)
            self.actor.engine.sleep()                                           # 4d. vLLM sleep mode: memory
        micro_batch = progress.take_next(args.micro_steps_per_round)
        return self._update(model, micro_batch)                                 # 5. losses and backward

    def _update(self, model, mb) -> torch.Tensor:
        """Actor loss and backward (skipped during critic warm-up), then the critics' (PPO, Safe-RLHF), once per
        piece of at most `max_tokens_per_micro_batch` tokens; gradients are synchronised after the last piece,
        and the pieces' metrics are averaged by their response tokens (as if it were one forward)."""
        started, args = time.perf_counter(), self.args
        pieces = mb.split_by_tokens(args.max_tokens_per_micro_batch) if args.max_tokens_per_micro_batch else [mb]
        loss, parts = torch.zeros((), device=args.device), []
        step_ends = self.round_in_progress.micro_step % args.gradient_accumulation_steps == 0
        for i, piece in enumerate(pieces):
            last, piece, metrics = i == len(pieces) - 1, piece.without_padding().to(args.device), {}
            with contextlib.nullcontext() if last else self.accelerator.no_sync(model):
                if self.state.global_step >= args.critic_warmup_steps:
                    piece_loss, metrics = self._actor_backward(model, piece)
                    loss = loss + piece_loss
            for critic, old_values, returns, prefix in self.critics:
                metrics.update(self.policy_update.critic_step(piece, critic, old_values, returns, prefix,
                                                              step_ends and last))
            parts.append((metrics, float(piece.response_mask.sum())))
        self.metrics.record(token_weighted(parts))
        self.metrics.record({"time/update": time.perf_counter() - started})
        return loss.detach()

    def _actor_backward(self, model, mb) -> tuple[torch.Tensor, dict]:
        model.train()
        entropy_kwargs = dict(with_entropy=entropy_needed(self.args, self.state),
                              entropy_grad=self.args.entropy_coef > 0)
        with self.actor.replaying(mb):  # MoE routing replay, backward included (gradient checkpointing)
            with self.compute_loss_context_manager():
                divergence = distill_divergence(self.teacher, mb, self.args)  # GKD, top-k forward KL: else None
                if divergence is not None:  # the student's forward computes it through its head, in chunks
                    logprobs, entropy, divergence = self.actor.compute_logprobs_and_divergence(mb, divergence, model,
                                                                                               **entropy_kwargs)
                else:
                    logprobs, entropy = self.actor.compute_logprobs(mb, model=model, **entropy_kwargs)
                result = self.policy_update.actor_loss(mb, logprobs, entropy, self.state.global_step, divergence)
            if self.is_deepspeed_enabled:  # its engine steps inside backward: check before (nonfinite.py)
                check_finite_loss(result.loss, self._reduce_sum, self.state.global_step + 1)
            self.accelerator.backward(result.loss, **({"scale_wrt_gas": False} if self.is_deepspeed_enabled else {}))
        if result.kl_observed is not None:
            self.kl_meter.observe(*result.kl_observed, samples=self.round_in_progress.size)
        return result.loss, {**result.metrics, **self.actor.routing_metrics()}

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's norm, checked before its optimizer step: a NaN/inf one raises or skips the step."""
        grad_norm = super()._get_grad_norm(model, grad_norm)
        # fp16's GradScaler skips overflowing steps itself (and lowers its scale): not ours to stop or count.
        if not self.is_deepspeed_enabled and self.accelerator.scaler is None:
            self.nonfinite.after_gradients(grad_norm, model.parameters(), self.state.global_step + 1)
            self.metrics.record(self.nonfinite.metrics())
        return grad_norm

    # ------------------------------------------------------------------ data
    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("VerlTrainer: training requires a train_dataset with a 'prompt' column.")
        return round_dataloader(self.train_dataset, self.args, self.data_collator)

    def floating_point_ops(self, inputs) -> int:
        """Training FLOPs of the micro-step just run (6 x parameters x tokens), for `total_flos`."""
        micro_batch = self.round_in_progress.last_taken(self.args.micro_steps_per_round)
        return 0 if micro_batch is None else 6 * self._num_params * int(micro_batch.attention_mask.sum())

    # ------------------------------------------------------------------ evaluation and logging
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
        dataset = as_eval_prompts(dataset, self.actor.tokenizer, self.args, metric_key_prefix, self.multi_turn,
                                  self.actor.images)
        started = time.time()
        with self.rounds.engine_held(self.state.global_step):  # the trainer's weights; no producer meanwhile
            metrics = evaluate_rewards(self.actor, self.rewards, self.constraint, dataset, self.args,
                                       metric_key_prefix, self.multi_turn, self._evaluated_teacher())
        metrics.update(speed_metrics(metric_key_prefix, started, num_samples=len(dataset)))
        self._evaluating = True
        try:
            self.log(metrics)
        finally:
            self._evaluating = False
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _evaluated_teacher(self):
        """The teacher whose held-out KL to the student evaluation reports (eval_distill_kl): where both models'
        heads are whole on every process and can be read in chunks; None elsewhere (ZeRO-3, FSDP2, Gemma's
        soft-capped logits, a LoRA head, a served teacher), and without a teacher."""
        if not isinstance(self.teacher, TeacherPolicy) or self.placement.shards_weights:  # none, or served
            return None
        heads = output_head(self.accelerator.unwrap_model(self.model)), output_head(self.teacher.model)
        return self.teacher if all(head is not None for head in heads) else None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the RL metrics gathered since the last log (pooled over steps and processes) to training logs, and
        with trl_metric_names TRL's names beside ours (metric_names.py)."""
        if not self._evaluating:
            logs = {**logs, **self.metrics.pooled(self.args.world_size)}
        if self.args.trl_metric_names:
            logs = with_trl_names(logs)
        super().log(logs, start_time)

    # ------------------------------------------------------------------ saving, publishing, checkpoints
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save (weights, tokenizer), plus verl_config.json; PEFT runs with save_merged_model
        write the merged model (checkpoints keep the adapter, which resuming needs)."""
        # Pooled over processes only where each holds a shard (ZeRO-3, FSDP2), which saves on every process
        # anyway: a replicated model is checked where it is saved (a main-process-only save_model must not wait).
        pooled = self._reduce_sum if is_sharded(self.model) else (lambda t: t)
        check_finite_weights({"policy": self.model, **{prefix: c.model for c, _, _, prefix in self.critics}},
                             pooled, self.args.device, output_dir or self.args.output_dir)
        output_dir = output_dir or self.args.output_dir
        final = saving.is_final_model(output_dir)
        if final:
            saving.save_gathered_fsdp_weights(self, output_dir)  # FSDP's sharded state dict: gathered first
        super().save_model(output_dir, _internal_call)
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)  # under FSDP a checkpoint's weights come later (its optimizer step)
        if self.args.save_merged_model and final:
            publish.save_merged(self.accelerator.unwrap_model(self.model), output_dir, self.is_deepspeed_enabled)
        publish.write_run_config(self, output_dir)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """The Trainer's writes of the policy (final model and checkpoints, under DeepSpeed and FSDP too; not its
        XLA path) come here: configs are written as the model was built, not with RL's zero dropout
        (roles/dropout.py)."""
        with original_rates_restored(self.model):
            super()._save(output_dir, state_dict)

    def create_model_card(self, model_name: str | None = None, **kwargs) -> None:
        """README.md for the Hub: algorithm, base model, data, a reward table and how to load the actor."""
        if self.is_world_process_zero():
            publish.write_model_card(self, self.hub_model_id or model_name)

    def _save_checkpoint(self, model, trial) -> None:
        saving.save_atomically(self, super()._save_checkpoint, model, trial)

    def _get_output_dir(self, trial) -> str:
        return self.checkpoint_staging or super()._get_output_dir(trial)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        self.rl_checkpoint.save(output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.rl_checkpoint.load(checkpoint, with_round=not self._restoring)


def _bind(callback, trainer) -> None:
    """Callbacks that need the trainer (its last round, reference, checkpoints) define `bind(trainer)`."""
    if hasattr(callback, "bind"):
        callback.bind(trainer)
