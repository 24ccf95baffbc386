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

    assert DEMO_TASKS["addition"] == DEMO_CONFIG
    for task, packaged in DEMO_TASKS.items():
        assert (REPO / "examples" / "configs" / packaged.name).read_text() == packaged.read_text(), task


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


def test_distill_demo_reuses_a_prior_grpo_demo_as_its_teacher_and_compares_the_runs(tmp_path):
    """`verl-hf demo --task distill` with a prior GRPO demo's folder (here the warm start and a summary saying
    seed 0, 500 steps, held-out accuracy 0.30 after 200 s): no GRPO run, 4 distillation steps, and the comparison
    (the student's first evaluation within 3 points of the teacher, as shares of GRPO's steps and seconds)."""
    import shutil

    from verl_hf.demo import WARM_START_DIR

    teacher = tmp_path / "demo-output"
    shutil.copytree(WARM_START_DIR, teacher)
    (teacher / "summary.json").write_text(json.dumps({"seed": 0, "steps": 500, "accuracy_after": 0.30,
                                                      "accuracy_by_seconds": [[0, 0.0, 0.3], [500, 200.0, 0.30]]}))
    out = tmp_path / "distill"
    cmd = [sys.executable, "-m", "verl_hf.cli", "demo", "--task", "distill", "--teacher_model_path", str(teacher),
           "--max_steps", "4", "--eval_steps", "2", "--logging_steps", "2", "--output_dir", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"teacher: the GRPO demo in {teacher}/ (seed 0, 500 steps" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    steps = [point[0] for point in summary["accuracy_by_seconds"]]
    comparison = summary["distill_vs_grpo"]
    assert steps == [0, 2, 4] and comparison["grpo_steps"] == 500 and comparison["grpo_seconds"] == 200.0
    # The warm start is the teacher here (0.30 said): where the student's own curve first comes within 3 points of
    # it is read from that curve, since 2 steps of distillation move held-out accuracy by a point or two either way
    # depending on the CPU kind's rounding (step 2 on two kinds, 4 on AVX512-BF16)
    curve = summary["accuracy_by_seconds"]
    first = next((step for step, _, accuracy in curve[1:] if accuracy >= 0.30 - 0.03), None)
    assert comparison["reached_step"] == first and comparison["steps_share"] == (first and first / 500)
    assert comparison["student_start"] == curve[0][2] and comparison["student_final"] == curve[-1][2]
    assert "distillation: held-out accuracy" in result.stdout
    assert (out / "curve.png").stat().st_size > 1000


def test_the_distill_comparison_finds_the_first_evaluation_within_3_points_of_the_teacher():
    from verl_hf.demo.distill_demo import compare, describe

    # teacher 0.60 -> target 0.57; the student's evaluations after step 0: 0.50 at step 2, 0.58 at step 4 (2.0 s)
    teacher = {"steps": 500, "accuracy_after": 0.60,
               "accuracy_by_seconds": [[0, 0.0, 0.30], [100, 40.0, 0.50], [500, 200.0, 0.60]]}
    student = {"accuracy_before": 0.30, "accuracy_after": 0.58,
               "accuracy_by_seconds": [[0, 0.0, 0.30], [2, 1.0, 0.50], [4, 2.0, 0.58]]}
    c = compare(teacher, student)
    assert (c["reached_step"], c["reached_seconds"], c["steps_share"], c["seconds_share"]) == (4, 2.0, 0.008, 0.01)
    assert (c["grpo_reached_step"], c["grpo_reached_seconds"]) == (500, 200.0)
    student["accuracy_by_seconds"][2][2] = 0.56  # 0.56 < 0.57: never within 3 points
    assert compare(teacher, student)["reached_step"] is None
    assert "not within 3 points of it in this run" in describe(compare(teacher, student))


def test_the_distill_demo_never_trains_its_teacher_over_a_folder_it_did_not_make(tmp_path):
    from verl_hf.demo.distill_demo import teacher_summary

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model.safetensors").write_text("a user's model")
    with pytest.raises(ValueError, match="holds files but no GRPO demo summary"):
        teacher_summary(str(mine), seed=0)
    other = tmp_path / "other"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({"seed": 1, "steps": 500, "accuracy_after": 0.6,
                                                    "accuracy_by_seconds": [[0, 0.0, 0.3], [500, 200.0, 0.6]]}))
    with pytest.raises(ValueError, match="it is seed 1's run, not seed 0's"):
        teacher_summary(str(other), seed=0)
    (other / "summary.json").write_text(json.dumps({"seed": 0, "steps": 500, "accuracy_after": 0.6}))
    with pytest.raises(ValueError, match=r"it lacks \['accuracy_by_seconds'\]"):
        teacher_summary(str(other), seed=0)
    with pytest.raises(ValueError, match="multi-process|train it first"):
        teacher_summary(str(tmp_path / "new"), seed=0, world_size=2)


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


