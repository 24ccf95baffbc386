"""VerlTrainer on a vision-language policy (a tiny random-weight Qwen2-VL built locally) with HF generate: the
model's processor as processing_class, a dataset with an `images` column, GRPO steps that train the language
model and leave the frozen vision tower as it was; what cannot work is refused before any model loads."""

from __future__ import annotations

import numpy as np
import pytest

from verl_hf.rewards import completion_texts
import torch
from datasets import Dataset
from PIL import Image

from conftest import small_config

COLORS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


def _picture(color: str, height: int, width: int) -> Image.Image:
    return Image.fromarray(np.full((height, width, 3), COLORS[color], dtype="uint8"))


def _dataset(n: int) -> Dataset:
    colors, sizes = list(COLORS), [(56, 56), (56, 84), (84, 56)]
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Color?"}]}],
             "images": [_picture(colors[i % 3], *sizes[i % 3])], "answer": colors[i % 3]} for i in range(n)]
    return Dataset.from_list(rows)


def says_the_color(completions, answer, images, **kwargs):
    """1 where the completion names the picture's color, else a little for each letter of the picture's color
    it holds (a random model's groups differ); reads the images column as reward functions may."""
    assert all(isinstance(row[0], Image.Image) for row in images)
    texts = completion_texts(completions)  # chat prompts: each completion is a message list (TRL's contract)
    return [1.0 if a in c else 0.1 * sum(ch in c for ch in a) for c, a in zip(texts, answer)]


@pytest.fixture(scope="module")
def vlm():
    from verl_hf.demo.tiny_vision import build_tiny_qwen2_vl, build_vision_processor

    processor = build_vision_processor(["Color? red green blue. The picture is red, green or blue."], vocab_size=300)
    return build_tiny_qwen2_vl(processor), processor


def test_grpo_steps_train_the_language_model_and_leave_the_frozen_vision_tower(vlm, tmp_path):
    from verl_hf import VerlTrainer

    model, processor = vlm
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = small_config(tmp_path, per_device_train_batch_size=12, num_generations=4, max_steps=2,
                        max_prompt_length=64, max_response_length=8, reward_funcs=[says_the_color],
                        reward_weights=[1.0], learning_rate=1e-3)
    trainer = VerlTrainer(model=model, args=args, processing_class=processor, train_dataset=_dataset(6))
    trainer.train()
    history = [h for h in trainer.state.log_history if "reward/mean" in h]
    assert len(history) == 2
    changed = {name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])}
    vision = {name for name in before if ".visual." in f".{name}"}
    assert vision and not changed & vision  # freeze_vision_tower (default): the vision tower as it was
    assert any("language_model" in name for name in changed)
    # The processor is saved with the model: a run resumed or served from the directory processes images alike.
    from verl_hf.vision.prompts import ImagePrompts
    from verl_hf.vision.without_torchvision import load_processor

    trainer.save_model(str(tmp_path / "saved"))
    saved = load_processor(str(tmp_path / "saved"), model.config.model_type)
    row = _dataset(1)[0]
    assert ImagePrompts(saved).prompt_ids(row, "row 0") == ImagePrompts(processor).prompt_ids(row, "row 0")
    assert saved.image_processor.size == processor.image_processor.size  # min and max pixels


