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


def build_tiny_llama(tokenizer, hidden_size: int = 128, num_layers: int = 2, seed: int = 0) -> LlamaForCausalLM:
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
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return LlamaForCausalLM(config)
