"""`verl-hf`: YAML + overrides, the train command end to end, env."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_hf.cli import DEMO_CONFIG, main, parse_config

REPO = Path(__file__).resolve().parents[1]


def test_yaml_then_overrides():
    script, config = parse_config(str(DEMO_CONFIG), ["--max_steps", "7", "--reward_weights", "1.0", "0.5"])
    assert script.model_name_or_path == "demo" and script.dataset_name == "verl_hf:addition"
    assert config.max_steps == 7 and config.reward_weights == [1.0, 0.5]
    assert config.num_generations == 4 and config.reward_funcs == ["gsm8k", "gsm8k_format"]


def test_examples_configs_are_the_packaged_demo_configs():
    from verl_hf.cli import DEMO_TASKS

    assert (REPO / "examples" / "configs" / "demo.yaml").read_text() == DEMO_CONFIG.read_text()
    assert (REPO / "examples" / "configs" / "tools.yaml").read_text() == DEMO_TASKS["tools"].read_text()


def test_unknown_yaml_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_generation: 4\n")
    with pytest.raises(ValueError, match=r"unknown field\(s\) 'num_generation' \(did you mean 'num_generations'\?\)"):
        parse_config(str(bad), [])


def test_train_command_runs_and_writes_outputs(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "verl_hf.cli", "train", str(REPO / "examples/configs/demo.yaml"),
           "--max_steps", "4", "--eval_steps", "2", "--logging_steps", "2", "--output_dir", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and 0 <= summary["accuracy_after"] <= 1
    assert (out / "curve.png").stat().st_size > 1000 and (out / "model.safetensors").exists()
    assert "reward" in result.stdout  # the table header


def test_env_and_help(capsys):
    assert main(["env"]) == 0
    report = capsys.readouterr().out
    for line in ("transformers: ", "deepspeed: ", "vllm: ", "vllm distribution: ", "devices: cuda=",
                 "deepspeed accelerator: "):
        assert line in report, line
    assert report.startswith("```") and report.rstrip().endswith("```")  # pastes as a block
    assert main(["--help"]) == 0
    assert main(["trian"]) == 2
    assert "verl-hf: error: unknown command 'trian'" in capsys.readouterr().err


def test_yaml_numbers_and_nulls_get_field_types(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("base_config: demo\nlearning_rate: 1e-5\nkl_coef: 1e-3\ndataset_test_split: null\n"
                      "reward_weights: [1, 0.5]\neval_do_sample: true\n")
    script, cfg = parse_config(str(config), ["--max_steps", "3"])
    assert cfg.learning_rate == 1e-5 and cfg.kl_coef == 1e-3 and cfg.reward_weights == [1.0, 0.5]
    assert cfg.eval_do_sample is True and cfg.max_steps == 3 and script.dataset_test_split is None


def test_a_flag_says_null_as_the_yaml_does():
    """`--field null` is None for a field that admits None (as `field: null` in the file), also over a file's
    value; `null` for a field that cannot be None is refused by name instead of kept as the string 'null'."""
    script, cfg = parse_config(str(DEMO_CONFIG), ["--dataset_test_split", "null", "--clip_ratio_low=null"])
    assert script.dataset_test_split is None and cfg.clip_ratio_low is None
    with pytest.raises(ValueError, match="--max_steps null: max_steps cannot be None"):
        parse_config(str(DEMO_CONFIG), ["--max_steps", "null"])
