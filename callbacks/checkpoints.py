"""`BestRewardCheckpointCallback`: keep the checkpoint with the best evaluation metric.

After each save, if the latest evaluation (at the saved step) is the best so far, the checkpoint is copied
to `<output_dir>/<dirname>` (replacing the previous best) with `best.json` (step, metric, value). Copied, not
linked, so `save_total_limit` may delete the original.

See it work: tests/test_callbacks.py.
"""

from __future__ import annotations

import json
import os
import shutil

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR


class BestRewardCheckpointCallback(TrainerCallback):
    def __init__(self, metric: str = "eval_reward", greater_is_better: bool = True, dirname: str = "best_checkpoint"):
        if not metric.startswith("eval_"):
            raise ValueError(f"BestRewardCheckpointCallback metric={metric!r}: use an evaluation metric (eval_*), "
                             f"e.g. eval_reward or eval_accuracy.")
        self.metric, self.greater, self.dirname = metric, greater_is_better, dirname
        self.best: dict | None = None
        self._latest: dict | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run starts from the best kept so far, not from nothing."""
        kept = os.path.join(args.output_dir, self.dirname, "best.json")
        if self.best is None and os.path.exists(kept):
            with open(kept) as f:
                self.best = json.load(f)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and self.metric in metrics:
            self._latest = {"step": state.global_step, "metric": self.metric, "value": metrics[self.metric]}

    def _improves(self, value: float) -> bool:
        if self.best is None:
            return True
        return value > self.best["value"] if self.greater else value < self.best["value"]

    def on_save(self, args, state, control, **kwargs):
        latest = self._latest
        if latest is None or latest["step"] != state.global_step or not self._improves(latest["value"]):
            return
        self.best = latest
        if not state.is_world_process_zero:
            return
        source = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        target = os.path.join(args.output_dir, self.dirname)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        with open(os.path.join(target, "best.json"), "w") as f:
            json.dump(latest, f)
