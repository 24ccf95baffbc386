#!/usr/bin/env python3
"""The GPU check: what only a GPU machine can show (bf16 speed and memory of the real paths, CUDA graphs, vLLM's
sleep mode and GPU model runner), in sections that each end PASS, FAIL or SKIP with one figure:

  environment       versions, device, bf16; FAIL only if verl_hf cannot import
  grpo_hf           GRPO with VerlTrainer and HF generate on a Qwen2.5-0.5B-shaped random Qwen2 (bf16): s/step,
                    generated tokens/s, peak memory, finite losses
  chunked_logprobs  the chunked LM-head log-probs (algorithms/linear_logprobs.py) against the full logits, at
                    Qwen's vocabulary: values, loss, gradients and each path's peak memory
  fsdp2, zero3      `accelerate launch` of `verl-hf train` with examples/accelerate/fsdp2.yaml / zero3.yaml
  vs_trl            benchmarks/vs_trl.py row a (ours against TRL 1.16, HF generate in both)
  tflops            the update's achieved TFLOP/s (from grpo_hf's run) against a bf16 matmul timed here
  vllm_colocated, vllm_server, partial_rollouts, routing_replay, lora_adapter
                    the vLLM paths: colocated with sleep mode and CUDA graphs, the `verl-hf vllm-serve` server
                    (synchronous, then one step off-policy with partial rollouts), MoE routing replay (R3, GPU
                    only) and a LoRA policy served as an adapter

A section runs in a try/except under its own time limit, the heavy ones in a subprocess, so one failure never
stops the others. The verdict table is printed and written to OUT/verdict.json; the exit status is 1 if a
section FAILED. SKIP means a dependency is genuinely absent (trl, vllm) or the feature needs a GPU; it says which.

    bash scripts/gpu_check.sh [--only SECTION ...] [--out DIR]   # the GPU machine: installs gpu_wheels/ first
    .venv/bin/python scripts/gpu_check.py --cpu --out /tmp/gc     # the CPU mode: tiny sizes, the same sections

Budget: about 8 minutes on one H100 (without vLLM there; each section has its own limit, `Scale.limits`). The
CPU mode is what keeps this script from rotting: tests/test_gpu_check.py runs it in the test suite.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # verl_hf of this checkout; tests/architectures.py (no pytest)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
# The child processes import verl_hf from this checkout too (on the GPU machine nothing installed it).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
# Every run rewards the demo's way (gsm8k 1.0, format 0.1) plus the digits' share of the response at 0.1: a random
# model never earns the demo's rewards, so without a reward its samples vary in, every advantage would be zero,
# the weights would never move, and the engine-versus-trainer checks would compare weights no sync changed.
DEMO_REWARDS = dict(reward_funcs=["gsm8k", "gsm8k_format"], reward_weights=[1.0, 0.1, 0.1])


@dataclass(frozen=True)
class Scale:
    """The sizes of one mode. GPU: a Qwen2.5-0.5B-shaped Qwen2 in bf16 and batches that keep the device busy,
    within about 8 minutes in all on one H100; CPU: the same family tiny, in fp32, as fast as possible."""

    mode: str
    bf16: bool
    model: dict                # Qwen2Config fields besides the vocabulary (= the tokenizer's)
    batch: int                 # completions per optimizer step (per_device_train_batch_size)
    generations: int           # per prompt
    response: int              # max_response_length
    timed_steps: int           # grpo_hf: optimizer steps timed after one warm-up step
    vllm_steps: int
    logits: tuple              # chunked_logprobs: (tokens, vocab, hidden)
    matmul: int                # n of the n x n x n matmul that tflops compares with
    server_start_s: int
    limits: dict = field(default_factory=dict)  # seconds per section


GPU = Scale("gpu", True, dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                              intermediate_size=4864),
            batch=128, generations=8, response=128, timed_steps=3, vllm_steps=4, logits=(4096, 151936, 896),
            matmul=8192, server_start_s=300,
            limits=dict(environment=60, grpo_hf=150, chunked_logprobs=60, fsdp2=100, zero3=130, vs_trl=150,
                        tflops=60, vllm_colocated=240, vllm_server=300, partial_rollouts=180, routing_replay=150,
                        lora_adapter=240))
CPU = Scale("cpu", False, dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                               intermediate_size=256),
            batch=16, generations=4, response=16, timed_steps=2, vllm_steps=2, logits=(1024, 4096, 128),
            matmul=1024, server_start_s=600,  # a start took over 2 minutes here beside a busy test worker
            limits=dict(environment=180, grpo_hf=300, chunked_logprobs=120, fsdp2=300, zero3=400, vs_trl=900,
                        tflops=300, vllm_colocated=400, vllm_server=900, partial_rollouts=400, routing_replay=60,
                        lora_adapter=400))


# ----------------------------------------------------------------------------- the run: sections and verdict
SECTIONS: dict = {}  # name -> (function, needs the shared vLLM server)


def section(name: str, server: bool = False):
    def register(fn):
        SECTIONS[name] = (fn, server)
        return fn
    return register


class Check:
    """What the sections share: the mode's sizes, the output folder, and what one section builds for others (the
    random model, the import probe, grpo_hf's run, the vLLM server)."""

    def __init__(self, scale: Scale, out: Path):
        self.scale, self.out, self.cache, self.details = scale, out, {}, {}
        self.deadline, self.server = math.inf, None
        self.budget_s, self.budget_end = math.inf, math.inf  # the whole run's seconds (--budget)

    @property
    def cpu(self) -> bool:
        return self.scale.mode == "cpu"

    def remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 1.0)

    def once(self, key: str, build):
        """`build()` once; a failure is remembered too (a later section that needs it fails at once, naming it)."""
        if key not in self.cache:
            try:
                self.cache[key] = (None, build())
            except Exception as error:  # noqa: BLE001
                self.cache[key] = (error, None)
        error, value = self.cache[key]
        if error is not None:
            raise RuntimeError(f"{key} failed earlier: {type(error).__name__}: {error}") from error
        return value

    def missing(self, package: str) -> str | None:
        """Why `package` is absent here (None: it imports). Installed but failing to import (a shipped wheel that
        does not fit the machine's stack) raises: the section FAILs instead of skipping."""
        found = self.once("probe", lambda: probe(self))["packages"][package]
        if "version" in found:
            return None
        if importlib.util.find_spec(package) is not None:
            raise RuntimeError(f"{package} is installed but does not import: {found['error']}")
        return found["error"]


