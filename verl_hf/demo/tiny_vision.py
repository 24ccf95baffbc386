"""Tiny vision-language models of real architectures, built locally with random weights (no download).

`build_tiny_qwen2_vl` gives a `Qwen2VLForConditionalGeneration` (vision tower, patch merger, M-RoPE language
model; heads 64 wide for vLLM's CPU attention) and its processor: a byte-level BPE with Qwen2-VL's vision
tokens, a ChatML template (tools listed by signature) that renders image parts, in any role's message, as
`<|vision_start|><|image_pad|><|vision_end|>`, and the PIL image processor (14-pixel patches merged 2x2, so a
56x84 image is 6 tokens). Also Qwen2.5-VL, Gemma-3 and Qwen3-VL-MoE (routing replay) with their processors.

The processor is `ImageOnlyQwen2VLProcessor` (vision/without_torchvision.py): Qwen2-VL's own without its video
processor, which needs torchvision, a package that cannot be installed beside the CPU build of torch these
machines use. It renders, expands and processes images exactly as `Qwen2VLProcessor` does.

See it work: tests/test_vision_inputs.py.
"""

from __future__ import annotations

from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from ..vision.without_torchvision import ImageOnlyQwen2VLProcessor
from .tiny import build_chat_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
VISION_CHAT_TEMPLATE = (  # tools listed by signature as demo/tiny.py's CHAT_TEMPLATE does; image parts in any role
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t['function']['name'] }}("
    "{{ t['function']['parameters']['properties'] | list | join(', ') }}){% if not loop.last %} {% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_vision_processor(corpus: list[str], vocab_size: int = 400, min_pixels: int = 4 * 28 * 28,
                           max_pixels: int = 64 * 28 * 28) -> ImageOnlyQwen2VLProcessor:
    """A Qwen2-VL processor whose BPE is trained on `corpus`; images are resized to between `min_pixels` and
    `max_pixels` (multiples of 28x28 pixels, one image token each)."""
    tokenizer = build_chat_tokenizer(corpus, vocab_size=vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    images = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    return ImageOnlyQwen2VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=VISION_CHAT_TEMPLATE)


def _qwen_vl_language(processor, hidden_size: int, num_layers: int, max_positions: int) -> tuple[dict, dict, dict]:
    """(text config, the vision token ids, the special token ids) the tiny Qwen2-VL family shares: heads 64 wide,
    M-RoPE over (t, h, w), tied embeddings, for `processor`'s tokens."""
    tokenizer = processor.tokenizer
    ids = {f"{name}_token_id": tokenizer.convert_tokens_to_ids(token) for name, token in
           [("image", "<|image_pad|>"), ("video", "<|video_pad|>"), ("vision_start", "<|vision_start|>"),
            ("vision_end", "<|vision_end|>")]}
    special = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                   bos_token_id=tokenizer.bos_token_id)
    half = 64 // 2  # M-RoPE splits each head's 32 rotary frequencies over (t, h, w)
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64,
                num_key_value_heads=hidden_size // 64, max_position_embeddings=max_positions,
                rope_scaling={"type": "mrope", "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8]},
                tie_word_embeddings=True, **special)
    return text, ids, special


def build_tiny_qwen2_vl(processor, hidden_size: int = 128, num_layers: int = 2, vision_depth: int = 2,
                        seed: int = 0, max_positions: int = 1024):
    """A random-weight `Qwen2VLForConditionalGeneration` for `processor`'s tokens: heads 64 wide in the
    language model and the vision tower, tied embeddings."""
    import torch
    from transformers.models.qwen2_vl import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text, ids, special = _qwen_vl_language(processor, hidden_size, num_layers, max_positions)
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(depth=vision_depth, embed_dim=hidden_size, hidden_size=hidden_size,
                           num_heads=hidden_size // 64, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, in_chans=3),
        tie_word_embeddings=True, **ids, **special)
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config)


GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
GEMMA3_CHAT_TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<start_of_image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def build_gemma3_processor(corpus: list[str], vocab_size: int = 400, image_size: int = 56, tokens_per_image: int = 4):
    """A Gemma-3 processor (`Gemma3Processor`, PIL image processor: every image resized to `image_size` square)
    whose BPE is trained on `corpus`, with Gemma-3's image tokens and turn markers: each image part renders as
    `<start_of_image>`, which the processor expands to `tokens_per_image` soft tokens between its markers."""
    from transformers.models.gemma3 import Gemma3ImageProcessorPil, Gemma3Processor

    from .tiny import build_chat_tokenizer

    tokenizer = build_chat_tokenizer(corpus + ["\n\n"], vocab_size=vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": [*GEMMA3_TOKENS.values(), "<start_of_turn>",
                                                                "<end_of_turn>"]})
    for name, token in GEMMA3_TOKENS.items():  # the attributes Gemma3Processor reads
        setattr(tokenizer, name, token)
        setattr(tokenizer, f"{name}_id", tokenizer.convert_tokens_to_ids(token))
    tokenizer.eos_token = "<end_of_turn>"
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    images = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size}, do_pan_and_scan=False)
    return Gemma3Processor(image_processor=images, tokenizer=tokenizer, chat_template=GEMMA3_CHAT_TEMPLATE,
                           image_seq_length=tokens_per_image)


