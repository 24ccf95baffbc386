"""A LoRA policy served to colocated vLLM as an adapter (vllm_lora='adapter'), measured in a process of its own
(vLLM keeps process-wide state): the engine and the weight sync driven directly, as a custom loop would, on a
tiny Llama (argv[1]: its folder) with LoRA on attention and MLP. Writes the figures tests/test_sync_adapter.py
asserts on to the JSON file argv[2]."""

import json
import os
import sys

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from verl_hf.rollout.base import SamplingConfig  # noqa: E402
from verl_hf.rollout.vllm_engine import VLLMEngine  # noqa: E402
from verl_hf.sync import WeightSync  # noqa: E402
from verl_hf.sync.adapter import engine_lora_rank, vllm_adapter_config  # noqa: E402

path, figures_file = sys.argv[1:3]
figures = {}
base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
# rsLoRA and per-module ranks and alphas: vLLM must scale each module as PEFT does (alpha / sqrt(r) here)
lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"],
                  init_lora_weights=False, use_rslora=True, rank_pattern={"gate_proj": 8}, alpha_pattern={"down_proj": 3})
model = get_peft_model(base, lora).eval()
adapter = vllm_adapter_config(lora)
engine = VLLMEngine(base.config, 0, [base.config.eos_token_id], max_model_len=64,
                    kv_cache_memory_bytes=64 * 2**20, lora_rank=engine_lora_rank(adapter))
sync = WeightSync(adapter_config=adapter)
prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]]
sampling = SamplingConfig(max_new_tokens=8, num_return_sequences=4, seed=1, return_logprobs=True)


def trainer_logprobs(rollout) -> torch.Tensor:
    """The PEFT model's log-probs of the engine's samples, row by row (no padding: exact positions)."""
    rows = []
    for prompt, mask, response in zip(rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids):
        ids = torch.cat([prompt[mask.bool()], response]).unsqueeze(0)
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        start = int(mask.sum()) - 1
        rows.append(logp[start : start + len(response)].gather(-1, response.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def gap(rollout) -> float:
    return ((trainer_logprobs(rollout) - rollout.logprobs).abs() * rollout.response_mask).max().item()


# 1. Before any sync the engine refuses to sample (it would sample from the base model).
try:
    engine.generate(prompts, sampling)
    figures["unsynced_error"] = ""
except RuntimeError as error:
    figures["unsynced_error"] = str(error)

# 2. The first sync: base + adapter; the engine's log-probs equal the PEFT forward; the training weights untouched.
before = {n: p.detach().clone() for n, p in model.named_parameters()}
first = sync.sync(model, engine)
figures["first_sync"] = first
figures["params_untouched"] = all(torch.equal(before[n], p) for n, p in model.named_parameters())
rollout = engine.generate(prompts, sampling)
figures["first_gap"], figures["first_version"] = gap(rollout), rollout.adapter_version
figures["tokens"] = int(rollout.response_mask.sum())

# 3. An update of the adapter (as an optimizer step would make): the old version's log-probs no longer match,
#    a sync loads a new version whose log-probs do; 20 syncs leave one version loaded.
stale_gaps, gaps, loaded, later = [], [], [], []
for step in range(20):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(0.05 * torch.randn_like(p))
    stale_gaps.append(gap(engine.generate(prompts, sampling)))  # sampled by the previous version
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    later.append(sync.sync(model, engine))
    figures["params_untouched"] &= all(torch.equal(trained[n], p) for n, p in model.named_parameters())
    rollout = engine.generate(prompts, sampling)
    gaps.append(gap(rollout))
    loaded.append(engine.loaded_adapters())
figures.update(stale_gaps=stale_gaps, gaps=gaps, loaded=loaded, last_version=rollout.adapter_version,
               later_syncs=later)
with open(figures_file, "w") as out:
    json.dump(figures, out, indent=1)
sys.stdout.flush()
os._exit(0)  # skip vLLM's teardown (tests/architecture_checks.py says why)
