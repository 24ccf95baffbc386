"""The GPU check (scripts/gpu_check.py) in its CPU mode: the same sections at tiny sizes, so that a renamed field,
metric, flag or launcher config breaks it here rather than on the next lent GPU, where nobody can fix it.

Each section must PASS, or SKIP for a reason that holds on this machine: trl not installed (vs_trl), no GPU
(routing_replay), vllm or deepspeed not importable. The whole CPU mode took 320 s here beside a busy test worker
(2 cores), so the suite runs it without the two server sections (vllm_server, partial_rollouts: the server's start
alone took 100 s of that); tests/test_rollout_vllm_server.py and tests/test_asynchronous.py cover those paths, and
`bash scripts/gpu_check.sh --cpu --out DIR` runs them all.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_SUITE = ["environment", "grpo_hf", "chunked_logprobs", "fsdp2", "zero3", "vs_trl", "tflops", "vllm_colocated",
            "lora_adapter", "routing_replay"]
VLLM_SECTIONS = {"vllm_colocated", "lora_adapter", "vllm_server", "partial_rollouts"}


def allowed_skip(section: str, figure: str) -> bool:
    """A SKIP whose reason is true here."""
    absent = {name: importlib.util.find_spec(name) is None for name in ("trl", "vllm", "deepspeed")}
    if section == "vs_trl":
        return absent["trl"] and "trl is not importable" in figure
    if section == "routing_replay":
        return figure.startswith("GPU only")
    if section in VLLM_SECTIONS:
        return absent["vllm"] and "vllm is not importable" in figure
    if section == "zero3":
        return absent["deepspeed"] and "deepspeed is not importable" in figure
    return False


@pytest.fixture(scope="module")
def cpu_mode(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu", "--out", str(out),
                           "--only", *IN_SUITE], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHON": sys.executable})
    return done, out


def test_cpu_mode_passes_every_section_or_skips_for_a_true_reason(cpu_mode):
    done, out = cpu_mode
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "section" in done.stdout and "| status |" in done.stdout  # the verdict table
    rows = json.loads((out / "verdict.json").read_text())["sections"]
    assert [r["section"] for r in rows] == IN_SUITE
    for row in rows:
        assert row["status"] == "PASS" or (row["status"] == "SKIP" and allowed_skip(row["section"], row["figure"])), row


def test_cpu_mode_figures_are_measured(cpu_mode):
    """The figures come from the runs (a key renamed in verl_hf would show as nan, not as an error)."""
    _, out = cpu_mode
    figures = {r["section"]: r["figure"] for r in json.loads((out / "verdict.json").read_text())["sections"]}
    for section in ("grpo_hf", "tflops") + (("vllm_colocated", "lora_adapter") if importlib.util.find_spec("vllm")
                                            else ()):
        assert "nan" not in figures[section], (section, figures[section])


def test_both_modes_size_every_section():
    """A section missing from a mode's limits would stop the whole GPU run (read only there)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert set(gpu_check.GPU.limits) == set(gpu_check.CPU.limits) == set(gpu_check.SECTIONS)
    assert sum(gpu_check.GPU.limits[name] for name in IN_SUITE if name in gpu_check.GPU.limits) > 0


def test_gpu_mode_without_a_gpu_and_unknown_sections_are_refused(tmp_path):
    script = str(REPO / "scripts" / "gpu_check.py")
    unknown = subprocess.run([sys.executable, script, "--cpu", "--only", "grpo"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "--only grpo: no such section; the sections are environment" in unknown.stderr
    import torch

    if not torch.cuda.is_available():
        gpu = subprocess.run([sys.executable, script, "--out", str(tmp_path)], capture_output=True, text=True,
                             timeout=300)
        assert gpu.returncode != 0 and "add --cpu for the CPU mode" in gpu.stderr
