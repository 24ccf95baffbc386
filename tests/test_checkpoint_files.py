"""Atomic checkpoints (verl_hf/saving.py): a save killed at any point, or failing for lack of space, leaves
no `checkpoint-N` that is not whole; `resume_from_checkpoint=True` takes the newest complete one; a damaged
file is named, with the checkpoint to use instead."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from verl_hf import saving

SCRIPT = Path(__file__).with_name("save_fault_run.py")


def _run(out: Path, fault: str, resume: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), str(out), fault, *(["resume"] if resume else [])]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _visible(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "out").iterdir() if p.name.startswith("checkpoint-"))


@pytest.mark.parametrize("fault", ["kill_at_write_1", "kill_at_write_3", "kill_before_rename"])
def test_a_save_killed_anywhere_leaves_only_whole_checkpoints(tmp_path, fault):
    killed = _run(tmp_path, fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert _visible(tmp_path) == ["checkpoint-1"]  # checkpoint-2 was being written: not there at all
    assert saving.damage(str(tmp_path / "out" / "checkpoint-1")) == []
    if fault == "kill_before_rename":  # resuming takes checkpoint-1, clears the leftovers, and finishes
        resumed = _run(tmp_path, "none", resume=True)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"RESUMED_FROM={tmp_path / 'out' / 'checkpoint-1'}" in resumed.stdout
        assert _visible(tmp_path) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
        assert all(saving.damage(str(tmp_path / "out" / name)) == [] for name in _visible(tmp_path))
        assert not (tmp_path / "out" / saving.STAGING_DIR).exists()  # nothing left beside the checkpoints


def test_a_full_disk_stops_with_the_path_and_keeps_the_last_checkpoint(tmp_path):
    failed = _run(tmp_path, "file_size_limit")
    assert failed.returncode == 1
    assert "saving checkpoint-2 failed while writing under" in failed.stderr
    assert "The checkpoints in place are intact (newest:" in failed.stderr and "checkpoint-1)" in failed.stderr
    assert _visible(tmp_path) == ["checkpoint-1"] and saving.damage(str(tmp_path / "out" / "checkpoint-1")) == []


def _checkpoint(run_dir: Path, step: int, files: dict[str, bytes], marked: bool = True) -> Path:
    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    if marked:
        saving.mark_complete(str(folder), step)
    return folder


def test_damaged_files_are_named_and_the_previous_checkpoint_offered(tmp_path):
    good = _checkpoint(tmp_path, 2, {"model.safetensors": b"x" * 100, "optimizer.pt": b"y" * 50})
    bad = _checkpoint(tmp_path, 4, {"model.safetensors": b"x" * 100, "optimizer.pt": b"y" * 50})
    (bad / "optimizer.pt").write_bytes(b"y" * 10)  # truncated
    assert saving.damage(str(bad)) == ["optimizer.pt"]
    assert saving.newest_complete(str(tmp_path)) == str(good)  # True skips the damaged one
    with pytest.raises(ValueError, match=rf"checkpoint {bad} is damaged: optimizer.pt missing or of another size.*"
                                         rf"resume from {good} instead"):
        saving.check_loadable(str(bad))
    (bad / "model.safetensors").unlink()
    assert saving.damage(str(bad)) == ["model.safetensors", "optimizer.pt"]
    with pytest.raises(FileNotFoundError, match="no such directory"):
        saving.resolve_resume(str(tmp_path / "checkpoint-9"), str(tmp_path))


def test_unmarked_checkpoints_are_taken_with_a_warning_and_none_is_an_error(tmp_path, caplog):
    with pytest.raises(ValueError, match="holds no complete checkpoint-N folder"):
        saving.resolve_resume(True, str(tmp_path))
    legacy = _checkpoint(tmp_path, 3, {"trainer_state.json": b"{}"}, marked=False)
    assert saving.damage(str(legacy)) is None
    assert saving.resolve_resume(True, str(tmp_path)) == str(legacy)
    assert "taking it unverified" in caplog.text
    assert saving.resolve_resume(None, str(tmp_path)) is None and saving.resolve_resume(False, str(tmp_path)) is None


def test_publishing_the_same_step_again_replaces_it_whole(tmp_path):
    final = _checkpoint(tmp_path, 5, {"a": b"old"})
    staged = tmp_path / saving.STAGING_DIR / "checkpoint-5"
    staged.mkdir(parents=True)
    (staged / "a").write_bytes(b"new")
    saving.mark_complete(str(staged), 5)
    saving.publish(str(staged), str(final))
    assert (final / "a").read_bytes() == b"new" and not staged.exists()
    assert json.loads((final / saving.MARKER).read_text())["step"] == 5
    assert not Path(f"{final}.replaced").exists()


def test_a_kill_between_the_two_renames_loses_nothing(tmp_path):
    """Saving a step again moves the old folder aside first; killed right then, the old one comes back."""
    old = _checkpoint(tmp_path, 5, {"a": b"old"})
    old.rename(f"{old}.replaced")  # what publish() had done when it was killed
    assert saving.newest_complete(str(tmp_path)) == str(old)
    assert (old / "a").read_bytes() == b"old" and not Path(f"{old}.replaced").exists()
