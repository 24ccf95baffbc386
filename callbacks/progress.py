"""`RLProgressCallback`: a progress bar and one table row per log, showing the RL metrics that matter.

It replaces the Trainer's `ProgressCallback`, which prints every log as a raw dict.

See it work: `make demo`, tests/test_callbacks.py.
"""

from __future__ import annotations

import time

from tqdm.auto import tqdm
from transformers import TrainerCallback

# (metric key, header, decimals); every cell is 9 characters wide.
DEFAULT_COLUMNS = (
    ("step", "step", 0),
    ("reward/mean", "reward", 3),
    ("eval_accuracy", "eval_acc", 3),
    ("kl", "kl", 4),
    ("actor/entropy", "entropy", 3),
    ("actor/clip_frac", "clip", 3),
    ("response_length/mean", "resp_len", 2),
    ("time/step", "s/step", 3),
)
WIDTH = 9


class RLProgressCallback(TrainerCallback):
    """Bar over optimizer steps plus a fixed-width table; `columns` = (metric key, header, decimals) triples."""

    def __init__(self, columns=DEFAULT_COLUMNS):
        self.columns = columns
        self.bar = None
        self._header_done = False
        self._last_eval: dict[str, float] = {}
        self._step_times: list[float] = []
        self._step_started = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = tqdm(total=state.max_steps, desc="RL", dynamic_ncols=True, leave=True)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._step_times.append(time.perf_counter() - self._step_started)
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if any(k.startswith("eval_") for k in logs):
            self._last_eval = logs
        if "reward/mean" not in logs and "eval_accuracy" not in logs:
            return
        row = {**self._last_eval, **logs, "step": state.global_step, "time/step": self._mean_step_seconds()}
        write = self.bar.write if self.bar is not None else print
        if not self._header_done:
            write(" ".join(f"{header:>{WIDTH}}" for _, header, _ in self.columns))
            self._header_done = True
        write(" ".join(_cell(row.get(key), decimals) for key, _, decimals in self.columns))

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


    def _mean_step_seconds(self) -> float | None:
        """Wall seconds per optimizer step since the previous row (evaluation excluded)."""
        times, self._step_times = self._step_times, []
        return sum(times) / len(times) if times else None


def _cell(value, decimals: int) -> str:
    if value is None:
        return f"{'-':>{WIDTH}}"
    return f"{value:>{WIDTH}.{decimals}f}" if decimals else f"{int(value):>{WIDTH}d}"