def _cli(args: list[str], **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "verl_hf.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**os.environ, **env})


@pytest.mark.parametrize("args, env, says", [
    (["train", str(DEMO_CONFIG), "--num_generation", "8"], {},
     "unknown flag --num_generation (did you mean '--num_generations'?)"),
    (["train", "{bad_yaml}"], {}, "{bad_yaml}:2: num_generations: invalid int value: 'eight'"),
    (["train", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--dataset_name", "verl_hf:addition",
      "--reward_funcs", "gsm8k", "--output_dir", "{tmp}"], {"HF_HUB_OFFLINE": "1"},
     "model='Qwen/Qwen2.5-0.5B-Instruct' is a Hub id, and HF_HUB_OFFLINE is set while it is not in the local Hub "
     "cache"),
])
def test_a_command_line_mistake_is_two_lines_and_status_2(args, env, says, tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("base_config: demo\nnum_generations: eight\n")
    args = [a.format(bad_yaml=bad_yaml, tmp=tmp_path) for a in args]
    result = _cli(args, **env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) <= 2, result.stderr[-3000:]
    assert says.format(bad_yaml=bad_yaml) in lines[0], lines


def test_more_command_line_mistakes_are_named(tmp_path, capsys):
    cases = [(["train", str(DEMO_CONFIG), "--max_steps", "x"], "--max_steps: invalid int value: 'x'"),
             (["train", str(DEMO_CONFIG), "--bogus_flag", "1"], "unknown flag --bogus_flag;"),
             (["train", str(DEMO_CONFIG), "--loss_type", "dr_grpo"], "loss_type='dr_grpo' is TRL's GRPOConfig"),
             (["train"], "verl-hf train needs a config file"),
             (["train", str(DEMO_CONFIG), "--config", str(DEMO_CONFIG)], "takes one config file"),
             (["train", "--config"], "--config needs a file")]
    for args, says in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 2, (args, err)


def test_train_takes_trls_config_flag_and_names_and_a_run_from_flags_alone(tmp_path):
    from verl_hf.cli import _train_config

    assert _train_config(["--config", "a.yaml", "--max_steps", "3"]) == ("a.yaml", ["--max_steps", "3"])
    assert _train_config(["--max_steps", "3", "--config=a.yaml"]) == ("a.yaml", ["--max_steps", "3"])
    assert _train_config(["--model_name_or_path", "m"]) == (None, ["--model_name_or_path", "m"])
    script, config = parse_config(None, ["--model_name_or_path", "demo", "--dataset_name", "verl_hf:addition",
                                         "--output_dir", str(tmp_path), "--beta", "0.04",
                                         "--max_completion_length=32", "--use_cpu", "true"])
    assert script.model_name_or_path == "demo" and (config.kl_coef, config.max_response_length) == (0.04, 32)
    with pytest.raises(ValueError, match="unknown flag --num_generation "):
        parse_config(str(DEMO_CONFIG), ["--num_generation", "8"])  # no prefix matching


def test_trl_flags_read_as_trls_parser_reads_them(tmp_path):
    """A bare TRL switch is True (TRL's HfArgumentParser); our parser's own spellings (`--no_<field>`, dashes)
    still pass; a TRL flag beside ours for the same field is refused; a file's TRL name beats its base's field."""
    _, cfg = parse_config(str(DEMO_CONFIG), ["--use_vllm", "--vllm_enable_sleep_mode", "false", "--max-steps", "3",
                                             "--no_norm_adv_by_std_in_grpo", "--shuffle_dataset"])
    assert (cfg.rollout_engine, cfg.vllm_sleep_level, cfg.max_steps, cfg.norm_adv_by_std_in_grpo) == \
        ("vllm", 0, 3, False)
    _, cfg = parse_config(str(DEMO_CONFIG), ["--steps_per_generation", "2", "--per_device_train_batch_size", "4"])
    assert (cfg.generation_batch_size, cfg.per_device_train_batch_size) == (8, 4)
    with pytest.raises(ValueError, match="sets --kl_coef and TRL's name for the same field \\(--beta\\); keep one"):
        parse_config(str(DEMO_CONFIG), ["--kl_coef", "0.1", "--beta", "0.2"])
    child = tmp_path / "child.yaml"
    child.write_text("base_config: demo\nbeta: 0.04\n")  # demo.yaml sets kl_coef itself
    assert parse_config(str(child), [])[1].kl_coef == 0.04
