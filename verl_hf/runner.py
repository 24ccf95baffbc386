"""Run one training job end to end from a config: what `verl-hf train` and `verl-hf demo` execute.

Loads the policy and the data named in `ScriptArguments`, measures the eval set before RL, trains,
measures again, saves the model, and writes `curve.png` and `summary.json` to the output directory.

See it work: `make demo`, tests/test_cli.py.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .distributed import local_parameter_bytes


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(
        default="demo", metadata={"help": "Policy id or path; 'demo' / 'demo-tools' / 'demo-tools-qwen3' / "
                                          "'demo-tools-mistral' / 'demo-vision' = the shipped tiny warm starts of the "
                                          "addition, tool and vision demos."}
    )
    dataset_name: str = field(
        default="verl_hf:addition",
        metadata={"help": "'verl_hf:addition', 'verl_hf:multiplication' or 'verl_hf:colors' (the demos' synthetic "
                          "tasks), or a `datasets.load_dataset` name or local path."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "The dataset's config name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(default="test", metadata={"help": "Split to evaluate on; None: none."})
    use_peft: bool = field(default=False, metadata={"help": "Train a LoRA adapter (peft) instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (the update is scaled by alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Module names to adapt, e.g. q_proj v_proj; default: peft's choice for "
                                        "the architecture, or 'all-linear'."}
    )


def peft_config_of(script: ScriptArguments):
    """A peft LoraConfig when `use_peft`, else None."""
    if not script.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(r=script.lora_r, lora_alpha=script.lora_alpha, lora_dropout=script.lora_dropout,
                      target_modules=script.lora_target_modules, task_type="CAUSAL_LM")


def load_policy_path(name: str) -> str:
    from .demo import FAMILY_WARM_START_DIRS, TOOLS_WARM_START_DIR, VISION_WARM_START_DIR, WARM_START_DIR

    shipped = {"demo": WARM_START_DIR, "demo-tools": TOOLS_WARM_START_DIR, "demo-vision": VISION_WARM_START_DIR,
               **{f"demo-tools-{family}": path for family, path in FAMILY_WARM_START_DIRS.items()}}
    return str(shipped.get(name, name))


def load_splits(script: ScriptArguments):
    """(train, eval or None) datasets."""
    data = _dataset_splits(script)
    for split in (script.dataset_train_split, script.dataset_test_split):
        if split is not None and split not in data:
            raise ValueError(f"dataset {script.dataset_name!r} has splits {list(data)}, not {split!r}.")
    test = data[script.dataset_test_split] if script.dataset_test_split else None
    return data[script.dataset_train_split], test


def _dataset_splits(script: ScriptArguments) -> dict:
    """The dataset's splits by name: the demos' synthetic tasks (train, dev, test), a saved DatasetDict, or
    `datasets.load_dataset`; a local path that does not exist is said as such (offline, `load_dataset` would
    answer with a ConnectionError)."""
    from .trainer_setup import _looks_local

    name = script.dataset_name
    if name == "verl_hf:addition":
        from .demo.task import demo_splits

        return dict(zip(("train", "dev", "test"), (d.remove_columns("completion") for d in demo_splits(seed=0))))
    if name == "verl_hf:multiplication":
        from .demo.tools_task import tools_splits

        return dict(zip(("train", "dev", "test"), tools_splits(seed=0)))
    if name == "verl_hf:colors":
        from .demo.vision_task import vision_splits

        return dict(zip(("train", "dev", "test"), vision_splits(seed=0)))
    if not name or ":" in name.split("/")[0] and not os.path.exists(name):
        raise ValueError(f"dataset_name={name!r}: use 'verl_hf:addition', 'verl_hf:multiplication', "
                         f"'verl_hf:colors' or a datasets name/path.")
    if _looks_local(name) and not os.path.exists(name):
        raise FileNotFoundError(f"dataset_name={name!r}: no such file or directory (a local path; a Hub dataset "
                                f"is named 'org/name').")
    from datasets import load_dataset, load_from_disk

    if os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_dict.json")):
        return load_from_disk(name)
    return load_dataset(name, script.dataset_config)


def run_training(script: ScriptArguments, config) -> dict:
    """Train as configured; returns the summary written to summary.json."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from verl_hf.callbacks import RLProgressCallback, TrainingClockCallback

    from .trainer import VerlTrainer

    started = time.time()
    train, test = load_splits(script)
    clock = TrainingClockCallback()  # held-out accuracy against training seconds, for comparisons of runs
    trainer = VerlTrainer(model=load_policy_path(script.model_name_or_path), args=config, train_dataset=train,
                          eval_dataset=test, callbacks=[RLProgressCallback(), clock],
                          peft_config=peft_config_of(script))
    for noisy in (PrinterCallback, ProgressCallback):  # the table replaces the raw dict prints
        trainer.remove_callback(noisy)
    before = trainer.evaluate() if test is not None else {}
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    after = _final_eval(trainer) if test is not None else {}
    trainer.save_model(config.output_dir)
    summary = {"seed": config.seed, "steps": trainer.state.global_step, "seconds": round(time.time() - started, 1),
               "accuracy_before": before.get("eval_accuracy"), "accuracy_after": after.get("eval_accuracy"),
               # this process's share of the policy's parameters: all of them, or its ZeRO-3 / FSDP2 shards
               "policy_params_mb": round(local_parameter_bytes(trainer.model) / 2**20, 4),
               **_training_figures(trainer.state.log_history)}
    if test is not None:
        summary["gain_points"] = round(100 * (summary["accuracy_after"] - summary["accuracy_before"]), 1)
        summary.update(_before_and_after(before, after))
        # (step, training seconds with evaluation excluded, held-out accuracy), from step 0
        summary["accuracy_by_seconds"] = [[0, 0.0, before.get("eval_accuracy")], *map(list, clock.points)]
    if trainer.safety is not None:
        summary["lagrange_lambda"] = trainer.safety.lagrange_lambda
    if trainer.is_world_process_zero():
        plot_curve(trainer.state.log_history, os.path.join(config.output_dir, "curve.png"), baseline=before)
        Path(config.output_dir, "summary.json").write_text(json.dumps(summary, indent=2))
        Path(config.output_dir, "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    if config.world_size > 1:
        # accelerate's documented end of a script: trackers closed and the process group torn down while every
        # process is still alive (left to interpreter exit, a rank was once seen aborting in teardown).
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()
    return summary


def _training_figures(log_history: list[dict]) -> dict:
    """Mean train reward of the first and last fifth of the logs, and wall seconds per optimizer step."""
    rewards = [h["reward/mean"] for h in log_history if "reward/mean" in h]
    fifth = max(len(rewards) // 5, 1)
    runtime = next((h for h in log_history if "train_runtime" in h), {})
    steps = max(runtime.get("step", 0), 1)
    return {"reward_first": sum(rewards[:fifth]) / fifth if rewards else None,
            "reward_last": sum(rewards[-fifth:]) / fifth if rewards else None,
            "seconds_per_step": round(runtime.get("train_runtime", 0.0) / steps, 3)}


def _before_and_after(before: dict, after: dict) -> dict:
    """Each reward function's held-out mean and, in multi-turn runs, the tool calls per sample, before and
    after training: {"reward/<name>_before": ..., "reward/<name>_after": ..., "tool_calls/mean_before": ...}."""
    keys = sorted(k for k in {**before, **after} if k.startswith("eval_reward/") or k == "eval_tool_calls/mean")
    return {f"{key[len('eval_'):]}_{when}": figures.get(key)
            for key in keys for when, figures in (("before", before), ("after", after))}


def _final_eval(trainer) -> dict:
    """The eval of the last step when the schedule already ran it (never evaluate twice), else a new one."""
    last = trainer.state.log_history[-2:] if trainer.state.log_history else []
    for entry in last:
        if "eval_accuracy" in entry and entry.get("step") == trainer.state.global_step:
            return entry
    return trainer.evaluate()


def plot_curve(log_history: list[dict], path: str, baseline: dict | None = None) -> dict:
    """Training reward and held-out accuracy against the optimizer step, in one PNG. `baseline`: the evaluation
    before training (the Trainer starts a fresh log at `train()`, so it is not in `log_history`), plotted at
    step 0, where the gain starts. Returns the plotted series, {name: [(step, value)]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reward = [(h["step"], h["reward/mean"]) for h in log_history if "reward/mean" in h]
    accuracy = [(h["step"], h["eval_accuracy"]) for h in log_history if "eval_accuracy" in h]
    if baseline and "eval_accuracy" in baseline and not any(step == 0 for step, _ in accuracy):
        accuracy.insert(0, (0, baseline["eval_accuracy"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    if reward:
        ax.plot(*zip(*reward), label="train reward (mean)")
    if accuracy:
        ax.plot(*zip(*accuracy), marker="o", label="held-out accuracy")
    ax.set_xlabel("optimizer step")
    ax.legend(loc="lower right")
    ax.set_title("verl_hf: reward and held-out accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"train reward": reward, "held-out accuracy": accuracy}
