"""A colocated vLLM engine synced in many buckets, measured in a process of its own (vLLM sets up process-wide
state): a tiny Llama of 8 decoder layers, `WeightSync` with buckets of one layer each (embeddings,
8 layers, norm and lm_head in 10 buckets), three syncs of weights changed in between. Counts vLLM's layerwise-reload opens and
finalizes per sync (every name vLLM binds them under is wrapped, so per-bucket `reload_weights` is counted too),
the warnings vLLM logs for weights a reload did not load, and the largest gap between the engine's sampling
log-probs and the trained model's forward after each sync. Writes the figures that tests/test_rollout_vllm.py
asserts on to the JSON file named by argv[1]."""

import importlib
import json
import logging
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from verl_hf.demo import WARM_START_DIR  # noqa: E402
from verl_hf.roles import Actor  # noqa: E402
from verl_hf.rollout.vllm_engine import VLLMEngine  # noqa: E402
from verl_hf.sync import WeightSync  # noqa: E402

tokenizer = AutoTokenizer.from_pretrained(str(WARM_START_DIR))
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=128,
                     tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
torch.manual_seed(0)
model = LlamaForCausalLM(config).float()
engine = VLLMEngine(model.config, tokenizer.pad_token_id, [tokenizer.eos_token_id], max_model_len=64,
                    kv_cache_memory_bytes=2**26, dtype=torch.float32)

# Count every open and finalize of vLLM's layerwise reload, under each name it is bound to (the reload package,
# layerwise.py, inplace.py): per-bucket reload_weights calls them through inplace.py, one update through the package.
calls = {"open": 0, "finalize": 0}


def counted(kind, function):
    def wrapper(*args, **kwargs):
        calls[kind] += 1
        return function(*args, **kwargs)
    return wrapper


reload_package = importlib.import_module("vllm.model_executor.model_loader.reload")
if hasattr(reload_package, "start_reload"):  # 0.34: start_reload/finish_reload wrap the layerwise functions
    counted_names = (("start_reload", "open"), ("finish_reload", "finalize"))
else:  # 0.32, 0.33
    counted_names = (("initialize_layerwise_reload", "open"), ("finalize_layerwise_reload", "finalize"))
for module_name in ("vllm.model_executor.model_loader.reload", "vllm.model_executor.model_loader.reload.layerwise",
                    "vllm.model_executor.model_loader.reload.inplace",
                    "vllm.model_executor.model_loader.reload.lifecycle"):
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        continue
    for name, kind in counted_names:
        if hasattr(module, name):
            setattr(module, name, counted(kind, getattr(module, name)))


class Warnings(logging.Handler):
    """vLLM's 'vllm' logger does not propagate: a handler on it, attached once the engine is built."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


said = Warnings()
logging.getLogger("vllm").addHandler(said)

# buckets of one decoder layer (0.6 MB in fp32) each: the sync rounds a smaller size up to the largest layer
actor = Actor(model, tokenizer, engine=engine, weight_sync=WeightSync(bucket_mb=0.6))
prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
figures = {"syncs": []}
for round_ in range(3):
    if round_:  # an update changed every weight
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
    before = dict(calls)
    said.messages.clear()
    metrics = actor.sync_weights()  # the actor then samples without syncing again
    batch = actor.generate_sequences(prompt_ids=prompts, max_new_tokens=12, num_return_sequences=4,
                                     return_logprobs=True, seed=round_)
    mask = batch.response_mask.bool()
    gap = (batch.rollout_logprobs - actor.get_logprobs(batch))[mask].abs().max().item()
    not_loaded = [m for m in said.messages if "not loaded" in m or "Failed to load" in m]
    figures["syncs"].append({"buckets": metrics["sync/buckets"], "opens": calls["open"] - before["open"],
                             "finalizes": calls["finalize"] - before["finalize"], "gap": gap,
                             "tokens": int(mask.sum()), "not_loaded_warnings": not_loaded})
Path(sys.argv[1]).write_text(json.dumps(figures, indent=1))
print(json.dumps(figures, indent=1))
