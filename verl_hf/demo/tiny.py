"""A character-level tokenizer and a 0.5M-parameter Llama, built locally (no Hub).

The tokenizer is a BPE model with no merges (one token per character) and a `Fuse` decoder: without the
decoder `#### 85` decodes as `# # # #   8 5` and every answer check fails. Pad and EOS are distinct tokens.
Llama rather than Qwen2: transformers overrides a saved Qwen2 tokenizer class on reload.
Heads are 64 wide because vLLM's CPU attention rejects head_dim 16.

See it work: tests/test_demo_task.py.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>"}
CHARACTERS = string.ascii_letters + string.digits + " \n?!.,:;+-*/=#$%()'\""


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of `CHARACTERS`, plus pad/eos/bos/unk; left padding for generation."""
    specials = list(SPECIAL_TOKENS.values())
    vocab = {tok: i for i, tok in enumerate(specials + list(CHARACTERS))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.add_special_tokens(specials)
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, padding_side="left", **SPECIAL_TOKENS)


def build_tiny_llama(tokenizer, hidden_size: int = 128, num_layers: int = 2, seed: int = 0,
                     max_positions: int = 128) -> LlamaForCausalLM:
    """Llama with 2 heads of 64, FFN 4x, tied embeddings: about 0.53M parameters for the char vocab."""
    import torch

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=hidden_size // 64,
        head_dim=64,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return LlamaForCausalLM(config)


# ChatML, with the tools listed by signature (a tiny model has no room for JSON schemas) and tool results in
# turns of their own. Every turn ends with <|im_end|>, the eos_token: multi-turn rollouts continue it by suffix.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t['function']['name'] }}("
    "{{ t['function']['parameters']['properties'] | list | join(', ') }}){% if not loop.last %} {% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>"]  # single tokens, as in Qwen2.5's vocabulary


def build_chat_tokenizer(corpus: list[str], vocab_size: int | None = None, family=None) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `corpus`, digits always one token each (so numbers are copied digit by digit,
    as Llama 3's and Qwen's tokenizers split them), ChatML specials, eos <|im_end|>, the CHAT_TEMPLATE; or those
    of a tool-demo `family` (families.py)."""
    from tokenizers import AddedToken, pre_tokenizers, trainers

    specials = list(family.specials) if family else CHAT_SPECIAL_TOKENS
    singles = list(family.single_tokens) if family else TOOL_CALL_TOKENS
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False)])
    backend.decoder = decoders.ByteLevel()
    vocab_size = vocab_size or (family.vocab_size if family else 400)
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size,
                                                            special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in singles])
    tokens = dict(pad_token=family.pad, eos_token=family.eos, bos_token=family.bos) if family else dict(
        pad_token="<|endoftext|>", eos_token="<|im_end|>", bos_token=None)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, padding_side="left", **tokens)
    tokenizer.chat_template = family.chat_template() if family else CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(model_type: str, tokenizer, hidden_size: int = 128, num_layers: int = 2, seed: int = 0,
                     max_positions: int = 256):
    """A tiny model of `model_type` ('llama', 'qwen3', 'mistral', ...) shaped as build_tiny_llama's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64, num_key_value_heads=hidden_size // 64,
        head_dim=64, max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    return AutoModelForCausalLM.from_config(config)
