"""`RewardCurvePlotCallback`: a PNG of the run's curves, refreshed while it trains.

Panels: training reward (and held-out reward when evaluated), KL, response length, and the Lagrange
multiplier lambda when the run is Safe-RLHF. Written to `<output_dir>/<filename>` at every `every_n_logs`-th
training log and at the end.

See it work: tests/test_callbacks.py.
"""

from __future__ import annotations

import os

from transformers import TrainerCallback

PANELS = (("reward", ("reward/mean", "eval_reward")), ("KL", ("kl", "kl/in_reward")),
          ("response length", ("response_length/mean",)), ("lambda", ("safety/lambda",)))


class RewardCurvePlotCallback(TrainerCallback):
    def __init__(self, filename: str = "reward_curve.png", every_n_logs: int = 1):
        if every_n_logs < 1:
            raise ValueError(f"RewardCurvePlotCallback every_n_logs={every_n_logs} must be >= 1.")
        self.filename, self.every_n_logs, self._logs_seen = filename, every_n_logs, 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward/mean" in logs:
            self._logs_seen += 1
            if self._logs_seen % self.every_n_logs == 0 and state.is_world_process_zero:
                plot_curves(state.log_history, os.path.join(args.output_dir, self.filename))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and any("reward/mean" in h for h in state.log_history):
            plot_curves(state.log_history, os.path.join(args.output_dir, self.filename))


def plot_curves(log_history: list[dict], path: str) -> list[str]:
    """Draw every panel that has data; returns the panel titles drawn."""
    # A Figure of its own on the Agg canvas, not pyplot: switching the global backend would break inline
    # plots in a notebook that trains with this callback.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [(title, [(key, [(h["step"], h[key]) for h in log_history if key in h and "step" in h]) for key in keys])
              for title, keys in PANELS]
    panels = [(title, [(k, pts) for k, pts in series if pts]) for title, series in panels]
    panels = [(title, series) for title, series in panels if series]
    fig = Figure(figsize=(4 * max(len(panels), 1), 3.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        for key, points in series:
            ax.plot(*zip(*points), marker="." if len(points) < 30 else None, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    return [title for title, _ in panels]