def build_tiny_gemma3(processor, hidden_size: int = 128, num_layers: int = 2, vision_layers: int = 2,
                      seed: int = 0, max_positions: int = 1024):
    """A random-weight `Gemma3ForConditionalGeneration` for `processor`'s tokens: a SigLIP tower on 14-pixel
    patches pooled to the processor's tokens per image, image tokens attending to each other both ways, heads
    64 wide, tied embeddings."""
    import math

    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    tokenizer, size = processor.tokenizer, processor.image_processor.size["height"]
    special = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    config = Gemma3Config(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64, num_key_value_heads=1,
                         head_dim=64, max_position_embeddings=max_positions, sliding_window=64,
                         tie_word_embeddings=True, **special),
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=vision_layers,
                           num_attention_heads=1, image_size=size, patch_size=14),
        mm_tokens_per_image=processor.image_seq_length, boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id, image_token_index=tokenizer.image_token_id,
        tie_word_embeddings=True, **special)
    assert math.isqrt(processor.image_seq_length) ** 2 == processor.image_seq_length
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # transformers starts the projector at zero (for fine-tuning from a trained tower):
        # a random model would then give every image the same (zero) embeddings and ignore what it shows
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.02)
    return model


def build_tiny_qwen2_5_vl(processor, hidden_size: int = 128, num_layers: int = 2, vision_depth: int = 2,
                          seed: int = 0, max_positions: int = 1024):
    """A random-weight `Qwen2_5_VLForConditionalGeneration` (Qwen2.5-VL's vision tower: windowed attention in all
    blocks but the last, RMSNorm, SwiGLU) for `processor`'s tokens (Qwen2.5-VL takes Qwen2-VL's processor and
    tokens); heads 64 wide, tied embeddings."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text, ids, _ = _qwen_vl_language(processor, hidden_size, num_layers, max_positions)
    vision = dict(depth=vision_depth, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_heads=hidden_size // 64, out_hidden_size=hidden_size, fullatt_block_indexes=[vision_depth - 1],
                  window_size=56, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config)


def build_qwen3_vl_processor(corpus: list[str], vocab_size: int = 400, min_pixels: int = 4 * 32 * 32,
                             max_pixels: int = 64 * 32 * 32):
    """A Qwen3-VL processor (`ImageOnlyQwen3VLProcessor`: 16-pixel patches merged 2x2, so one image token per 32x32
    pixels; mean and std 0.5) with the tokenizer and template of `build_vision_processor`."""
    from ..vision.without_torchvision import ImageOnlyQwen3VLProcessor

    tokenizer = build_vision_processor(corpus, vocab_size).tokenizer
    images = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=min_pixels,
                                      max_pixels=max_pixels, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return ImageOnlyQwen3VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=VISION_CHAT_TEMPLATE)


def build_tiny_qwen3_vl_moe(processor, hidden_size: int = 128, num_layers: int = 2, vision_depth: int = 2,
                            num_experts: int = 4, seed: int = 0, max_positions: int = 1024):
    """A random-weight `Qwen3VLMoeForConditionalGeneration`: every decoder layer a mixture of `num_experts` experts
    (2 per token, renormalised), interleaved M-RoPE, and a vision tower with learned position embeddings whose
    first block's features are also added into the first decoder layer (DeepStack); heads 64 wide, tied
    embeddings."""
    import torch
    from transformers.models.qwen3_vl_moe import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    text, ids, special = _qwen_vl_language(processor, hidden_size, num_layers, max_positions)
    text.pop("rope_scaling")
    half = 64 // 2
    text.update(num_experts=num_experts, num_experts_per_tok=2, moe_intermediate_size=hidden_size // 2,
                decoder_sparse_step=1, head_dim=64,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True,
                                 "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8]})
    vision = dict(depth=vision_depth, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_heads=hidden_size // 64, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=hidden_size, num_position_embeddings=64, deepstack_visual_indexes=[0])
    config = Qwen3VLMoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids, **special)
    torch.manual_seed(seed)
    return Qwen3VLMoeForConditionalGeneration(config)
