"""Nine transformers architectures as tiny random models (2 layers, heads of 64 for vLLM's CPU attention), a
locally trained byte-level BPE tokenizer with a ChatML template, and the check every engine must pass on each:
a few GRPO steps that change the weights, the engine's sampling log-probs equal to the trainer's forward, and
`save_model` reloaded by `AutoModelForCausalLM` with identical logits. Used by tests/test_architectures.py, in
the test process (HF engine, vLLM server) and in one subprocess of its own (colocated vLLM,
tests/architecture_checks.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# name -> (model_type, config fields beyond the common ones). Tied embeddings where the family ties them.
ARCHITECTURES = {
    "llama": ("llama", dict(tie_word_embeddings=True)),
    "qwen2": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen3": ("qwen3", dict(tie_word_embeddings=True)),
    "qwen3_moe": ("qwen3_moe", dict(tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[])),
    "mistral": ("mistral", dict(tie_word_embeddings=False, sliding_window=None)),
    "gemma2": ("gemma2", dict(tie_word_embeddings=True, query_pre_attn_scalar=64, sliding_window=128)),
    "gemma3": ("gemma3_text", dict(tie_word_embeddings=True, query_pre_attn_scalar=64, sliding_window=128)),
    "phi3": ("phi3", dict(tie_word_embeddings=False)),
    "olmo2": ("olmo2", dict(tie_word_embeddings=False)),
}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# ChatML with the tools listed in a system turn, as Qwen2.5's template does, but by signature only (this BPE,
# trained on digits, spells a JSON schema out byte by byte); tool results are `tool` turns.
CHATML_TOOLS = ("{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t['function']['name'] }}("
                "{{ t['function']['parameters']['properties'] | list | join(', ') }}) {% endfor %}<|im_end|>\n"
                "{% endif %}" + CHATML)
MEAN_LOGPROB_BOUND = 1e-5  # nats per token, engine vs trainer, fp32: dense and MoE alike (measured 1.4-2.6e-7;
#                            the MoE's unrepacked experts gave 2e-2)


def build_tokenizer():
    """Byte-level BPE trained here on the demo task's text (about 300 tokens), ChatML specials, EOS <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from verl_hf.demo.task import make_addition_dataset

    corpus = [f"{row['prompt']}{row['answer']}" for row in make_addition_dataset(500, seed=3)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                        padding_side="left")
    tokenizer.chat_template = CHATML
    return tokenizer


def build(name: str, directory: Path, tokenizer) -> str:
    """Save architecture `name` (random weights, seed 0) and the tokenizer under directory/name."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, extra = ARCHITECTURES[name]
    common = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    config = AutoConfig.for_model(model_type, **{**common, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    path = directory / name
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def chat_prompts(num: int = 64):
    """The demo's addition problems as one-turn chat prompts (through the ChatML template)."""
    from verl_hf.demo.task import make_addition_dataset

    data = make_addition_dataset(num, seed=5).remove_columns("completion")
    return data.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})


def digit_share(completions, **kwargs) -> list[float]:
    """A reward that a random model's samples already vary in (so that GRPO's advantages are not all zero)."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def check(path: str, out_dir: Path, lora_targets: list[str] | None = None, **overrides) -> dict:
    """Train 2 GRPO steps on `path` with the given engine settings (LoRA on `lora_targets` if given); return the
    figures the tests assert on."""
    import sys

    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import small_config

    from verl_hf import VerlTrainer

    args = small_config(out_dir, per_device_train_batch_size=8, num_generations=4, max_steps=2, learning_rate=1e-3,
                        max_prompt_length=48, max_response_length=8, rollout_is="token",
                        reward_funcs=None, reward_weights=None, **overrides)
    lora = None
    if lora_targets:
        from peft import LoraConfig

        lora = LoraConfig(r=4, lora_alpha=8, target_modules=lora_targets, init_lora_weights=False)
    trainer = VerlTrainer(model=path, args=args, train_dataset=chat_prompts(), reward_funcs=[digit_share],
                          peft_config=lora)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    changed = sum(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if n in before)
    # the engine after the last update and sync against the trainer's forward, on fresh samples
    actor = trainer.actor
    actor.sync_weights()
    prompts = [trainer.train_dataset[i]["prompt_ids"] for i in range(4)]
    batch = actor.generate_sequences(prompt_ids=prompts, max_new_tokens=8, num_return_sequences=4,
                                     return_logprobs=True)
    mask = batch.response_mask.bool()
    gap = (batch.rollout_logprobs - actor.get_logprobs(batch))[mask].abs()
    # save_model -> a plain reload gives the trained model's logits
    trainer.save_model(str(out_dir / "saved"))
    reloaded = AutoModelForCausalLM.from_pretrained(str(out_dir / "saved"), dtype=torch.float32)
    ids = torch.tensor([prompts[0]])
    model = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        same = torch.equal(model(ids).logits, reloaded(ids).logits)
    history = trainer.state.log_history
    logged = [h["rollout_is/mismatch_k1"] for h in history if "rollout_is/mismatch_k1" in h]
    agreement = [h["moe/replay_agreement"] for h in history if "moe/replay_agreement" in h]  # routing_replay
    return dict(changed=changed, total=len(before), mean_gap=gap.mean().item(), max_gap=gap.max().item(),
                tokens=int(mask.sum()), reload_identical=same, logged_k1=logged, replay_agreement=agreement)


def write(figures: dict, path: Path) -> None:
    path.write_text(json.dumps(figures, indent=1))
