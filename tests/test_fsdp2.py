"""Real `accelerate launch` runs under FSDP2 (`fully_shard`): two CPU processes (gloo) with the ready-made
examples/accelerate/fsdp2.yaml, which on a machine without GPUs accelerate alone would run as plain DDP. Every
training run samples from an HF copy fed by the weight sync with `sync_verify` (bitwise against DTensor's own
`full_tensor()`), or from colocated vLLM whose log-probs are compared with the trainer's."""

import json
import textwrap

import pytest
from conftest import run_two_processes
from test_distributed import (LORA_LAYERS_BYTES, MODEL_BYTES, REPO, _reward_model, _run, _two_processes,
                              assert_same_first_step)
from test_sync_zero3 import VERIFIED_SYNCS

FSDP2 = ["--config_file", str(REPO / "examples" / "accelerate" / "fsdp2.yaml")]
HALF_MODEL_MB = MODEL_BYTES / 2 / 2**20  # each of two processes holds half of every weight


SYNC_SCRIPT = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl_hf.demo import WARM_START_DIR
    from verl_hf.rollout import HFCopyEngine
    from verl_hf.sync import WeightSync
    from verl_hf.sync.gather import gather_dtensor

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def sharded(model, layers):
        for layer in layers:
            fully_shard(layer)
        return fully_shard(model)

    # 1. rows that do not split evenly (3 over 2 processes: 2 and 1), in chunks smaller than a row
    torch.manual_seed(0)
    linear = torch.nn.Linear(5, 3)
    expected = linear.weight.detach().clone()
    fully_shard(linear)
    assert linear.weight.to_local().shape[0] == (2 if rank == 0 else 1)
    assert torch.equal(gather_dtensor(linear.weight, chunk_bytes=16), expected)
    only_owner = gather_dtensor(linear.weight, chunk_bytes=16, dst=0)
    assert torch.equal(only_owner, expected) if rank == 0 else only_owner is None

    # the sharded demo model (one unit per decoder layer) and its whole twin, for the shared checks 2 and 3
    tok = AutoTokenizer.from_pretrained(str(WARM_START_DIR))
    full = AutoModelForCausalLM.from_pretrained(str(WARM_START_DIR))
    model = AutoModelForCausalLM.from_pretrained(str(WARM_START_DIR))
    sharded(model, model.model.layers)
    VERIFIED_SYNCS

    # accelerate gives the LM head its own unit (with the norm and the tied embedding): FSDP2 swaps its class,
    # and the chunked LM-head path must still take it
    from verl_hf.roles.scoring import _why_full_logits
    tail = AutoModelForCausalLM.from_pretrained(str(WARM_START_DIR))
    fully_shard([tail.model.norm, tail.model.embed_tokens, tail.lm_head])
    fully_shard(tail)
    assert type(tail.lm_head) is not torch.nn.Linear and _why_full_logits(tail.config, tail.lm_head) is None

    # generate on the sharded policy itself would pair gathers across ranks by forward count: refused
    from verl_hf.roles import Actor
    try:
        Actor(model, tok)
    except ValueError as e:
        assert "FSDP2-sharded policy itself" in str(e) and "HFCopyEngine" in str(e), e
    else:
        raise AssertionError("HF generate on an FSDP2 policy was not refused")

    # 4. LoRA merged on the shards: the engine holds exactly what peft's merge_and_unload computes unsharded
    def with_adapters():
        torch.manual_seed(1)
        config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        return get_peft_model(AutoModelForCausalLM.from_pretrained(str(WARM_START_DIR)), config)
    merged = dict(with_adapters().merge_and_unload().named_parameters())
    lora = with_adapters()
    sharded(lora, lora.base_model.model.model.layers)
    engine = HFCopyEngine.of(lora, tok.pad_token_id, [tok.eos_token_id])
    WeightSync(bucket_mb=0.5, verify=True).sync(lora, engine)
    for name, p in merged.items():
        assert torch.equal(engine.get_weights([name])[name], p), name
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: ALL OK")
''').replace("VERIFIED_SYNCS\n", textwrap.dedent(VERIFIED_SYNCS).lstrip("\n"))


def test_sync_from_fsdp2_shards_two_processes(tmp_path):
    """The DTensor gather layer on real `fully_shard` shards: uneven rows, to every rank or one owner, a
    verified bucketed sync, and LoRA merged on the shards, each bitwise against the unsharded weights."""
    script = tmp_path / "fsdp2_sync.py"
    script.write_text(SYNC_SCRIPT)
    run_two_processes(script)


def _ranks(out) -> tuple[dict, dict, list[dict]]:
    rank0, rank1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    return rank0, rank1, json.loads((out / "log_history.json").read_text())


def test_fsdp2_shards_trains_syncs_and_both_ranks_agree(tmp_path):
    """The full model with a KL reference and a reward model (both sharded like the actor), then LoRA: each
    process holds half of the policy's parameters, every sync is verified bitwise and stays within one bucket,
    the KL starts at zero (the reference is the starting policy on both ranks, although only rank 0 read the
    checkpoint), both ranks report the same pooled metrics and evaluation, and the final model is saved whole."""
    common = ["--max_steps", "4", "--eval_steps", "2", "--per_device_train_batch_size", "32", "--use_cpu", "false",
              "--rollout_hf_weights", "copy", "--sync_verify", "true"]
    runs = {
        "full": [*common, "--kl_coef", "0.01", "--reward_model_path", _reward_model(tmp_path), "--reward_weights",
                 "1.0", "0.1", "0.5"],
        "lora": [*common, "--use_peft", "true", "--lora_r", "8", "--lora_target_modules", "q_proj", "v_proj",
                 "--learning_rate", "1e-3"],
    }
    for name, flags in runs.items():
        _run(tmp_path, _two_processes(FSDP2), tmp_path / name, flags)
        rank0, rank1, history = _ranks(tmp_path / name)
        assert rank0["world_size"] == 2 and rank0["steps"] == rank1["steps"] == 4, name
        for key in ("accuracy_before", "accuracy_after", "reward_first", "reward_last"):
            assert rank0[key] == rank1[key], (name, key)
        assert rank0["accuracy_before"] == 0.315, name  # the warm start on the full held-out set, as under DDP
        train = [h for h in history if "reward/mean" in h]
        informative = [h for h in train if h["advantages/abs_mean"] > 0]  # a round whose groups all tie has none
        assert len(train) == 4 and informative and all(h["grad_norm"] > 0 for h in informative), name
        pushed = [round(h["sync/gigabytes"] * 1e9) for h in train]  # LoRA: every weight once, then adapted layers
        assert pushed[1:] == [MODEL_BYTES if name == "full" else LORA_LAYERS_BYTES] * 3, (name, pushed)
        # the first log averages the evaluation's full sync before it with the step's (LoRA: the layers only)
        assert (LORA_LAYERS_BYTES if name == "lora" else MODEL_BYTES) <= pushed[0] <= MODEL_BYTES, (name, pushed)
        assert all(h["sync/peak_extra_mb"] < 64 for h in train), name
    full, lora = _ranks(tmp_path / "full")[0], _ranks(tmp_path / "lora")[0]
    assert full["policy_params_mb"] == pytest.approx(HALF_MODEL_MB, abs=1e-3)  # DDP: the whole model per process
    assert HALF_MODEL_MB < lora["policy_params_mb"] < HALF_MODEL_MB * 1.05  # plus half of the small adapters
    kl = [h["kl"] for h in _ranks(tmp_path / "full")[2] if "kl" in h]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 1e-4, kl
    assert (tmp_path / "full" / "model.safetensors").exists() and (tmp_path / "lora" / "adapter_model.safetensors").exists()


def test_one_process_and_two_fsdp2_processes_take_the_same_first_step(tmp_path):
    """Invariance, as for ZeRO-3 (tests/test_distributed.py): the same 64-completion round on one process, or
    over two FSDP2 processes (32 each), gives the same first-step loss and the same updated weights within the
    same tolerances (float summation order: batch shapes, the reduce-scatter); the final save is whole."""
    assert_same_first_step(tmp_path, _two_processes(FSDP2))


def _critic_log(out) -> list[tuple[int, float, float]]:
    history = json.loads((out / "log_history.json").read_text())
    return [(h["step"], h["loss"], h["critic/value_loss"]) for h in history if "critic/value_loss" in h]


def test_ppo_critic_under_fsdp2_learns_and_resumes_exactly(tmp_path):
    """PPO's critic sharded like the actor with its own optimizer (FSDP2 averages its gradients): the value loss
    falls, and a run resumed from the step-4 checkpoint (the actor's and optimizer's shards, the critic gathered
    whole, the KL controller, the round in progress) repeats steps 5-8 exactly."""
    flags = ["--max_steps", "8", "--save_strategy", "steps", "--save_steps", "4", "--use_cpu", "false",
             "--eval_strategy", "no"]
    _run(tmp_path, _two_processes(FSDP2), tmp_path / "run", flags, config="ppo.yaml")
    _run(tmp_path, _two_processes(FSDP2), tmp_path / "resumed",
         [*flags, "--resume_from_checkpoint", str(tmp_path / "run" / "checkpoint-4")], config="ppo.yaml")
    first, resumed = _critic_log(tmp_path / "run"), _critic_log(tmp_path / "resumed")[-4:]
    assert [s for s, _, _ in first] == list(range(1, 9)) and first[-1][2] < first[0][2]
    assert (tmp_path / "run" / "checkpoint-4" / "pytorch_model_fsdp_0").is_dir()  # the sharded checkpoint
    assert [s for s, _, _ in resumed] == [5, 6, 7, 8]
    for (step, loss, value_loss), (_, again, value_again) in zip(first[4:], resumed):
        assert again == pytest.approx(loss, abs=1e-6) and value_again == pytest.approx(value_loss, abs=1e-6), step


def test_colocated_vllm_under_fsdp2_samples_with_the_trainers_log_probs(tmp_path):
    """Colocated vLLM (one engine per process) fed from the DTensor shards: after every sync the engine's
    sampling log-probs equal the trainer's forward on the same tokens within 1e-4 (fp32), at every step."""
    out = tmp_path / "vllm"
    _run(tmp_path, _two_processes(FSDP2), out,
         ["--max_steps", "2", "--eval_steps", "2", "--per_device_train_batch_size", "32", "--use_cpu", "false",
          "--rollout_engine", "vllm", "--rollout_is", "token"])
    rank0, rank1, history = _ranks(out)
    assert rank0["accuracy_before"] == rank1["accuracy_before"] == 0.315  # greedy, as the HF engine
    steps = [h for h in history if "rollout_is/logprob_gap_max" in h]
    assert len(steps) == 2 and all(h["rollout_is/logprob_gap_max"] < 1e-4 for h in steps), steps
    assert all(h["sync/gigabytes"] == MODEL_BYTES / 1e9 for h in steps)


FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}


@pytest.mark.parametrize("env, overrides, message", [
    ({**FSDP_ENV, "FSDP_VERSION": "1"}, {}, r"FSDP version 1 \(FSDP1\) is not supported.*fsdp_version: 2"),
    ({}, {"fsdp": "full_shard", "fsdp_config": {"version": 1}}, r"FSDP version 1 .*fsdp_config=\{'version': 2\}"),
    (FSDP_ENV, {"rollout_hf_weights": "shared"}, r"rollout_hf_weights='shared' under FSDP2.*'copy'"),
    (FSDP_ENV, {"save_merged_model": True}, r"save_merged_model under FSDP2.*merge_and_unload"),
    ({**FSDP_ENV, "WORLD_SIZE": "2", "FSDP_OFFLOAD_PARAMS": "true"}, {},
     r"fsdp_offload_params=true on a machine without GPUs.*--fsdp_offload_params false"),
], ids=["fsdp1 from accelerate", "fsdp1 from VerlConfig", "shared HF weights", "merged save", "CPU offload on CPU"])
def test_fsdp_settings_that_cannot_work_are_refused_before_anything_loads(monkeypatch, env, overrides, message):
    import torch

    from verl_hf import VerlConfig

    if torch.cuda.is_available() and "FSDP_OFFLOAD_PARAMS" in env:
        pytest.skip("offloading is refused only on machines without GPUs")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        VerlConfig(output_dir="/tmp/verl-hf-fsdp-refusals", use_cpu=True, per_device_train_batch_size=8,
                   num_generations=4, report_to="none", **overrides)


def test_dynamic_sampling_refills_in_step_with_a_sharded_reward_model(tmp_path):
    """DAPO's dynamic sampling with a reward model sharded over both processes: scoring every refill is a
    collective, and the ranks' prompts are informative at different rates, so every rank refills while any is
    short (alone, a rank's reward-model forward would wait for the other forever)."""
    out = tmp_path / "dynamic"
    _run(tmp_path, _two_processes(FSDP2), out,
         ["--max_steps", "3", "--eval_strategy", "no", "--per_device_train_batch_size", "16", "--use_cpu", "false",
          "--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "4", "--dataset_test_split", "null",
          "--reward_model_path", _reward_model(tmp_path), "--reward_weights", "1.0", "0.1", "0.0"])
    rank0, rank1, history = _ranks(out)
    assert rank0["steps"] == rank1["steps"] == 3
    logs = [h for h in history if "dynamic_sampling/extra_rounds" in h]
    assert logs and any(h["dynamic_sampling/extra_rounds"] > 0 for h in logs)
