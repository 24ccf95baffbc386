"""The weight sync (verl_hf.sync): names, buckets, LoRA merges, verification, and the HF inference copy.
Single process here; the ZeRO-3 / DDP / LoRA-under-ZeRO-3 runs are in test_distributed.py."""

import copy
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from conftest import small_config
from verl_hf import VerlTrainer
from verl_hf.roles import Actor
from verl_hf.rollout import HFCopyEngine
from verl_hf.sync import PeakMemory, WeightSync, engine_name, plan_buckets, weight_units


@pytest.mark.parametrize("training, engine", [
    ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
    ("module.model.norm.weight", "model.norm.weight"),                                       # DDP / DeepSpeed
    ("_orig_mod.lm_head.weight", "lm_head.weight"),                                          # torch.compile
    ("module.base_model.model.model.layers.1.self_attn.q_proj.base_layer.weight",            # PEFT LoRA
     "model.layers.1.self_attn.q_proj.weight"),
    ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),           # PEFT modules_to_save
    ("model.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.down_proj.weight",  # FSDP + checkpointing
     "model.layers.0.mlp.down_proj.weight"),
])
def test_engine_name_strips_every_wrapper(training, engine):
    assert engine_name(training) == engine


def _engine(model, tokenizer, **kwargs):
    return HFCopyEngine.of(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], **kwargs)


def _perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)


def test_sync_copies_every_weight_in_buckets(policy, tokenizer):
    engine = _engine(policy, tokenizer)
    _perturb(policy)
    sync = WeightSync(bucket_mb=1.1, verify=True)  # one decoder layer of the demo model is ~1.05 MB
    metrics = sync.sync(policy, engine)
    for name, p in policy.named_parameters():
        assert torch.equal(engine.get_weights([name])[name], p), name
    total = sum(p.numel() * p.element_size() for p in policy.parameters())
    assert metrics["sync/gigabytes"] == pytest.approx(total / 1e9)
    assert metrics["sync/buckets"] >= total / (1.1 * 2**20) and metrics["sync/gb_per_s"] > 0


def test_buckets_hold_whole_layers_and_a_too_small_bucket_is_raised_with_a_warning(policy):
    units = weight_units(policy)
    layer_bytes = sum(u.nbytes for u in units if u.name.startswith("model.layers.0."))
    largest = max(layer_bytes, max(u.nbytes for u in units))
    with pytest.warns(UserWarning, match="smaller than the largest layer"):
        buckets, size = plan_buckets(units, 1024)
    assert size == largest and sum(len(b) for b in buckets) == len(units)
    assert all(sum(u.nbytes for u in b) <= largest for b in buckets)
    for bucket in buckets:  # a numbered layer is never split over two buckets
        layers = {u.name.split(".")[2] for u in bucket if u.name.startswith("model.layers.")}
        assert all(sum(u.name.startswith(f"model.layers.{n}.") for u in bucket) ==
                   sum(u.name.startswith(f"model.layers.{n}.") for u in units) for n in layers)


def test_tied_weights_are_pushed_once(tokenizer):
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    engine = _engine(model, tokenizer)
    WeightSync(verify=True).sync(model, engine)
    assert "lm_head.weight" not in engine.weight_names()
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()


