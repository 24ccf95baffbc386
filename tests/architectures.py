"""Eleven transformers architectures (and two more for the default-dtype column) as tiny random models (2
layers, heads of 64 for vLLM's CPU attention), a locally trained byte-level BPE tokenizer with a ChatML
template, and the check every engine must pass on each: a few GRPO steps that change the weights, the engine's
sampling log-probs equal to the trainer's forward (within fp32 or bf16 bounds), two training-mode forwards
identical (dropout off), and `save_model` reloaded by `AutoModelForCausalLM` with identical logits. Used by tests/test_architectures.py, in
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
    # Dropout on at its defaults, which RL must turn off: Seed-OSS applies functional dropout with rates its
    # modules cache from the config (attention_dropout, residual_dropout 0.1); GPT-2 has nn.Dropout modules
    # (resid_pdrop, embd_pdrop, attn_pdrop 0.1) and Conv1D (transposed) weights.
    "seed_oss": ("seed_oss", dict(tie_word_embeddings=False)),
    "gpt2": ("gpt2", dict(tie_word_embeddings=True)),
}
# Only in the default-dtype column of colocated vLLM (the families the AMX crash was first seen on, with Llama).
DEFAULT_DTYPE_ONLY = {
    "granite": ("granite", dict(tie_word_embeddings=True)),
    "mixtral": ("mixtral", dict(tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2,
                                sliding_window=None)),
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
# bf16 (both sides: the engine holds bf16 weights, the trainer's forward runs under bf16 autocast): bf16 keeps 8
# significant bits, so each rounded matmul output is off by up to 2^-9 of its size, and the two sides round at
# different places (fused kernels, accumulation order). Logits of a few units then differ by about 1e-2 at the
# worst token and 1e-3 on average. Measured over the 14 bf16 runs of tests/test_architectures.py (13 families
# colocated and the server; Intel Xeon with AMX): mean 0.8-1.4e-3, largest 1.1e-2, per-step mean log-ratio
# |k1| <= 6.4e-4. The bounds leave 3-5x for the other CPU kind (AVX512-BF16 without AMX: other kernels) and
# stay under what a wrong weight gives (Qwen3-MoE's unrepacked experts: 2e-2 per token on average in fp32).
BF16_MEAN_LOGPROB_BOUND, BF16_MAX_LOGPROB_BOUND, BF16_K1_BOUND = 5e-3, 5e-2, 2e-3
# A mixture of experts in bf16 can also route one near-tie token to another expert on one side (top-2 of 4 here):
# that token's log-prob then differs by far more than rounding. Measured on a 2-core AMD EPYC (AVX512-BF16, no
# AMX): Mixtral's worst token of its first round 7.9e-2 (later rounds 2-4e-3, mean 9e-4, |k1| <= 1.1e-4). So
# the worst token of an MoE gets a looser bound in bf16; the mean and k1 bounds, which a wrong weight breaks,
# stay as tight as for dense models.
MOE_FAMILIES = ("mixtral", "qwen3_moe")
BF16_MOE_MAX_LOGPROB_BOUND = 0.2


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


def build(name: str, directory: Path, tokenizer, **sizes) -> str:
    """Save architecture `name` (random weights, seed 0) and the tokenizer under directory/name. `sizes`: other
    hidden_size, intermediate_size, num_hidden_layers, ... than the tiny defaults (heads stay 64 wide)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, extra = {**ARCHITECTURES, **DEFAULT_DTYPE_ONLY}[name]
    common = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    if "hidden_size" in sizes:
        sizes.setdefault("num_attention_heads", sizes["hidden_size"] // 64)
    config = AutoConfig.for_model(model_type, **{**common, **extra, **sizes})
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
    from verl_hf.rewards import completion_texts  # chat prompts give message lists (TRL's contract)

    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completion_texts(completions)]


def check(path: str, out_dir: Path, lora_targets: list[str] | None = None, **overrides) -> dict:
    """Train GRPO steps (2 unless `max_steps` says) on `path` with the given engine settings (LoRA on
    `lora_targets` if given); return the figures the tests assert on. `bf16=None` leaves the precision at the
    machine's default (bf16 where it is fast); else fp32."""
    import sys

    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import small_config

    from verl_hf import VerlTrainer

    fields = dict(per_device_train_batch_size=8, num_generations=4, max_steps=2, learning_rate=1e-3,
                  max_prompt_length=48, max_response_length=8, rollout_is="token", reward_funcs=None,
                  reward_weights=None)
    args = small_config(out_dir, **{**fields, **overrides})
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
    with trainer.accelerator.autocast():  # as in training: under bf16 the trainer's forwards run in bf16 too
        gap = (batch.rollout_logprobs - actor.get_logprobs(batch))[mask].abs()
        # dropout off for real: two training-mode forwards (as the loss sees them) give the same log-probs
        with torch.no_grad():
            repeatable = torch.equal(actor.compute_logprobs(batch)[0], actor.compute_logprobs(batch)[0])
    # save_model -> a plain reload (with the trainer's attention kernel) gives the trained model's logits
    trainer.save_model(str(out_dir / "saved"))
    model = trainer.accelerator.unwrap_model(trainer.model)
    reloaded = AutoModelForCausalLM.from_pretrained(str(out_dir / "saved"), dtype=torch.float32,
                                                    attn_implementation=model.config._attn_implementation)
    ids = torch.tensor([prompts[0]])
    with torch.no_grad(), trainer.accelerator.autocast():  # accelerate runs the trained model's forward under it
        same = torch.equal(model(ids).logits, reloaded(ids).logits)
    saved_rates_kept = lora_targets is not None or \
        _dropout_fields(Path(path)) == _dropout_fields(out_dir / "saved")  # as built, not RL's zeros
    history = trainer.state.log_history
    logged = [h["rollout_is/mismatch_k1"] for h in history if "rollout_is/mismatch_k1" in h]
    logged_max = [h["rollout_is/logprob_gap_max"] for h in history if "rollout_is/logprob_gap_max" in h]
    agreement = [h["moe/replay_agreement"] for h in history if "moe/replay_agreement" in h]  # routing_replay
    synced = [{k: v for k, v in h.items() if k.startswith("sync/")} for h in history if "sync/gigabytes" in h]
    return dict(changed=changed, total=len(before), mean_gap=gap.mean().item(), max_gap=gap.max().item(),
                tokens=int(mask.sum()), reload_identical=same, train_mode_repeatable=repeatable,
                saved_rates_kept=saved_rates_kept, logged_k1=logged,
                logged_gap_max=logged_max, replay_agreement=agreement, steps=args.max_steps, bf16=bool(args.bf16),
                synced=synced)


def _dropout_fields(checkpoint: Path) -> dict:
    """The rates of training-only randomness in a saved config.json (roles/dropout.py's names)."""
    from verl_hf.roles.dropout import is_rate_name

    values = json.loads((checkpoint / "config.json").read_text())
    return {key: value for key, value in values.items() if is_rate_name(key)}


def write(figures: dict, path: Path) -> None:
    path.write_text(json.dumps(figures, indent=1))
