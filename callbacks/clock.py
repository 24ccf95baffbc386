"""`TrainingClockCallback`: held-out accuracy against training seconds, the clock stopped while evaluating.

At each evaluation inside `train()` it records (optimizer step, seconds since `train()` began less the time spent
evaluating, eval_accuracy). Comparisons of wall-clock to a given accuracy (asynchronous against synchronous,
distillation against GRPO) read these points, so that evaluation, which both runs pay alike, is not counted.

See it work: tests/test_cli.py (the distillation demo), benchmarks/async.py --curve.
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


class TrainingClockCallback(TrainerCallback):
    """Holds: when train() began, when the last step ended, the seconds spent evaluating, and the points."""

    def __init__(self):
        self.started = self.step_ended = None
        self.evaluating_s = 0.0
        self.points: list[tuple[int, float, float]] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = self.step_ended = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ended = time.perf_counter()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.started is None:
            return  # the evaluation before training: step 0, second 0
        if metrics and "eval_accuracy" in metrics:
            self.points.append((state.global_step, self.step_ended - self.started - self.evaluating_s,
                                metrics["eval_accuracy"]))
        # every evaluation's time is left out (one without accuracy too), and counted once: a second evaluation
        # after the same step starts where this one ended
        now = time.perf_counter()
        self.evaluating_s += now - self.step_ended
        self.step_ended = now
