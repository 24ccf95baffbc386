"""Exact resume after kill -9: a run killed in the middle of a multi-step rollout round and resumed from its
last checkpoint logs exactly the metrics of an uninterrupted run (CPU, fixed seed); multi-turn rounds of
whole conversations with a tool included."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("resume_run.py")


def _run(out: Path, kind: str, kill_at: int = 0, checkpoint: Path | None = None) -> int:
    cmd = [sys.executable, str(SCRIPT), str(out), kind, str(kill_at), *([str(checkpoint)] if checkpoint else [])]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode in (0, -signal.SIGKILL), result.stderr[-3000:]
    return result.returncode


@pytest.mark.parametrize("kind", ["ppo_lagrangian", "grpo_dynamic", "multi_turn"])
def test_killed_run_resumes_with_identical_metrics(tmp_path, kind):
    _run(tmp_path / "full", kind)
    assert _run(tmp_path / "killed", kind, kill_at=5) == -signal.SIGKILL
    checkpoint = tmp_path / "killed" / "out" / "checkpoint-3"  # inside a round: step 3 of a 4- (or 2-) step round
    assert checkpoint.is_dir() and not (tmp_path / "killed" / "logs.json").exists()
    _run(tmp_path / "killed", kind, checkpoint=checkpoint)
    full = {h["step"]: h for h in json.loads((tmp_path / "full" / "logs.json").read_text())}
    resumed = {h["step"]: h for h in json.loads((tmp_path / "killed" / "logs.json").read_text())}
    assert sorted(resumed) == list(range(1, 9))
    for step in range(4, 9):
        compared = {k: v for k, v in full[step].items() if not k.startswith(("time/", "rollout/tokens_per_s"))
                    and k not in ("epoch",)}
        assert {k: resumed[step].get(k) for k in compared} == compared, step
    if kind == "ppo_lagrangian":
        assert {"safety/lambda", "kl/coef", "cost_critic/value_loss"} <= set(full[5])
    if kind == "multi_turn":  # conversations that called the tool (logged at each round's first step)
        assert all(full[step]["tool_calls/mean"] > 0 and full[step]["turns/mean"] > 1 for step in (1, 5))
