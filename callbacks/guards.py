"""Callbacks that stop a run (or roll it back) when its numbers say so.

- `KLGuardCallback`: KL to the reference above `max_kl`, or policy entropy below `min_entropy` (collapse):
  stop, or roll the policy (weights, optimizer, scheduler, critic, KL controller, lambda) back to the last
  checkpoint and go on, at most `max_rollbacks` times.
- `RewardTargetStoppingCallback`: stop once a metric has reached a target for `patience` logs in a row.

Both read the metrics VerlTrainer logs (`kl`, `actor/entropy`, `reward/mean`, `eval_*`). What fired is kept
in `.events` and logged as a warning.

See it work: tests/test_callbacks.py.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from verl_hf.saving import newest_complete

logger = logging.getLogger(__name__)


class KLGuardCallback(TrainerCallback):
    def __init__(self, max_kl: float | None = None, min_entropy: float | None = None, action: str = "stop",
                 max_rollbacks: int = 3):
        if max_kl is None and min_entropy is None:
            raise ValueError("KLGuardCallback needs max_kl and/or min_entropy.")
        if action not in ("stop", "rollback"):
            raise ValueError(f"KLGuardCallback action={action!r}: use 'stop' or 'rollback'.")
        self.max_kl, self.min_entropy, self.action, self.max_rollbacks = max_kl, min_entropy, action, max_rollbacks
        self.events: list[dict] = []
        self.trainer = None

    def bind(self, trainer) -> None:
        if self.max_kl is not None and trainer.args.kl_coef == 0:
            raise ValueError(f"KLGuardCallback(max_kl={self.max_kl}) can never fire: with kl_coef=0 no reference is "
                             f"loaded and no KL is computed; set kl_coef > 0, or guard min_entropy only.")
        if self.action == "rollback" and trainer.is_deepspeed_enabled:
            raise ValueError("KLGuardCallback(action='rollback') reloads weights in-process, which DeepSpeed runs do "
                             "not support here; use action='stop' and resume_from_checkpoint.")
        self.trainer = trainer

    def breach(self, logs: dict) -> str | None:
        kl, entropy = logs.get("kl", logs.get("kl/in_reward")), logs.get("actor/entropy")
        if self.max_kl is not None and kl is not None and kl > self.max_kl:
            return f"KL {kl:.4g} > max_kl {self.max_kl}"
        if self.min_entropy is not None and entropy is not None and entropy < self.min_entropy:
            return f"entropy {entropy:.4g} < min_entropy {self.min_entropy}"
        return None

    def on_log(self, args, state, control, logs=None, **kwargs):
        reason = self.breach(logs or {})
        if reason is None:
            return
        rollbacks = sum(e["action"] == "rollback" for e in self.events)
        checkpoint = newest_complete(args.output_dir) if self.action == "rollback" else None
        if checkpoint is None or rollbacks >= self.max_rollbacks:
            self.events.append({"step": state.global_step, "reason": reason, "action": "stop"})
            logger.warning("KLGuardCallback: %s at step %d: stopping.", reason, state.global_step)
            control.should_training_stop = True
            return
        self.trainer.restore_checkpoint(checkpoint)
        self.events.append({"step": state.global_step, "reason": reason, "action": "rollback",
                            "checkpoint": checkpoint})
        logger.warning("KLGuardCallback: %s at step %d: rolled back to %s.", reason, state.global_step, checkpoint)


class RewardTargetStoppingCallback(TrainerCallback):
    def __init__(self, target: float, metric: str = "reward/mean", patience: int = 1, greater_is_better: bool = True):
        if patience < 1:
            raise ValueError(f"RewardTargetStoppingCallback patience={patience} must be >= 1.")
        self.target, self.metric, self.patience, self.greater = target, metric, patience, greater_is_better
        self.streak, self.events, self.metric_seen = 0, [], False

    def _check(self, metrics: dict, state, control) -> None:
        if not metrics:
            return
        if self.metric not in metrics:
            self._refuse_unlogged(metrics)
            return
        self.metric_seen = True
        value = metrics[self.metric]
        reached = value >= self.target if self.greater else value <= self.target
        self.streak = self.streak + 1 if reached else 0
        if self.streak >= self.patience:
            self.events.append({"step": state.global_step, "metric": self.metric, "value": value})
            logger.warning("RewardTargetStoppingCallback: %s = %.4g reached %s at step %d: stopping.", self.metric,
                           value, self.target, state.global_step)
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._check(logs, state, control)  # evaluation metrics are logged too, so `eval_*` targets work

    def _refuse_unlogged(self, metrics: dict) -> None:
        """Until the metric has been seen once: a log of its kind without it means a name that is never logged
        (a typo), which would wait forever. Its kind: a training log that carries a round's `reward/*`
        metrics (later steps of a multi-step round log none), or an evaluation log of the same `eval_<set>_`
        prefix (each eval set logs on its own)."""
        if self.metric_seen:
            return
        if self.metric.startswith("eval_"):
            prefix = self.metric.rsplit("_", 1)[0] + "_"
            if not any(k.startswith(prefix) for k in metrics):
                return
        elif not any(k.startswith("reward/") for k in metrics):
            return
        import difflib

        close = difflib.get_close_matches(self.metric, list(metrics), n=3)
        raise ValueError(f"RewardTargetStoppingCallback(metric={self.metric!r}) waits for a metric this run does not "
                         f"log; closest logged: {close or sorted(metrics)[:8]}.")
