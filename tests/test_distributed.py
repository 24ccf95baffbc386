"""Real `accelerate launch` runs: two CPU processes with DDP, DeepSpeed ZeRO-2, ZeRO-3 and LoRA under ZeRO-3
(gloo). Every run samples from an HF inference copy fed by the weight sync with `sync_verify`: after each sync
the engine's weights are compared bitwise with the gathered training weights, and any difference fails the run."""

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, os, sys
from verl_hf.cli import parse_config
from verl_hf.runner import run_training
script, config = parse_config(sys.argv[1], sys.argv[2:])
summary = run_training(script, config)
with open(os.path.join(config.output_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({**summary, "world_size": config.world_size}, f)
"""


# The launcher flags of each mode; the DeepSpeed runs get no workaround from the user (VerlConfig applies the
# gloo fix on machines without GPUs by itself).
ACCELERATE = REPO / "examples" / "accelerate"
MODES = {  # the ready-made configs users launch with
    "ddp": ["--config_file", str(ACCELERATE / "ddp.yaml")],
    "zero2": ["--config_file", str(ACCELERATE / "zero2.yaml")],
    "zero3": ["--config_file", str(ACCELERATE / "zero3.yaml")],
    "zero3_lora": ["--config_file", str(ACCELERATE / "zero3.yaml")],
}
# Training flags per mode on top of the demo config. ZeRO-3 also carries a KL reference (DeepSpeed inference
# engine); its KL at the first step, before any update, must be zero. DDP trains in token-budget pieces.
EXTRA = {
    # DDP cuts each micro-batch into token-budget pieces: gradients synchronised after the last piece only
    "ddp": ["--max_tokens_per_micro_batch", "300"],
    "zero3": ["--kl_coef", "0.01"],
    "zero3_lora": ["--use_peft", "true", "--lora_r", "8", "--lora_target_modules", "q_proj", "v_proj",
                   "--learning_rate", "1e-3"],
}
MODEL_BYTES = 535_936 * 4  # the demo model's parameters (tied embedding counted once), fp32
# What a LoRA policy's sync sends after the first: the layers with an adapter, not the frozen embedding and norm.
LORA_LAYERS_BYTES = MODEL_BYTES - (86 * 128 + 128) * 4


def _run(tmp_path, launcher: list[str], out: Path, flags: list[str], env_extra: dict | None = None,
         config: str = "demo.yaml", script: str = SCRIPT) -> None:
    """`config` (in examples/configs/) trained under `launcher` by `script`, with `flags` on top."""
    result = _launched(tmp_path, launcher, out, flags, env_extra, config, script=script)
    noise = ("FutureWarning", "return func(", "RL: ", "Loading weights")
    errors = "\n".join(line for line in result.stderr.splitlines() if line.strip() and not line.lstrip().startswith(noise)
                       and not any(n in line for n in noise[:1]))
    assert result.returncode == 0, f"{' '.join(launcher)} exited {result.returncode}:\n{errors[-4000:]}"


def _launched(tmp_path, launcher: list[str], out: Path, flags: list[str], env_extra: dict | None = None,
              config: str = "demo.yaml", timeout: int = 900, script: str = SCRIPT) -> subprocess.CompletedProcess:
    """The finished launch of `config` under `launcher` by `script`, with `flags` on top, whatever its exit."""
    text, script = script, tmp_path / "run.py"
    script.write_text(text)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env_extra or {})}
    cmd = [sys.executable, *launcher, str(script), str(REPO / "examples/configs" / config), "--output_dir", str(out),
           "--per_device_eval_batch_size", "64", "--logging_steps", "1", "--bf16", "false", *flags]  # fp32: compared exactly
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _free_port() -> int:
    """A port nobody listens on, so that back-to-back launches never race for accelerate's default 29500."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(config: list[str]) -> list[str]:
    return ["-m", "accelerate.commands.launch", *config, "--num_processes", "2", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", str(_free_port())]


def _reward_model(tmp_path) -> str:
    """A tiny sequence-classification reward model (the demo backbone with a seeded random head) on disk."""
    path = tmp_path / "reward_model"
    if not path.exists():
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.manual_seed(0)
        warm_start = str(REPO / "verl_hf/demo/warm_start")
        AutoModelForSequenceClassification.from_pretrained(warm_start, num_labels=1).save_pretrained(path)
        AutoTokenizer.from_pretrained(warm_start).save_pretrained(path)
    return str(path)


def _launch(tmp_path, mode: str) -> list[dict]:
    out = tmp_path / mode
    flags = ["--max_steps", "4", "--eval_steps", "2", "--per_device_train_batch_size", "32", "--use_cpu", "false",
             "--rollout_hf_weights", "copy", "--sync_verify", "true", *EXTRA.get(mode, [])]
    if mode != "zero3_lora":  # a reward model too: sharded under ZeRO-3, a full copy per process elsewhere
        flags += ["--reward_model_path", _reward_model(tmp_path), "--reward_weights", "1.0", "0.1", "0.5"]
    _run(tmp_path, _two_processes(MODES[mode]), out, flags, {"ACCELERATE_USE_CPU": "true"} if mode == "ddp" else {})
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    ranks[0]["log_history"] = json.loads((out / "log_history.json").read_text())
    return ranks


def test_ddp_zero2_zero3_lora_train_sync_and_agree(tmp_path):
    """Two real processes each for DDP, ZeRO-2, ZeRO-3 (+ KL reference) and LoRA under ZeRO-3: every run
    learns, syncs (verified) before every rollout, both ranks report the same pooled metrics and full-set
    evaluation, and the full-weight modes sample the same first round."""
    runs = {mode: _launch(tmp_path, mode) for mode in MODES}
    for mode, (rank0, rank1) in runs.items():
        assert rank0["steps"] == rank1["steps"] == 4, mode
        for key in ("accuracy_before", "accuracy_after", "reward_first", "reward_last"):
            assert rank0[key] == rank1[key], (mode, key)
        assert rank0["accuracy_before"] == 0.315, mode  # the warm start on the full held-out set
        train_logs = [h for h in rank0["log_history"] if "reward/mean" in h]
        assert all(math.isfinite(h["loss"]) for h in train_logs), mode
        # every step whose advantages are not all zero moves the weights (a round whose groups all tie has none:
        # which round that is depends on the CPU kind's rounding), and some step had such advantages
        informative = [h for h in train_logs if h["advantages/abs_mean"] > 0]
        assert informative and all(h["grad_norm"] > 0 for h in informative), mode
        pushed = [round(h["sync/gigabytes"] * 1e9) for h in train_logs]
        if mode == "zero3_lora":  # every weight once (at the evaluation before the first step), then the adapted
            # layers; the first log averages that full sync with the first step's
            assert len(pushed) == 4 and LORA_LAYERS_BYTES <= pushed[0] <= MODEL_BYTES, pushed
            assert pushed[1:] == [LORA_LAYERS_BYTES] * 3, pushed
        else:
            assert pushed == [MODEL_BYTES] * 4, (mode, pushed)
        assert all(h["sync/peak_extra_mb"] < 64 for h in train_logs), mode
    kl = [h["kl"] for h in runs["zero3"][0]["log_history"] if "kl" in h]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 1e-4, kl  # zero before any update, then grows
    ddp = runs["ddp"][0]
    first_scores = {m: next(h for h in runs[m][0]["log_history"] if "reward/mean" in h)["reward/reward_model/mean"]
                    for m in ("ddp", "zero2", "zero3")}
    assert first_scores["zero3"] == pytest.approx(first_scores["ddp"], abs=1e-5), first_scores
    assert first_scores["zero2"] == pytest.approx(first_scores["ddp"], abs=1e-5), first_scores
    for mode in ("zero2", "zero3"):
        assert runs[mode][0]["reward_first"] == pytest.approx(ddp["reward_first"], abs=1e-6), mode
        assert abs(runs[mode][0]["accuracy_after"] - ddp["accuracy_after"]) <= 0.02, mode


def assert_same_first_step(tmp_path, launcher: list[str], flags: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """The same 64-completion round on one process, or split over two processes under `launcher` (32 each),
    gives the same first-step loss and the same updated weights (returns both runs' first logs). Per-prompt seeds
    make the samples identical; what remains is float summation order (batch shapes, all-reduce), hence the
    tolerances."""
    from safetensors.torch import load_file

    common = ["--max_steps", "1", "--eval_strategy", "no", "--learning_rate", "0.1", "--optim", "sgd",
              "--rollout_seed_per_prompt", "true", *flags]
    _run(tmp_path, [], tmp_path / "one", [*common, "--per_device_train_batch_size", "64"], {"RANK": "0"})
    _run(tmp_path, launcher, tmp_path / "two", [*common, "--per_device_train_batch_size", "32", "--use_cpu", "false"])
    logs = {run: next(h for h in json.loads((tmp_path / run / "log_history.json").read_text()) if "loss" in h)
            for run in ("one", "two")}
    for key in ("reward/mean", "response_length/mean", "loss"):  # identical samples, then the same loss
        assert logs["two"][key] == pytest.approx(logs["one"][key], abs=1e-6), key
    one, two = (load_file(str(tmp_path / run / "model.safetensors")) for run in ("one", "two"))
    start = load_file(str(REPO / "verl_hf/demo/warm_start/model.safetensors"))
    assert one.keys() == two.keys()
    for name in one:
        moved = (one[name] - start[name]).abs().max().item()
        assert (one[name] - two[name]).abs().max().item() <= 1e-6 + 1e-4 * moved, name
        assert moved > 0, name
    return logs["one"], logs["two"]


def test_one_process_and_two_zero3_processes_take_the_same_first_step(tmp_path):
    """Invariance: the same round on one process, or split over two ZeRO-3 processes, takes the same step. The
    run distils from a teacher, partitioned over the two processes (a DeepSpeed inference engine, like the KL
    reference): its per-token KL to the student is the same too (tests/test_fsdp2.py checks the plain run)."""
    spec = importlib.util.spec_from_file_location("custom_loop_distill", REPO / "examples/custom_loop_distill.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    teacher = example.drifted_student(str(tmp_path / "teacher"), noise=0.5)  # any model other than the student
    one, two = assert_same_first_step(tmp_path, _two_processes(MODES["zero3"]), flags=("--teacher_model_path", teacher))
    # the loss (which carries the teacher's log-probs in its advantages) matched within 1e-6 above; the logged KL is a
    # per-token mean pooled over the processes' halves, which hold different token counts: close, not equal
    assert two["distill/reverse_kl"] == pytest.approx(one["distill/reverse_kl"], rel=1e-2)
    assert one["distill/reverse_kl"] > 0.02, one  # the teacher scored the samples, and differs


def _critic_log(out: Path) -> list[tuple[int, float, float]]:
    history = json.loads((out / "log_history.json").read_text())
    return [(h["step"], h["loss"], h["critic/value_loss"]) for h in history if "critic/value_loss" in h]


def test_ppo_critic_under_ddp_and_zero3_and_exact_zero3_resume(tmp_path):
    """PPO's critic under two processes: averaged gradients under DDP, its own ZeRO-3 engine under DeepSpeed.
    Both give the same actor and critic losses; the critic learns; a ZeRO-3 run resumed from its step-4
    checkpoint (actor, critic engine, KL controller) repeats steps 5-8 exactly."""
    flags = ["--logging_steps", "1", "--use_cpu", "false", "--eval_strategy", "no"]
    ppo = str(REPO / "examples/configs/ppo.yaml")

    def run(config, out, extra, env=None):
        script = tmp_path / "run.py"
        script.write_text(SCRIPT)
        cmd = [sys.executable, *_two_processes(config), str(script), ppo, "--output_dir", str(out), "--bf16", "false",
               *flags, *extra]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        return _critic_log(out)

    ddp = run(MODES["ddp"], tmp_path / "ddp", ["--max_steps", "4"], {"ACCELERATE_USE_CPU": "true"})
    checkpointed = ["--max_steps", "8", "--save_strategy", "steps", "--save_steps", "4"]
    zero3 = run(MODES["zero3"], tmp_path / "z3", checkpointed)
    resumed = run(MODES["zero3"], tmp_path / "z3_resumed",
                  [*checkpointed, "--resume_from_checkpoint", str(tmp_path / "z3" / "checkpoint-4")])
    for (step, loss, value_loss), (_, loss3, value_loss3) in zip(ddp, zero3[:4]):
        assert loss3 == pytest.approx(loss, abs=1e-5) and value_loss3 == pytest.approx(value_loss, abs=1e-5), step
    assert ddp[-1][2] < ddp[0][2]  # the value loss falls
    resumed = resumed[-4:]  # the checkpoint brings steps 1-4 of the history along
    assert [s for s, _, _ in resumed] == [5, 6, 7, 8]
    for (step, loss, value_loss), (_, again, value_again) in zip(zero3[4:], resumed):
        assert again == pytest.approx(loss, abs=1e-6) and value_again == pytest.approx(value_loss, abs=1e-6), step


def _two_nodes(tmp_path, out: Path, flags: list[str]) -> float:
    """Two "machines" on this one: two `accelerate launch` commands of one process each, ranks 0 and 1,
    meeting at 127.0.0.1 as a cluster's nodes meet at the head node (a shared filesystem, as on most
    clusters). Returns the wall seconds of the slower node."""
    import time

    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    port, started = str(_free_port()), time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", *MODES["ddp"], "--num_machines", "2",
         "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", port,
         "--num_processes", "2", "--mixed_precision", "no", "--dynamo_backend", "no", str(script),
         str(REPO / "examples/configs/demo.yaml"), "--output_dir", str(out), "--bf16", "false", "--logging_steps",
         "1", "--use_cpu", "false", "--eval_strategy", "no", "--per_device_train_batch_size", "32", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) for rank in (0, 1)]
    try:
        errors = [node.communicate(timeout=900)[1] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for rank, (node, error) in enumerate(zip(nodes, errors)):
        assert node.returncode == 0, f"node {rank} exited {node.returncode}:\n{error[-3000:]}"
    return time.perf_counter() - started


def test_two_nodes_on_one_machine_train_checkpoint_and_resume(tmp_path):
    """`--num_machines 2 --machine_rank {0,1} --main_process_ip 127.0.0.1`: the two nodes train together
    (one pooled log, both ranks agree), checkpoint at step 2, and a run resumed from that checkpoint on two
    nodes again repeats steps 3-4 exactly."""
    checkpointed = ["--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2"]
    _two_nodes(tmp_path, tmp_path / "run", checkpointed)
    _two_nodes(tmp_path, tmp_path / "resumed",
               [*checkpointed, "--resume_from_checkpoint", str(tmp_path / "run" / "checkpoint-2")])
    ranks = [json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world_size"] == ranks[1]["world_size"] == 2  # one job, not two independent ones
    assert ranks[0]["steps"] == ranks[1]["steps"] == 4 and ranks[0]["reward_first"] == ranks[1]["reward_first"]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoint-2").glob("rng_state_*.pth")) == [
        "rng_state_0.pth", "rng_state_1.pth"]  # each node's process saved its own state
    logs = {run: [(h["step"], h["loss"], h["reward/mean"]) for h in
                  json.loads((tmp_path / run / "log_history.json").read_text()) if "reward/mean" in h]
            for run in ("run", "resumed")}
    assert [s for s, _, _ in logs["run"]] == [1, 2, 3, 4]
    assert logs["resumed"][-2:] == logs["run"][-2:]  # steps 3 and 4 again, bit for bit



def test_dynamic_sampling_on_the_partitioned_training_weights(tmp_path):
    """DAPO's dynamic sampling under ZeRO-3 with the HF engine sampling from the partitioned training weights
    (rollout_hf_weights='shared', every generate call gathers with the other process): the two ranks' prompts
    are informative at different rates, so they would refill different numbers of times; every rank refills as
    long as any rank is short instead, and both finish the same steps."""
    out = tmp_path / "dynamic"
    _run(tmp_path, _two_processes(MODES["zero3"]), out,
         ["--max_steps", "3", "--eval_strategy", "no", "--per_device_train_batch_size", "16", "--use_cpu", "false",
          "--rollout_hf_weights", "shared", "--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "4",
          "--dataset_test_split", "null"])
    rank0, rank1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["steps"] == rank1["steps"] == 3
    logs = [h for h in json.loads((out / "log_history.json").read_text()) if "dynamic_sampling/extra_rounds" in h]
    assert logs and any(h["dynamic_sampling/extra_rounds"] > 0 for h in logs)


EXIT_SCRIPT = """
import atexit, sys, tempfile
import torch.distributed as dist
from verl_hf.distributed import close_process_group_at_exit
# registered first, so it runs last (atexit is last in, first out): what the group is once ours has run
atexit.register(lambda: print("initialized at exit:", dist.is_initialized(), flush=True))
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
close_process_group_at_exit()
close_process_group_at_exit()  # registered once
if sys.argv[1] == "fail":
    raise RuntimeError("the run failed")
"""


@pytest.mark.parametrize("ending, destroyed", [("clean", True), ("fail", False)])
def test_the_process_group_is_destroyed_at_a_clean_exit_only(tmp_path, ending, destroyed):
    """A gloo group left to interpreter shutdown sometimes aborts a successful process (SIGABRT, "terminate
    called without an active exception"): VerlTrainer has it destroyed at a clean exit; after an uncaught
    exception it is left alone (a peer may be inside a collective; the launcher ends them)."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    result = subprocess.run([sys.executable, str(script), ending], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == (0 if destroyed else 1), result.stderr[-2000:]
    assert f"initialized at exit: {not destroyed}" in result.stdout, (result.stdout, result.stderr[-2000:])