def test_what_cannot_carry_images_is_refused_before_any_model_loads(vlm, tmp_path):
    from verl_hf import VerlConfig, VerlTrainer
    from verl_hf.demo.tiny import build_chat_tokenizer, build_tiny_model

    model, processor = vlm
    tokenizer = processor.tokenizer
    args = small_config(tmp_path, reward_funcs=[says_the_color], reward_weights=[1.0])
    with pytest.raises(ValueError, match=r"the train dataset has images \(column 'images'\) but processing_class is "
                                         r"a tokenizer: pass the model's processor"):
        VerlTrainer(model=model, args=args, processing_class=tokenizer, train_dataset=_dataset(3))
    text_model = build_tiny_model("llama", build_chat_tokenizer(["Color? red"], vocab_size=300))
    with pytest.raises(ValueError, match="is a text-only model with no vision encoder"):
        VerlTrainer(model=text_model, args=args, processing_class=processor, train_dataset=_dataset(3))
    from verl_hf.demo.tiny_vision import build_gemma3_processor, build_tiny_gemma3

    gemma_processor = build_gemma3_processor(["Color? red"], vocab_size=300)
    with pytest.raises(ValueError, match=r"which rollout_engine='vllm' with a gemma3 model \(vLLM takes image "
                                         r"prompts here for the Qwen2-VL family\) does not carry yet: set "
                                         r"rollout_engine='hf'"):
        VerlTrainer(model=build_tiny_gemma3(gemma_processor), processing_class=gemma_processor,
                    args=small_config(tmp_path, reward_funcs=[says_the_color], reward_weights=[1.0],
                                      rollout_engine="vllm"), train_dataset=_dataset(3))
    for setting, message in [(dict(adv_estimator="gae"), "adv_estimator='gae' or Safe-RLHF costs")]:
        with pytest.raises(ValueError, match=r"the train dataset has images \(column 'images'\), which " + message):
            VerlTrainer(model=model, args=small_config(tmp_path, reward_funcs=[says_the_color], reward_weights=[1.0],
                                                       **setting),
                        processing_class=processor, train_dataset=_dataset(3))
    with pytest.raises(ValueError, match=r"freeze_vision_tower=False .*vision-language model"):
        VerlTrainer(model=text_model, args=small_config(tmp_path, freeze_vision_tower=False,
                                                        reward_funcs=[says_the_color], reward_weights=[1.0]),
                    processing_class=tokenizer, train_dataset=_dataset(3).remove_columns("images"))
    with pytest.raises(ValueError, match=r"image_column='' must name a dataset column"):
        VerlConfig(output_dir=str(tmp_path), image_column="", use_cpu=True)


def test_lora_leaves_the_frozen_tower_and_a_processor_with_text_rows_trains_as_text(vlm, tmp_path):
    """LoRA on every linear layer adds no trainable weight inside the frozen vision tower; given text rows, the
    processor's tokenizer runs a text run (no pixels, no vision refusals)."""
    from peft import LoraConfig

    from verl_hf import VerlTrainer

    model, processor = vlm
    args = small_config(tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=1,
                        max_prompt_length=64, max_response_length=6, reward_funcs=[says_the_color],
                        reward_weights=[1.0])
    trainer = VerlTrainer(model=model, args=args, processing_class=processor, train_dataset=_dataset(4),
                          peft_config=LoraConfig(r=4, target_modules="all-linear"))
    trainable = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and not [name for name in trainable if ".visual." in name]
    text = Dataset.from_list([{"prompt": [{"role": "user", "content": "Color?"}], "answer": "red"}] * 4)
    plain = VerlTrainer(model=model, args=small_config(tmp_path, rollout_engine="hf", reward_funcs=[says_the_color],
                                                       reward_weights=[1.0]),
                        processing_class=processor, train_dataset=text)
    assert plain.actor.images is None


def test_grpo_on_an_moe_vlm_replays_the_samplers_routes(tmp_path):
    """A tiny Qwen3-VL-MoE with routing_replay: two GRPO steps on image rows whose every training forward routes
    each token (image tokens included) through the experts HF generate chose; the live routers agree."""
    from verl_hf import VerlTrainer
    from verl_hf.demo.tiny_vision import build_qwen3_vl_processor, build_tiny_qwen3_vl_moe

    processor = build_qwen3_vl_processor(["Color? red green blue. The picture is red, green or blue."],
                                         vocab_size=300)
    args = small_config(tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=2, max_prompt_length=64,
                        max_response_length=6, reward_funcs=[says_the_color], reward_weights=[1.0],
                        routing_replay=True, learning_rate=1e-3)
    trainer = VerlTrainer(model=build_tiny_qwen3_vl_moe(processor), args=args, processing_class=processor,
                          train_dataset=_dataset(4))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "moe/replay_agreement" in h]
    assert len(logs) == 2 and all(h["moe/replay_agreement"] > 0.99 for h in logs), logs