def test_lora_is_merged_per_module_like_peft_merge(policy, tokenizer):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                   init_lora_weights=False))
    engine = _engine(peft_model, tokenizer)
    WeightSync(verify=True).sync(peft_model, engine)
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    for name, weight in engine.model.named_parameters():
        torch.testing.assert_close(weight, merged[name], rtol=0, atol=1e-6)
    prompt = torch.tensor([tokenizer("12+34=").input_ids])
    greedy = dict(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(engine.model.generate(prompt, **greedy), peft_model.generate(input_ids=prompt, **greedy))


def test_engine_of_another_architecture_names_the_first_unmatched_weight(policy, tokenizer):
    other = LlamaForCausalLM(LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=64,
                                         num_hidden_layers=policy.config.num_hidden_layers + 1, num_attention_heads=1,
                                         tie_word_embeddings=True))
    engine = HFCopyEngine(other, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    with pytest.raises(ValueError, match="never sets the engine weight 'model.layers.2"):
        WeightSync().sync(policy, engine)
    fewer = LlamaForCausalLM(LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=1,
                                         num_attention_heads=1, tie_word_embeddings=True))
    engine = HFCopyEngine(fewer, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    with pytest.raises(ValueError, match="no weight named 'model.layers.1"):
        WeightSync().sync(policy, engine)


class SkipsOneWeight(HFCopyEngine):
    """An engine with a transport bug: it drops the final norm."""

    def load_weights(self, named_tensors):
        super().load_weights([(n, t) for n, t in named_tensors if n != "model.norm.weight"])


def test_verify_fails_loudly_when_the_engine_differs(policy, tokenizer):
    engine = SkipsOneWeight(copy.deepcopy(policy), tokenizer.pad_token_id, [tokenizer.eos_token_id])
    _perturb(policy)
    WeightSync(verify=False).sync(policy, engine)  # without verification the bug goes unnoticed
    with pytest.raises(RuntimeError, match="'model.norm.weight' differs"):
        WeightSync(verify=True).sync(policy, engine)


def test_engine_dtype_cast_on_push(policy, tokenizer):
    engine = _engine(policy, tokenizer, dtype=torch.bfloat16)
    WeightSync(verify=True).sync(policy, engine)
    assert engine.dtype == torch.bfloat16
    assert torch.equal(engine.model.model.norm.weight, policy.model.norm.weight.to(torch.bfloat16))


def test_actor_with_an_inference_copy_syncs_before_sampling_and_after_each_step(policy, tokenizer):
    actor = Actor(policy, tokenizer, engine=_engine(policy, tokenizer), learning_rate=1e-2)
    before = actor.generate_sequences(["1+2="], max_new_tokens=4, do_sample=False)
    assert torch.equal(actor.engine.model.lm_head.weight, policy.lm_head.weight)  # synced before the first sample
    loss = -actor.compute_logprobs(before)[0].sum()
    actor.update(loss)
    assert not torch.equal(actor.engine.model.lm_head.weight, policy.lm_head.weight)
    actor.generate_sequences(["1+2="], max_new_tokens=4, do_sample=False)
    assert torch.equal(actor.engine.model.lm_head.weight, policy.lm_head.weight)


def test_peak_memory_sees_a_temporary_allocation(tmp_path):
    """In a fresh process with glibc returning freed blocks at once (as benchmarks/sync.py runs), the CPU
    measurement sees a 16 MiB temporary; in a long-lived process it is a lower bound (recycled heap)."""
    script = tmp_path / "peak.py"
    script.write_text(
        "import torch\nfrom verl_hf.sync import PeakMemory\n"
        "with PeakMemory('cpu') as peak:\n    block = torch.ones(16 * 2**20 // 4)\n    del block\n"
        "print(peak.extra_bytes)\n")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    extra = int(out.stdout.strip().splitlines()[-1])
    assert 15 * 2**20 <= extra < 24 * 2**20, extra


def test_trainer_with_inference_copy_samples_like_shared_and_syncs_every_step(tmp_path, warm_start_dir, addition):
    """The copy engine, fed by the sync (verified bitwise), samples exactly what the shared engine samples."""
    train, _ = addition
    runs = {}
    for form in ("shared", "copy"):
        args = small_config(tmp_path / form, max_steps=3, rollout_hf_weights=form, sync_verify=form == "copy")
        trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=train)
        trainer.train()
        runs[form] = [h for h in trainer.state.log_history if "reward/mean" in h]
        if form == "copy":  # the last step changed the weights: any later generation syncs first
            assert trainer.actor.engine_is_stale
            trainer.actor.generate_sequences(["1+2="], max_new_tokens=2)
            copy_weights = trainer.actor.engine.model.state_dict()
            assert all(torch.equal(copy_weights[n], p) for n, p in trainer.model.named_parameters())
    for shared, copied in zip(runs["shared"], runs["copy"]):
        assert copied["reward/mean"] == pytest.approx(shared["reward/mean"], abs=1e-6)
        assert copied["loss"] == pytest.approx(shared["loss"], abs=1e-5)
    assert all("sync/gb_per_s" in h and "time/sync" in h for h in runs["copy"])
    assert not any("time/sync" in h for h in runs["shared"])


def test_rollout_dtype_needs_an_engine_copy(tmp_path, warm_start_dir, addition):
    args = small_config(tmp_path, rollout_hf_weights="shared", rollout_dtype="bfloat16")
    with pytest.raises(ValueError, match="rollout_hf_weights='copy'"):
        VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    with pytest.raises(ValueError, match="rollout_hf_weights='cpoy' is unknown"):
        small_config(tmp_path, rollout_hf_weights="cpoy")
    with pytest.raises(ValueError, match="sync_bucket_mb=0"):
        small_config(tmp_path, sync_bucket_mb=0)


def test_auto_rollout_dtype_follows_mixed_precision(tmp_path, policy):
    import dataclasses

    from verl_hf.rollout.factory import rollout_dtype

    args = small_config(tmp_path)
    assert rollout_dtype(args, policy) == torch.float32
    assert rollout_dtype(dataclasses.replace(args, bf16=True), policy) == torch.bfloat16
    assert rollout_dtype(dataclasses.replace(args, rollout_dtype="float16"), policy) == torch.float16


def test_after_a_full_push_a_sync_sends_the_layers_that_train_or_trained_at_the_last_sync(policy, tokenizer):
    """Frozen layers keep what the first push gave the engine; a layer frozen after the last sync is sent once more
    (it may have been updated before it froze); an engine that does not keep its weights gets everything."""
    engine = _engine(policy, tokenizer)
    sync = WeightSync(verify=True)  # every weight compared after each sync, the ones left as they were too
    all_tensors = sync.sync(policy, engine)["sync/tensors"]
    layer_1 = [p for n, p in policy.named_parameters() if n.startswith("model.layers.1.")]
    for name, p in policy.named_parameters():
        p.requires_grad_(name.startswith(("model.layers.0.", "model.layers.1.")))
    _perturb(policy)  # the embedding and norm trained until now: this sync still sends them
    assert sync.sync(policy, engine)["sync/tensors"] == all_tensors
    with torch.no_grad():  # what the optimizer changes now: the layers that train
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.01 * p.requires_grad)
    layers = sync.sync(policy, engine)["sync/tensors"]
    assert 0 < layers < all_tensors  # layers 0 and 1, not the embedding or the final norm
    with torch.no_grad():
        layer_1[0].add_(1.0)  # an update of layer 1, which then freezes before the next sync
    for p in layer_1:
        p.requires_grad_(False)
    assert sync.sync(policy, engine)["sync/tensors"] == layers  # layer 1 once more (verified: it changed)
    assert sync.sync(policy, engine)["sync/tensors"] == layers / 2  # then layer 0 alone
    engine.keeps_weights = False  # e.g. vLLM whose sleep drops the weights
    assert sync.sync(policy, engine)["sync/tensors"] == all_tensors
    for p in policy.parameters():
        p.requires_grad_(True)