def run_sections(check: Check, names: list[str]) -> list[dict]:
    rows = []
    for i, name in enumerate(names):
        fn, _ = SECTIONS[name]
        started = time.monotonic()
        limit = int(min(check.scale.limits[name], check.budget_end - started))
        check.deadline = started + limit
        signal.alarm(limit + 30)  # a backstop for in-process work; subprocesses get check.remaining()
        try:
            if limit < 10:
                raise TimeoutError(f"no time left in --budget {check.budget_s:.0f} s")
            status, figure = fn(check)
        except Exception as error:  # noqa: BLE001  (a failed section is reported and the next one runs)
            status, figure = FAIL, f"{type(error).__name__}: {error}"
            (check.out / f"{name}.traceback.txt").write_text(traceback.format_exc())
        finally:
            signal.alarm(0)
            free_gpu_memory()
        if check.server and not any(SECTIONS[later][1] for later in names[i + 1:]):
            stop_server(check)  # no later section needs it: free its memory and cores
        row = dict(section=name, status=status, figure=str(figure), seconds=round(time.monotonic() - started, 1))
        if name in check.details:
            row["details"] = check.details[name]
        rows.append(row)
        print(f"[{status}] {name} ({row['seconds']:.0f} s): {figure}", flush=True)
        write_verdict(rows, check, partial=True)  # a call killed later still brings back the sections done
    return rows


def free_gpu_memory() -> None:
    """Return what an in-process section cached on the GPU, so that the next section's processes get it."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def on_alarm(signum, frame):
    raise TimeoutError("the section ran past its time limit (Scale.limits in scripts/gpu_check.py)")


def verdict(rows: list[dict], check: Check, seconds: float) -> int:
    width = max(len(r["section"]) for r in rows)
    print(f"\n{'section':<{width}} | status | {'seconds':>7} | figure")
    for r in rows:
        print(f"{r['section']:<{width}} | {r['status']:<6} | {r['seconds']:>7.1f} | {r['figure']}")
    failed = [r["section"] for r in rows if r["status"] == FAIL]
    print(f"\n{check.scale.mode.upper()} mode, {seconds:.0f} s: " + (f"FAILED: {', '.join(failed)}" if failed else
                                                                   "no section failed"))
    write_verdict(rows, check, seconds=seconds)
    return 1 if failed else 0


def write_verdict(rows: list[dict], check: Check, seconds: float | None = None, partial: bool = False) -> None:
    (check.out / "verdict.json").write_text(json.dumps(dict(mode=check.scale.mode, partial=partial,
                                                            seconds=None if seconds is None else round(seconds, 1),
                                                            sections=rows), indent=1))


# ----------------------------------------------------------------------------- subprocesses
def run_command(check: Check, cmd: list[str], log: Path, env: dict | None = None) -> int:
    """Run `cmd` (stdout and stderr to `log`) within the section's time left; on time out or any error its whole
    process group is ended (accelerate launch and vLLM start children of their own)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                env={**os.environ, **(env or {})})
    try:
        return proc.wait(timeout=check.remaining())
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{' '.join(cmd[:6])} ... ran past the section's limit (log: {log})") from None
    finally:
        end_group(proc)


