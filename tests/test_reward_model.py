"""A sequence-classification reward model scores as one more reward function."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from conftest import small_config
from verl_hf import VerlTrainer
from verl_hf.rewards.model import RewardModelFunction, reward_model_function


def _score_model(tokenizer, num_labels=1, path=None):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=1, head_dim=64, num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForSequenceClassification(config)
    if path is not None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return model


def test_reward_model_scores_prompt_plus_completion(tokenizer, tmp_path):
    model = _score_model(tokenizer, path=tmp_path)
    fn = reward_model_function(str(tmp_path))
    scores = fn(prompts=["What is 1 plus 2?\n"] * 2, completions=["#### 3", "#### 4"], completion_ids=None)
    assert len(scores) == 2 and scores[0] != scores[1]
    enc = tokenizer(["What is 1 plus 2?\n#### 3"], return_tensors="pt")
    with torch.no_grad():
        assert scores[0] == pytest.approx(model(**enc).logits[0, 0].item(), abs=1e-5)


def test_two_label_model_is_refused_with_the_fix(tokenizer):
    with pytest.raises(ValueError, match="num_labels=2.*num_labels=1"):
        RewardModelFunction(_score_model(tokenizer, num_labels=2), tokenizer)


def test_trainer_with_reward_model(tmp_path, warm_start_dir, addition, tokenizer):
    rm = RewardModelFunction(_score_model(tokenizer), tokenizer)
    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0], reward_model=rm)
    trainer.train()
    assert "reward/reward_model/mean" in trainer.state.log_history[0]
