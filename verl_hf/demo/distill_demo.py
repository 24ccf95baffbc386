"""`verl-hf demo --task distill`: on-policy distillation against the GRPO run that trained its teacher.

1. The teacher is the GRPO demo's model in `teacher_model_path` (`demo-output/` by default). A prior `make demo`
   there is reused when its summary.json has the same seed and the accuracy-by-seconds points. Otherwise the
   GRPO demo is trained there now, with that seed.
2. The student starts from the same warm start and learns from the teacher on its own samples (distill.yaml:
   reverse KL, and the task reward weighs 0, so it only measures accuracy).
3. `<output_dir>/curve.png` plots held-out accuracy against optimizer steps and against training seconds (the
   clock stopped while evaluating) for both runs.
4. summary.json and the printout give the teacher's accuracy, and the step and second at which the student came
   within 3 points of it, each as a share of the GRPO run's.

See it work: tests/test_cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path

DISTILL_CONFIG = Path(__file__).parent / "distill.yaml"
WITHIN = 0.03  # "reached the teacher": held-out accuracy within 3 points of it


def run_distill_demo(overrides: list[str]) -> dict:
    """Teacher (reused or trained), distillation run, comparison; the distillation run's summary with it."""
    from ..cli import parse_config
    from ..runner import run_training

    script, config = parse_config(str(DISTILL_CONFIG), overrides)
    if Path(config.output_dir).resolve() == Path(config.teacher_model_path).resolve():
        raise ValueError(f"output_dir={config.output_dir!r} is the teacher's folder (teacher_model_path): the student "
                         f"would be saved over the teacher. Give another output_dir.")
    teacher = teacher_summary(config.teacher_model_path, config.seed, config.world_size)
    summary = run_training(script, config)
    summary["distill_vs_grpo"] = compare(teacher, summary)
    if config.process_index == 0:
        Path(config.output_dir, "summary.json").write_text(json.dumps(summary, indent=2))
        plot_runs(teacher, summary, Path(config.output_dir) / "curve.png")
    print(describe(summary["distill_vs_grpo"]))
    return summary


TEACHER_KEYS = ("seed", "steps", "accuracy_after", "accuracy_by_seconds")


def teacher_summary(path: str, seed: int, world_size: int = 1) -> dict:
    """The GRPO demo's summary at `path`: a finished run of this seed found there, else the demo trained there
    now, into a folder that is missing or empty (never over a model of the user's)."""
    from ..cli import DEMO_CONFIG, parse_config
    from ..runner import run_training

    folder = Path(path)
    found = folder / "summary.json"
    if found.exists():
        summary = json.loads(found.read_text())
        missing = [key for key in TEACHER_KEYS if summary.get(key) is None]
        if not missing and summary["seed"] == seed:
            print(f"teacher: the GRPO demo in {path}/ (seed {seed}, {summary['steps']} steps, held-out accuracy "
                  f"{summary['accuracy_after']:.3f})")
            return summary
        why = f"it lacks {missing}" if missing else f"it is seed {summary['seed']}'s run, not seed {seed}'s"
        raise ValueError(f"teacher_model_path={path!r}: {why} (a GRPO demo run of this version, `verl-hf demo --seed "
                         f"{seed} --output_dir {path}`, writes them). Train it there again, or give another "
                         f"teacher_model_path.")
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"teacher_model_path={path!r} holds files but no GRPO demo summary: the demo trains its "
                         f"teacher only into a missing or empty folder. Give an empty or new folder, or a GRPO demo's "
                         f"output.")
    if world_size > 1:
        raise ValueError(f"no GRPO demo in teacher_model_path={path!r}: train it first (`verl-hf demo --seed {seed} "
                         f"--output_dir {path}`, under the same launcher), then run the distillation demo.")
    print(f"teacher: no GRPO demo in {path}/ yet; training it first (`verl-hf demo --seed {seed} --output_dir {path}`)")
    return run_training(*parse_config(str(DEMO_CONFIG), ["--output_dir", path, "--seed", str(seed)]))


def reached(points: list, target: float) -> list | None:
    """[step, seconds] of the first evaluation after step 0 at `target` accuracy or above, else None."""
    return next(([step, seconds] for step, seconds, accuracy in points[1:]
                 if accuracy is not None and accuracy >= target), None)


def compare(teacher: dict, student: dict) -> dict:
    """Where the student first came within 3 points of the teacher's held-out accuracy (its step and training
    seconds, and those as shares of the whole GRPO run that trained the teacher), and where GRPO itself first
    did (None where a run did not)."""
    target = teacher["accuracy_after"] - WITHIN
    student_at = reached(student["accuracy_by_seconds"], target)
    grpo_at = reached(teacher["accuracy_by_seconds"], target)
    grpo_steps, grpo_seconds = teacher["steps"], teacher["accuracy_by_seconds"][-1][1]
    return {"teacher_accuracy": teacher["accuracy_after"], "student_start": student["accuracy_before"],
            "student_final": student["accuracy_after"], "grpo_steps": grpo_steps,
            "grpo_seconds": round(grpo_seconds, 1),
            "reached_step": student_at and student_at[0], "reached_seconds": student_at and round(student_at[1], 1),
            "steps_share": student_at and grpo_steps and round(student_at[0] / grpo_steps, 3),
            "seconds_share": student_at and grpo_seconds and round(student_at[1] / grpo_seconds, 3),
            "grpo_reached_step": grpo_at and grpo_at[0], "grpo_reached_seconds": grpo_at and round(grpo_at[1], 1)}


def describe(comparison: dict) -> str:
    c = comparison
    head = (f"distillation: held-out accuracy {c['student_start']:.3f} -> {c['student_final']:.3f}; the teacher "
            f"(GRPO, {c['grpo_steps']} steps, {c['grpo_seconds']:.0f} s of training) has {c['teacher_accuracy']:.3f}")
    if c["reached_step"] is None:
        return head + f"; not within {WITHIN * 100:.0f} points of it in this run"
    grpo = (f"; GRPO itself first came that close at step {c['grpo_reached_step']}, {c['grpo_reached_seconds']:.0f} s"
            if c["grpo_reached_step"] is not None else "")
    return head + (f"; within {WITHIN * 100:.0f} points of it at step {c['reached_step']} ({c['steps_share']:.0%} of "
                   f"GRPO's steps), {c['reached_seconds']:.0f} s ({c['seconds_share']:.0%} of GRPO's seconds){grpo}")


def plot_runs(teacher: dict, student: dict, path: Path) -> None:
    """Held-out accuracy against steps and against training seconds, GRPO (the teacher's run) and distillation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for summary, label in ((teacher, "GRPO (trains the teacher)"), (student, "on-policy distillation")):
        points = [p for p in summary["accuracy_by_seconds"] if p[2] is not None]
        for ax, column in zip(axes, (0, 1)):
            ax.plot([p[column] for p in points], [p[2] for p in points], marker="o", markersize=3, label=label)
    for ax, xlabel in zip(axes, ("optimizer step", "training seconds (evaluation excluded)")):
        ax.axhline(teacher["accuracy_after"] - WITHIN, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel("held-out accuracy")
    axes[1].legend(loc="lower right")
    fig.suptitle("verl_hf demo: distillation from the GRPO model against GRPO itself, from the same warm start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