def end_group(proc: subprocess.Popen) -> None:
    """End the command's whole process group, also what outlived its leader (a launcher's workers, vLLM's engine
    core): SIGTERM, a grace period, then SIGKILL always. The section's alarm is off meanwhile, so that it cannot
    interrupt the cleanup."""
    signal.alarm(0)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(0.5)  # children of an exited leader get a moment to end on SIGTERM
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def last_error(log: Path) -> str:
    """The last line of `log` that names an error, for the verdict table (the log has the rest)."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    named = [ln.strip() for ln in lines if re.search(r"(Error|Exception|error:|Traceback)", ln)]
    return (named or lines or ["no output"])[-1][:300] + f" (log: {log})"


def worker(check: Check, name: str, spec: dict) -> dict:
    """A training run of `spec` in a process of its own (see `train_worker`); its result."""
    folder = check.out / name
    folder.mkdir(parents=True, exist_ok=True)
    spec = dict(spec, result=str(folder / "result.json"))
    spec["config"] = dict(spec["config"], output_dir=str(folder / "run"))
    (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    code = run_command(check, [sys.executable, __file__, "--worker", str(folder / "spec.json")], folder / "log.txt")
    if code != 0 or not (folder / "result.json").exists():
        raise RuntimeError(f"the training worker exited {code}: {last_error(folder / 'log.txt')}")
    return json.loads((folder / "result.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- shared builds
def model_path(check: Check) -> str:
    return check.once("model", lambda: build_qwen2(check))


def build_qwen2(check: Check) -> str:
    """The Qwen2 of the mode's sizes (heads of 64, tied embeddings), random weights (seed 0), saved with the tests'
    byte-level BPE tokenizer (ChatML); the vocabulary is the tokenizer's."""
    import torch
    from architectures import build_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # "Writing model shards" would land among the section lines

    path = check.out / "models" / "qwen2"
    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=1024, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
                         **check.scale.model)
    torch.manual_seed(0)
    with torch.device("cpu" if check.cpu else "cuda"):  # a 0.5B model initialises in seconds on the GPU
        model = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16 if check.scale.bf16 else torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    return str(path)


def train_config(check: Check, steps: int, **fields) -> dict:
    """VerlConfig fields of a check run: the demo's GRPO (no KL, constant lr) at the mode's sizes."""
    s = check.scale
    base = dict(per_device_train_batch_size=s.batch, num_generations=s.generations, max_prompt_length=32,
                max_response_length=s.response, learning_rate=1e-4, lr_scheduler_type="constant", max_steps=steps,
                logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
                seed=0, use_cpu=check.cpu, bf16=s.bf16, **DEMO_REWARDS)
    return {**base, **fields}


def probe(check: Check) -> dict:
    """Import each package in a process of its own (a broken install cannot take this one down): versions or
    the import error, the device, bf16, and the shipped wheels' needs that the installed versions do not meet."""
    log = check.out / "environment.log"
    code = run_command(check, [sys.executable, __file__, "--probe", str(check.out / "probe.json")], log)
    if code != 0:
        raise RuntimeError(f"the import probe exited {code}: {last_error(log)}")
    return json.loads((check.out / "probe.json").read_text())


def grpo_hf_run(check: Check) -> dict:
    return check.once("grpo_hf", lambda: worker(check, "grpo_hf", dict(
        model=model_path(check), config=train_config(check, 1 + check.scale.timed_steps, rollout_engine="hf"))))


# ----------------------------------------------------------------------------- figures from a run's log
def steps_of(result: dict) -> list[dict]:
    """The per-step training logs (logging_steps=1), in order."""
    return [h for h in result["log_history"] if "loss" in h and "step" in h]


def finite_steps(result: dict, expected: int) -> str | None:
    """Why the run does not show `expected` optimizer steps with finite losses (None: it does)."""
    losses = [h["loss"] for h in steps_of(result)]
    if len(losses) != expected:
        return f"{len(losses)} logged steps, expected {expected}"
    if not all(math.isfinite(x) for x in losses):
        return f"non-finite losses {losses}"
    return None


def mean_of(logs: list[dict], key: str) -> float:
    values = [h[key] for h in logs if key in h]
    return sum(values) / len(values) if values else float("nan")


def max_of(logs: list[dict], key: str) -> float:
    return max((h[key] for h in logs if key in h), default=float("nan"))


