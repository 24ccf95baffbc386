"""The package installs as the design card says: callbacks/ is `verl_hf.callbacks`, editable and as a wheel."""

import subprocess
import sys
import zipfile
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]


def test_editable_install_maps_callbacks_folder():
    import verl_hf.callbacks

    assert Path(verl_hf.callbacks.__file__).resolve() == REPO / "callbacks" / "__init__.py"
    assert Path(verl_hf.__file__).resolve() == REPO / "verl_hf" / "__init__.py"


def test_wheel_contains_and_imports_callbacks(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(REPO)], check=True)
    wheel = next((tmp_path / "dist").glob("verl_hf-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "verl_hf/callbacks/__init__.py" in names and "verl_hf/callbacks/progress.py" in names
    assert "verl_hf/demo/warm_start/model.safetensors" in names and "verl_hf/demo/demo.yaml" in names
    assert "verl_hf/demo/warm_start_tools/model.safetensors" in names and "verl_hf/demo/tools.yaml" in names
    assert "verl_hf/demo/warm_start_tools_mistral/model.safetensors" in names and "verl_hf/demo/distill.yaml" in names
    assert "verl_hf/demo/tools_mistral.yaml" in names and "verl_hf/demo/tools_qwen3.yaml" in names
    assert "verl_hf/demo/warm_start_tools_qwen3/model.safetensors" in names
    assert "verl_hf/demo/warm_start_vision/model.safetensors" in names and "verl_hf/demo/vision.yaml" in names
    assert "verl_hf/demo/warm_start_vision/processor_config.json" in names
    assert "verl_hf/agent/templates/qwen3_multiturn.jinja" in names  # chat_template="qwen3_multiturn"
    assert not any(n.startswith(("callbacks/", "tests/")) for n in names)
    # Every module of the source tree made it into the wheel.
    source = {str(p.relative_to(REPO)) for p in (REPO / "verl_hf").rglob("*.py")}
    assert source <= set(names), source - set(names)
    assert any(n.endswith("entry_points.txt") for n in names)

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    # -S keeps the editable finder out of the way: only the wheel's copy can be imported.
    probe = ("import sys; sys.path[:0] = [sys.argv[1]] + [p for p in sys.argv[2:]]; import verl_hf.callbacks as c, "
             "verl_hf; print(c.__file__); print(verl_hf.__file__); from verl_hf.callbacks import RLProgressCallback")
    deps = [p for p in sys.path if p.endswith("site-packages")]
    out = subprocess.run([sys.executable, "-S", "-c", probe, str(target), *deps], check=True,
                         capture_output=True, text=True, cwd=tmp_path).stdout.split()
    assert out[0] == str(target / "verl_hf" / "callbacks" / "__init__.py")
    assert out[1] == str(target / "verl_hf" / "__init__.py")


def test_every_private_trainer_hook_we_override_exists():
    """VerlTrainer overrides private Trainer methods; a transformers release that drops or renames one is said
    at construction, with the supported range, instead of silently skipping our override."""
    import pytest
    import transformers

    from verl_hf import VerlTrainer
    from verl_hf.trainer_setup import TRAINER_HOOKS, check_trainer_hooks

    check_trainer_hooks()  # the installed transformers has them all
    overridden = {name for name in vars(VerlTrainer) if name.startswith("_") and not name.startswith("__")
                  and hasattr(transformers.Trainer, name)}
    assert overridden <= set(TRAINER_HOOKS), overridden - set(TRAINER_HOOKS)

    class Renamed(transformers.Trainer):
        _get_grad_norm = None

    with pytest.raises(RuntimeError, match=r"Trainer._get_grad_norm is gone, but VerlTrainer overrides or calls it "
                                           r"with \('model', 'grad_norm'\); install .*transformers>=5.3,<5.21"):
        check_trainer_hooks(Renamed)
