"""Checkpoint folders that are complete or absent: written aside, marked, then renamed into place.

A save writes `checkpoint-N` under `<output_dir>/_verl_hf_partial/` (every process, the Trainer's files and
ours), and once every process is done the main process writes `verl_hf_complete.json` (the step and every
file's size) into it and renames it to `<output_dir>/checkpoint-N`: a rename is atomic, so `checkpoint-N`
is either the whole checkpoint or not there. A save killed half-way leaves only the staging folder, which
no resume looks at and the next save clears.

`resume_from_checkpoint=True` takes the newest checkpoint whose files all have the sizes its marker
recorded (a folder from before this scheme has no marker: taken, with a warning); a truncated or missing
file is reported by name with the previous complete checkpoint to use instead.

See it work: tests/test_checkpoint_files.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil

logger = logging.getLogger(__name__)

STAGING_DIR = "_verl_hf_partial"  # "_*": left out of the Trainer's Hub uploads of output_dir
JIT_SENTINEL = "checkpoint-is-incomplete.txt"  # transformers' own mark of a checkpoint being written
MARKER = "verl_hf_complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_ASIDE = ".replaced"  # a checkpoint folder moved aside while the same step is published again


def staging_root(run_dir: str) -> str:
    return os.path.join(run_dir, STAGING_DIR)


def mark_complete(folder: str, step: int) -> None:
    """Write the marker: the step and {relative path: size} of every file in `folder`."""
    sizes = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            sizes[os.path.relpath(path, folder)] = os.path.getsize(path)
    with open(os.path.join(folder, MARKER + ".tmp"), "w") as f:
        json.dump({"step": step, "files": sizes}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(os.path.join(folder, MARKER + ".tmp"), os.path.join(folder, MARKER))


def publish(staged: str, final: str) -> None:
    """Rename the complete `staged` folder to `final`; a folder already there (the same step saved again) is
    replaced only once the new one is in place."""
    old = None
    if os.path.exists(final):
        old = final + _ASIDE
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(staged, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def damage(folder: str) -> list[str] | None:
    """The files of `folder` that are missing or of another size than its marker says ([] when complete);
    None when it has no marker (written before markers existed, or by a plain Trainer)."""
    marker = os.path.join(folder, MARKER)
    if not os.path.exists(marker):
        return None
    try:
        with open(marker) as f:
            recorded = json.load(f)["files"]
    except (OSError, ValueError, KeyError):
        return [MARKER]
    return [name for name, size in sorted(recorded.items())
            if not os.path.isfile(os.path.join(folder, name)) or os.path.getsize(os.path.join(folder, name)) != size]


def checkpoints(run_dir: str) -> list[str]:
    """`checkpoint-N` folders of `run_dir`, newest first. A `checkpoint-N.replaced` without its `checkpoint-N`
    (a save of the same step killed between `publish`'s two renames) is put back first."""
    if not os.path.isdir(run_dir):
        return []
    for name in os.listdir(run_dir):
        if name.endswith(_ASIDE) and _CHECKPOINT.match(name[: -len(_ASIDE)]):
            final = os.path.join(run_dir, name[: -len(_ASIDE)])
            if not os.path.exists(final):
                with contextlib.suppress(OSError):  # another process put it back first
                    os.rename(os.path.join(run_dir, name), final)
    found = [(int(m.group(1)), name) for name in os.listdir(run_dir)
             if (m := _CHECKPOINT.match(name)) and os.path.isdir(os.path.join(run_dir, name))]
    return [os.path.join(run_dir, name) for _, name in sorted(found, reverse=True)]


def newest_complete(run_dir: str) -> str | None:
    """The newest checkpoint whose files are all there (see `damage`), or None; damaged ones are skipped with
    a warning that names their files."""
    for folder in checkpoints(run_dir):
        if os.path.exists(os.path.join(folder, JIT_SENTINEL)):
            logger.warning("skipping %s: transformers marked it incomplete (%s)", folder, JIT_SENTINEL)
            continue
        bad = damage(folder)
        if bad:
            logger.warning("skipping %s: %s missing or truncated", folder, ", ".join(bad[:5]))
            continue
        if bad is None:
            logger.warning("%s has no %s (saved before atomic checkpoints, or by another trainer): taking it "
                           "unverified", folder, MARKER)
        return folder
    return None


def resolve_resume(resume_from_checkpoint, output_dir: str):
    """The checkpoint to resume from: True -> the newest complete one in `output_dir` (said in the log); a
    path -> that folder once `check_loadable` passes; None / False -> None."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() == "true" and \
            not os.path.isdir(resume_from_checkpoint):  # the command line's spelling of True
        resume_from_checkpoint = True
    if resume_from_checkpoint is True:
        folder = newest_complete(output_dir)
        if folder is None:
            raise ValueError(f"resume_from_checkpoint=True, but {output_dir} holds no complete checkpoint-N folder; "
                             f"give a checkpoint path, or start without resume_from_checkpoint.")
        logger.info("resuming from %s, the newest complete checkpoint in %s", folder, output_dir)
        return folder
    check_loadable(str(resume_from_checkpoint))
    return str(resume_from_checkpoint)


def check_loadable(folder: str) -> None:
    """Raise when `folder` is not a checkpoint, or its marker names files that are missing or truncated."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"resume_from_checkpoint={folder!r}: no such directory.")
    bad = damage(folder)
    if bad:
        previous = [c for c in checkpoints(os.path.dirname(os.path.abspath(folder))) if c != os.path.abspath(folder)
                    and not damage(c)]
        hint = f"resume from {previous[0]} instead" if previous else "no earlier complete checkpoint is left"
        raise ValueError(f"checkpoint {folder} is damaged: {', '.join(bad[:5])} missing or of another size than "
                         f"when it was saved; {hint} (resume_from_checkpoint=<path>), or delete the folder.")


def is_final_model(output_dir: str) -> bool:
    """A save_model into a folder that is not a checkpoint-<step> folder: the run's final model."""
    return _CHECKPOINT.match(os.path.basename(os.path.normpath(output_dir))) is None


def save_gathered_fsdp_weights(trainer, output_dir: str) -> None:
    """The Trainer writes FSDP's sharded state into checkpoints only, and no weights at all into a final
    save_model; the final model is a normal HF checkpoint, gathered by every process (a collective), written by
    the main one. A PEFT model gathers its adapter only: the frozen base stays sharded."""
    from .distributed import full_state_dicts

    if not trainer.is_fsdp_enabled or "FULL" in str(trainer.accelerator.state.fsdp_plugin.state_dict_type):
        return
    state_dict, _ = full_state_dicts(trainer.model, trainable_only=hasattr(trainer.model, "peft_config"))
    if trainer.args.should_save:
        trainer._save(output_dir, state_dict=state_dict)


def save_atomically(trainer, save, model, trial) -> None:
    """The Trainer's `_save_checkpoint` (`save`) into the staging folder (every process), then, on the process
    that saves, the marker and the rename into place, and the rotation of old checkpoints. A failed write
    (disk full, permissions) raises with the path; the checkpoints already in place stay as they were."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

    args, step = trainer.args, trainer.state.global_step
    run_dir = trainer._get_output_dir(trial=trial)
    staging, name = staging_root(run_dir), f"{PREFIX_CHECKPOINT_DIR}-{step}"
    staged, final = os.path.join(staging, name), os.path.join(run_dir, name)
    if args.should_save:
        shutil.rmtree(staging, ignore_errors=True)  # whatever a killed save left, of any step
    _barrier(args)
    push, args.push_to_hub = args.push_to_hub, False  # pushed from the final folder below
    trainer.checkpoint_staging = staging
    try:
        save(model, trial)
    except FloatingPointError:  # NaN/inf weights were refused before anything was written: not a disk matter
        raise
    except Exception as e:  # OSError, safetensors' and torch's write errors alike: the folder is not whole
        previous = newest_complete(run_dir)
        raise RuntimeError(f"saving {name} failed while writing under {staged}: {type(e).__name__}: {e}. The "
                           f"checkpoints in place are intact (newest: {previous}); if the disk is full or not "
                           f"writable, free space or fix permissions, then resume.") from e
    finally:
        trainer.checkpoint_staging, args.push_to_hub = None, push
    _barrier(args)
    _relocate_best(trainer, staging, run_dir, staged, args.should_save)
    if args.should_save:
        mark_complete(staged, step)
        publish(staged, final)
        with contextlib.suppress(OSError):  # empty now: no stray folder beside the checkpoints
            os.rmdir(staging)
        rotate_checkpoints(output_dir=run_dir, save_total_limit=args.save_total_limit,
                           best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=True)
    _barrier(args)
    if push:
        trainer._push_from_checkpoint(final)


def _relocate_best(trainer, staging: str, run_dir: str, staged: str, writes: bool) -> None:
    """The Trainer recorded a best checkpoint saved in this step under its staging path: point it at where it
    is about to be, in every process's state (all load it at the end) and, where `writes`, in the saved
    trainer_state.json."""
    from transformers.trainer import TRAINER_STATE_NAME

    best = trainer.state.best_model_checkpoint
    if best and os.path.abspath(best).startswith(os.path.abspath(staging) + os.sep):
        trainer.state.best_model_checkpoint = os.path.join(run_dir, os.path.basename(best))
        if writes and os.path.exists(os.path.join(staged, TRAINER_STATE_NAME)):
            trainer.state.save_to_json(os.path.join(staged, TRAINER_STATE_NAME))


def _barrier(args) -> None:
    import torch.distributed as dist

    if args.world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.barrier()