def seconds_per_step(result: dict) -> float:
    """Wall seconds per optimizer step after the first (warm-up: allocator, kernels, caches)."""
    ends = result["step_ends"]
    return (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else float("nan")


def memory(result: dict) -> str:
    gib = result["peak_memory_bytes"] / 2**30
    return f"peak {'GPU memory' if result['device'] == 'cuda' else 'RSS'} {gib:.2f} GiB"


def gap_bound(check: Check, moe: bool = False) -> float:
    """The largest engine-versus-trainer log-prob gap of one token that rounding explains (tests/architectures.py:
    1e-4 in fp32; in bf16 5e-2 for dense models, 0.2 for a mixture of experts, where a near-tie routes a token to
    another expert). Measured on CPUs; a GPU's kernels round at other places but by the same bf16 steps."""
    from architectures import BF16_MAX_LOGPROB_BOUND, BF16_MOE_MAX_LOGPROB_BOUND

    if not check.scale.bf16:
        return 1e-4
    return BF16_MOE_MAX_LOGPROB_BOUND if moe else BF16_MAX_LOGPROB_BOUND


# ----------------------------------------------------------------------------- a. environment
@section("environment")
def environment(check: Check):
    found = check.once("probe", lambda: probe(check))
    check.details["environment"] = found
    versions = ", ".join(f"{name} {info.get('version', 'absent')}" for name, info in found["packages"].items())
    figure = f"{versions}; {found['device']}; bf16 {'fast' if found['bf16'] else 'not fast'}"
    if found["unmet"]:
        figure += "; UNMET: " + "; ".join(found["unmet"])
    if "version" not in found["packages"]["verl_hf"]:
        return FAIL, f"verl_hf does not import: {found['packages']['verl_hf']['error']}"
    return PASS, figure


# ----------------------------------------------------------------------------- b. grpo_hf
@section("grpo_hf")
def grpo_hf(check: Check):
    result = grpo_hf_run(check)
    logs = steps_of(result)[1:]  # after the warm-up step
    why = finite_steps(result, 1 + check.scale.timed_steps)
    figure = (f"{result['params'] / 1e6:.1f}M params, {seconds_per_step(result):.2f} s/step, "
              f"{mean_of(logs, 'rollout/tokens_per_s'):.0f} generated tokens/s, {memory(result)}, "
              f"losses {[round(h['loss'], 4) for h in steps_of(result)]}")
    return (FAIL, f"{why}; {figure}") if why else (PASS, figure)


# ----------------------------------------------------------------------------- c. chunked_logprobs
# bf16: a logit of size ~1 is rounded to 2^-9 relative, and the chunked and the whole matmul may accumulate in other
# orders, so single log-probs differ by about 1e-2 at worst; the loss averages those errors (relative 1e-2 leaves
# room) and the gradients keep their direction (cosine 0.999: a wrong row or a missing 1/T would fall far below).
# fp32 rounds 2^16 times finer: 1e-4 throughout.
BOUNDS = {True: dict(logprob=5e-2, loss=1e-2, cosine=0.999), False: dict(logprob=1e-4, loss=1e-4, cosine=1 - 1e-4)}


@section("chunked_logprobs")
def chunked_logprobs(check: Check):
    import torch

    tokens, vocab, hidden_size = check.scale.logits
    device, dtype = ("cpu", torch.float32) if check.cpu else ("cuda", torch.bfloat16)
    g = torch.Generator(device).manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, device=device, generator=g).to(dtype)
    weight = (torch.randn(vocab, hidden_size, device=device, generator=g) * 0.02).to(dtype)  # Qwen's init scale
    targets = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    advantages = torch.randn(tokens, device=device, generator=g)
    full, chunked = (logprob_path(fn, hidden, weight, targets, advantages) for fn in (full_logits, chunked_head))
    bound = BOUNDS[check.scale.bf16]
    logprob_gap = (full["logprobs"] - chunked["logprobs"]).abs().max().item()
    loss_error = abs(full["loss"] - chunked["loss"]) / abs(full["loss"])
    cosines = [cosine(full[k], chunked[k]) for k in ("grad_hidden", "grad_weight")]
    ok = logprob_gap <= bound["logprob"] and loss_error <= bound["loss"] and min(cosines) >= bound["cosine"]
    peaks = "" if check.cpu else (f"; peak memory full {full['peak'] / 2**30:.2f} GiB, chunked "
                                  f"{chunked['peak'] / 2**30:.2f} GiB")
    figure = (f"{tokens} tokens x vocab {vocab} ({str(dtype).split('.')[-1]}): max |logprob gap| {logprob_gap:.1e} "
              f"(bound {bound['logprob']:.0e}), loss rel. error {loss_error:.1e} (bound {bound['loss']:.0e}), grad "
              f"cosine hidden {cosines[0]:.6f} weight {cosines[1]:.6f} (bound {bound['cosine']}){peaks}")
    return (PASS if ok else FAIL), figure


def cosine(a, b) -> float:
    import torch

    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), 0).item()


def full_logits(hidden, weight, targets):
    import torch

    logits = (hidden @ weight.t()).float()
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def chunked_head(hidden, weight, targets):
    from verl_hf.algorithms.linear_logprobs import linear_logprobs

    return linear_logprobs(hidden, weight, targets, with_entropy=False)[0]


def logprob_path(fn, hidden, weight, targets, advantages) -> dict:
    """Log-probs, the policy-gradient surrogate -(logprobs * A).mean(), its gradients, and the extra peak memory."""
    import torch

    hidden, weight = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    cuda = hidden.is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    logprobs = fn(hidden, weight, targets)
    loss = -(logprobs * advantages).mean()
    loss.backward()
    peak = torch.cuda.max_memory_allocated() - base if cuda else 0
    return dict(logprobs=logprobs.detach(), loss=loss.item(), grad_hidden=hidden.grad, grad_weight=weight.grad,
                peak=peak)


# ----------------------------------------------------------------------------- d. fsdp2 and zero3
@section("fsdp2")
def fsdp2(check: Check):
    return launched(check, "fsdp2")


@section("zero3")
def zero3(check: Check):
    why = check.missing("deepspeed")
    if why:
        return SKIP, f"deepspeed is not importable ({why})"
    return launched(check, "zero3")


LAUNCH_STEPS = 2


def launched(check: Check, name: str):
    """`verl-hf train examples/configs/demo.yaml` on the check's model under `accelerate launch` with the ready-made
    examples/accelerate/NAME.yaml, one process: CPU as the tests run it (gloo, fp32), GPU in bf16."""
    folder = check.out / name
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "examples" / "accelerate" / f"{name}.yaml"), "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "bf16" if check.scale.bf16 else "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), "-m", "verl_hf.cli", "train", "examples/configs/demo.yaml",
           "--model_name_or_path", model_path(check), "--output_dir", str(folder / "run"),
           "--max_steps", str(LAUNCH_STEPS), "--logging_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
           "--dataset_test_split", "null",  # no evaluation before and after: only the training steps count
           "--per_device_train_batch_size", str(check.scale.batch), "--num_generations", str(check.scale.generations),
           "--max_response_length", str(check.scale.response), "--use_cpu", "false",
           "--bf16", str(check.scale.bf16).lower(),
           # the demo's rewards never reward a random model: the digits' share makes the update move (DEMO_REWARDS)
           "--reward_funcs", "gsm8k", "gsm8k_format", "tests/architectures.py:digit_share",
           "--reward_weights", "1.0", "0.1", "0.1"]
    code = run_command(check, cmd, folder / "log.txt")
    history = folder / "run" / "log_history.json"
    if code != 0 or not history.exists():
        return FAIL, f"exit {code}: {last_error(folder / 'log.txt')}"
    result = dict(log_history=json.loads(history.read_text()))
    summary = json.loads((folder / "run" / "summary.json").read_text())
    why = finite_steps(result, LAUNCH_STEPS)
    if why is None and not any(h.get("grad_norm", 0) > 0 for h in steps_of(result)):
        why = f"no step moved the weights (grad_norm {[h.get('grad_norm') for h in steps_of(result)]})"
    figure = (f"{LAUNCH_STEPS} steps, {summary['seconds_per_step']:.2f} s/step, losses "
              f"{[round(h['loss'], 4) for h in steps_of(result)]}, policy shard {summary['policy_params_mb']:.1f} MB")
    return (FAIL, f"{why}; {figure}") if why else (PASS, figure)


# ----------------------------------------------------------------------------- e. vs_trl
@section("vs_trl")
def vs_trl(check: Check):
    why = check.missing("trl")
    if why:
        return SKIP, f"trl is not importable ({why}); gpu_wheels/ carries it (bash scripts/gpu_wheels.sh)"
    log = check.out / "vs_trl.log"
    cmd = [sys.executable, "benchmarks/vs_trl.py", "--rows", "a", "--pairs", "1", "--steps", "2",
           "--cache_dir", str(check.out / "vs_trl_cache"), *([] if check.cpu else ["--model", "qwen05b"])]
    code = run_command(check, cmd, log)
    text = log.read_text(errors="replace")
    ratio = re.search(r"ours/TRL \(medians\): .*s/step ([0-9.]+)x", text)
    medians = re.findall(r"^(trl|verl) median\s+([0-9.]+)", text, re.M)
    if code != 0 or not ratio:
        return FAIL, f"exit {code}: {last_error(log)}"
    seconds = ", ".join(f"{side} {float(s):.3f} s/step" for side, s in medians)
    return PASS, f"row a{'' if check.cpu else ' (qwen05b)'}: ours/TRL s/step {ratio.group(1)}x ({seconds})"


# ----------------------------------------------------------------------------- f. tflops
@section("tflops")
def tflops(check: Check):
    result = grpo_hf_run(check)
    logs = steps_of(result)[1:]
    update_s = mean_of(logs, "time/update")  # forward, loss and backward of the step's one micro-batch
    tokens = check.scale.batch * (result["prompt_tokens_mean"] + mean_of(logs, "response_length/mean"))
    achieved = 6 * result["params"] * tokens / update_s / 1e12
    peak, dtype = matmul_tflops(check)
    figure = (f"update {achieved:.3f} TFLOP/s = 6 x {result['params'] / 1e6:.1f}M params x {tokens:.0f} tokens "
              f"(prompt + response, per step) / {update_s:.3f} s time/update; {dtype} {check.scale.matmul}^3 matmul "
              f"{peak:.3f} TFLOP/s; ratio {achieved / peak:.1%}")
    return (PASS if math.isfinite(achieved / peak) else FAIL), figure


def matmul_tflops(check: Check) -> tuple[float, str]:
    """2 n^3 FLOP per n x n x n matmul, the best of several timed after a warm-up (cuda events on the GPU)."""
    import torch

    n = check.scale.matmul
    dtype = torch.float32 if check.cpu else torch.bfloat16
    device = "cpu" if check.cpu else "cuda"
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    times = []
    for _ in range(6):
        if check.cpu:
            started = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - started)
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                a @ b
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / 10)
    return 2 * n**3 / min(times[1:]) / 1e12, str(dtype).split(".")[-1]


# ----------------------------------------------------------------------------- g. vLLM
def vllm_missing(check: Check) -> tuple[str, str] | None:
    why = check.missing("vllm")
    return (SKIP, f"vllm is not importable ({why})") if why else None


def vllm_figures(check: Check, result: dict, steps: int, moe: bool = False) -> tuple[str, str, dict]:
    """(status, figure, logs): steps with finite losses and every logged engine-versus-trainer gap within the
    rounding bound; rollout tokens/s, sync seconds and the gap."""
    logs = steps_of(result)
    bound = gap_bound(check, moe)
    gap = max_of(logs, "rollout_is/logprob_gap_max")
    why = finite_steps(result, steps) or (None if gap <= bound else f"log-prob gap {gap:.1e} over {bound:.0e}")
    figure = (f"{mean_of(logs[1:] or logs, 'rollout/tokens_per_s'):.0f} rollout tokens/s, sync "
              f"{mean_of(logs, 'sync/seconds'):.3f} s, logprob_gap_max {gap:.1e} (bound {bound:.0e}), {memory(result)}")
    return (FAIL if why else PASS), (f"{why}; {figure}" if why else figure), logs


@section("vllm_colocated")
def vllm_colocated(check: Check):
    if skip := vllm_missing(check):
        return skip
    # GPU: sleep mode (the update gets the engine's memory) and CUDA graphs (vllm_enforce_eager left at None)
    engine = dict(vllm_sleep_level=1, vllm_gpu_memory_utilization=0.3) if not check.cpu else {}
    result = worker(check, "vllm_colocated", dict(model=model_path(check), config=train_config(
        check, check.scale.vllm_steps, rollout_engine="vllm", rollout_is="token", **engine)))
    status, figure, _ = vllm_figures(check, result, check.scale.vllm_steps)
    return status, figure


@section("lora_adapter")
def lora_adapter(check: Check):
    if skip := vllm_missing(check):
        return skip
    lora = dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    result = worker(check, "lora_adapter", dict(model=model_path(check), lora=lora, config=train_config(
        check, check.scale.vllm_steps, rollout_engine="vllm", rollout_is="token", vllm_lora="adapter",
        learning_rate=1e-3)))
    status, figure, logs = vllm_figures(check, result, check.scale.vllm_steps)
    syncs = [h for h in logs if "sync/base_tensors" in h]
    if len(syncs) < 2 or any(h["sync/base_tensors"] for h in syncs[1:]):  # after the first, the adapter alone
        status, figure = FAIL, f"base tensors per sync {[h.get('sync/base_tensors') for h in syncs]}; {figure}"
    sizes = [h.get("sync/gigabytes", float("nan")) * 1e3 for h in syncs]
    return status, f"sync MB first {sizes[0]:.2f}, then {max(sizes[1:] or [0]):.3f}; {figure}" if sizes else figure


def start_server(check: Check) -> str:
    """One `verl-hf vllm-serve` for the server sections, on the check's model. GPU: the same device as the trainer,
    so CUDA IPC (one GPU cannot host both ends of an NCCL group; README); with two GPUs the server takes the
    second and NCCL (packed)."""
    import torch

    port, log = free_port(), check.out / "server.log"
    cmd = [sys.executable, "-m", "verl_hf.cli", "vllm-serve", model_path(check), "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "256"]
    env = {}
    if check.cpu:
        cmd += ["--dtype", "float32"]  # as the trainer: exact log-probs
    elif torch.cuda.device_count() > 1:
        cmd += ["--transfer", "nccl", "--gpu-memory-utilization", "0.5"]
        env["CUDA_VISIBLE_DEVICES"] = "1"
    else:
        cmd += ["--transfer", "ipc", "--gpu-memory-utilization", "0.3"]
    with open(log, "w") as out:
        check.server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                        env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    deadline = min(time.monotonic() + check.scale.server_start_s, check.deadline)
    while time.monotonic() < deadline:
        if check.server.poll() is not None:
            raise RuntimeError(f"the vLLM server exited {check.server.returncode}: {last_error(log)}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return url
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"the vLLM server did not answer /health in time (log: {log})")


def server_url(check: Check) -> str:
    """The shared server's URL; a start that failed fails the later server sections at once, with its reason."""
    def start():
        try:
            return start_server(check)
        except Exception as error:  # noqa: BLE001  (kept for the next section that needs the server)
            return error

    url = check.once("server", start)
    if isinstance(url, Exception):
        raise RuntimeError(f"the shared vLLM server did not start: {url}")
    return url


def stop_server(check: Check) -> None:
    if check.server is not None:
        end_group(check.server)
        check.server = None
        check.cache.pop("server", None)


@section("vllm_server", server=True)
def vllm_server(check: Check):
    if skip := vllm_missing(check):
        return skip
    url = server_url(check)
    result = worker(check, "vllm_server", dict(model=model_path(check), config=train_config(
        check, check.scale.vllm_steps, rollout_engine="vllm_server", vllm_server_url=url, rollout_is="token")))
    status, figure, _ = vllm_figures(check, result, check.scale.vllm_steps)
    return status, figure


@section("partial_rollouts", server=True)
def partial_rollouts(check: Check):
    """One step off-policy (max_staleness=1): the server samples the next round while the trainer updates, and
    pushes land inside generations (partial rollouts). The gap is a staleness here, not rounding: not bounded."""
    if skip := vllm_missing(check):
        return skip
    url = server_url(check)
    steps = check.scale.vllm_steps + 1
    result = worker(check, "partial_rollouts", dict(model=model_path(check), config=train_config(
        check, steps, rollout_engine="vllm_server", vllm_server_url=url, rollout_is="token", max_staleness=1,
        partial_rollouts=True)))
    logs = steps_of(result)
    staleness = max_of(logs, "async/staleness_max")
    why = finite_steps(result, steps) or (None if staleness <= 1 else f"staleness {staleness} over the bound 1")
    figure = (f"{seconds_per_step(result):.2f} s/step, staleness max {staleness:.0f} (bound 1) mean "
              f"{mean_of(logs, 'async/staleness_mean'):.2f}, partial_frac {mean_of(logs, 'async/partial_frac'):.2f}, "
              f"trainer wait {mean_of(logs, 'async/trainer_wait_s'):.2f} s, mismatch_k1 "
              f"{mean_of(logs, 'rollout_is/mismatch_k1'):.1e}")
    return (FAIL, f"{why}; {figure}") if why else (PASS, figure)


@section("routing_replay")
def routing_replay(check: Check):
    """Rollout routing replay (R3) through colocated vLLM on the tests' tiny Qwen3-MoE: the experts vLLM routed each
    token to, replayed in training. vLLM captures routes only in its V2 GPU model runner (it needs Triton)."""
    if check.cpu:
        return SKIP, "GPU only: vLLM captures routes only with its V2 model runner, which needs Triton"
    if skip := vllm_missing(check):
        return skip
    from architectures import build, build_tokenizer

    model = check.once("moe", lambda: build("qwen3_moe", check.out / "models", build_tokenizer()))
    result = worker(check, "routing_replay", dict(model=model, config=train_config(
        check, 2, rollout_engine="vllm", routing_replay=True, rollout_is="token", learning_rate=1e-3)))
    status, figure, logs = vllm_figures(check, result, 2, moe=True)
    agreement = [h["moe/replay_agreement"] for h in logs if "moe/replay_agreement" in h]
    # Misaligned routes (a position or a layer off) would agree with the trainer's own router far less often.
    if not agreement or min(agreement) <= 0.9:
        status = FAIL
    return status, f"replay agreement {agreement} (bound > 0.9); {figure}"


# ----------------------------------------------------------------------------- the processes of their own
def train_worker(spec_path: str) -> None:
    """Train as the spec says (model, VerlConfig fields, an optional LoRA) on the demo task, in this process, and
    write the log history, the step end times, the peak memory while it ran, and the counts the figures need."""
    import resource

    import torch
    from architectures import digit_share
    from transformers import TrainerCallback

    from verl_hf import VerlConfig, VerlTrainer
    from verl_hf.demo.task import demo_splits

    spec = json.loads(Path(spec_path).read_text())
    ends = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            ends.append(time.perf_counter())

    lora = None
    if spec.get("lora"):
        from peft import LoraConfig

        lora = LoraConfig(task_type="CAUSAL_LM", **spec["lora"])
    train = demo_splits(seed=0, num_train=512, num_test=10, num_dev=10)[0].remove_columns("completion")
    trainer = VerlTrainer(model=spec["model"], args=VerlConfig(**spec["config"]), train_dataset=train,
                          reward_funcs=[digit_share], peft_config=lora, callbacks=[StepClock()])
    trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    cuda = torch.cuda.is_available()
    prompts = [len(trainer.train_dataset[i]["prompt_ids"]) for i in range(min(256, len(trainer.train_dataset)))]
    result = dict(log_history=trainer.state.log_history, step_ends=ends[1:],
                  params=sum({p.data_ptr(): p.numel() for p in model.parameters()}.values()),  # tied: once
                  prompt_tokens_mean=sum(prompts) / len(prompts), device="cuda" if cuda else "cpu",
                  peak_memory_bytes=torch.cuda.max_memory_allocated() if cuda else
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: kB
    Path(spec["result"]).write_text(json.dumps(result))


PROBED = ("torch", "transformers", "accelerate", "peft", "datasets", "deepspeed", "evaluate", "trl", "vllm", "verl_hf")
SHIPPED = ("datasets", "evaluate", "trl", "deepspeed")  # scripts/gpu_wheels.sh: their needs are checked here


def probe_worker(path: str) -> None:
    import importlib
    import importlib.metadata as metadata

    packages = {}
    for name in PROBED:
        try:
            module = importlib.import_module(name)
            packages[name] = dict(version=getattr(module, "__version__", None) or metadata.version(name))
        except Exception as error:  # noqa: BLE001  (any failure to import is what this reports)
            first_line = (str(error).splitlines() or [""])[0]
            packages[name] = dict(error=f"{type(error).__name__}: {first_line}"[:300])
    import torch

    from verl_hf.config.machine import bf16_is_fast

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = (f"{props.name} ({props.total_memory / 2**30:.0f} GiB) x{torch.cuda.device_count()}, "
                  f"CUDA {torch.version.cuda}")
    else:
        device = f"CPU: {cpu_name()} ({os.cpu_count()} cores)"
    Path(path).write_text(json.dumps(dict(packages=packages, device=device, bf16=bf16_is_fast(),
                                          unmet=unmet_needs([n for n in SHIPPED if "version" in packages[n]]))))


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def unmet_needs(names: list[str]) -> list[str]:
    """The needs of `names` that the installed versions do not meet: wheels installed with --no-deps beside what
    the GPU machine has (a datasets that wants a newer huggingface_hub shows here, not as an odd ImportError)."""
    import importlib.metadata as metadata

    from packaging.requirements import Requirement

    unmet = []
    for name in names:
        for line in metadata.requires(name) or []:
            need = Requirement(line)
            if need.marker is not None and not need.marker.evaluate({"extra": ""}):
                continue
            try:
                found = metadata.version(need.name)
            except metadata.PackageNotFoundError:
                found = None
            if found is None or not need.specifier.contains(found, prereleases=True):
                unmet.append(f"{name} needs {need}, found {found or 'none'}")
    return unmet


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU mode: tiny sizes, fp32, the same sections")
    parser.add_argument("--out", default="/tmp/verl_hf_gpu_check", help="folder for logs, runs and verdict.json")
    parser.add_argument("--only", nargs="+", metavar="SECTION", help=f"run these sections only: {', '.join(SECTIONS)}")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run (default: 480 in GPU mode, to end inside a 10-minute device "
                             "call with the wheels' install; none in CPU mode); each section's limit is cut to what "
                             "is left, and a section with no time left FAILs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a spec.json: one training run (train_worker)
    parser.add_argument("--probe", help=argparse.SUPPRESS)   # a result path: the import probe (probe_worker)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only or ()) - set(SECTIONS))
    if unknown:
        parser.error(f"--only {' '.join(unknown)}: no such section; the sections are {', '.join(SECTIONS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return train_worker(args.worker) or 0
    if args.probe:
        return probe_worker(args.probe) or 0
    if args.cpu:
        # One thread in this process and its children (set before torch loads): the models are tiny, and threads
        # that wait for a busy core made grpo_hf 12 s a step instead of 0.14 beside a test run (2 cores, measured).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch.cuda.is_available() is False, and this is the GPU check. Run it on the "
                         "GPU machine (bash scripts/gpu_check.sh), or add --cpu for the CPU mode (tiny sizes, same "
                         "sections).")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    check = Check(CPU if args.cpu else GPU, out)
    budget = args.budget if args.budget is not None else (math.inf if args.cpu else 480.0)
    check.budget_s, check.budget_end = budget, time.monotonic() + budget
    names = [name for name in SECTIONS if not args.only or name in args.only]
    signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    print(f"gpu_check: {check.scale.mode.upper()} mode, sections {', '.join(names)}; logs in {out}", flush=True)
    try:
        rows = run_sections(check, names)
    finally:
        stop_server(check)
    return verdict(rows, check, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main())
