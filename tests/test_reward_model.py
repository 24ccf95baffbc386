"""RewardModel: scores text with its own tokenizer; works as a reward function in VerlTrainer."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers

from conftest import small_config
from verl_hf import Actor, RewardModel, VerlTrainer


def _score_model(vocab_size, pad_id, num_labels=1):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=1, head_dim=64, num_labels=num_labels, pad_token_id=pad_id)
    return LlamaForSequenceClassification(config)


def _word_tokenizer():
    """A tokenizer unlike the policy's (whole words, not characters)."""
    words = ["<pad>", "<unk>", "What", "is", "plus", "?", "####"] + [str(i) for i in range(200)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")


def test_different_tokenizer_scores_the_same_text_as_a_direct_call(policy, tokenizer):
    rm_tok = _word_tokenizer()
    model = _score_model(len(rm_tok), rm_tok.pad_token_id)
    rm = RewardModel(model, rm_tok)
    actor = Actor(policy, tokenizer)
    seqs = actor.generate_sequences(["What is 12 plus 34?\n", "What is 5 plus 60?\n"], max_new_tokens=10,
                                    num_return_sequences=2, seed=0)
    scores = rm.score(seqs)
    assert scores.shape == (4,)
    for i in range(4):
        text = seqs.prompts[i] + seqs.completions[i]
        with torch.no_grad():
            direct = model(**rm_tok([text], return_tensors="pt")).logits[0, 0].item()
        assert scores[i].item() == pytest.approx(direct, abs=1e-5)


def test_two_labels_need_a_label_index(tokenizer):
    model = _score_model(len(tokenizer), tokenizer.pad_token_id, num_labels=2)
    with pytest.raises(ValueError, match="num_labels=2; say which logit is the reward with label_index"):
        RewardModel(model, tokenizer)
    rm = RewardModel(model, tokenizer, label_index=1)
    with torch.no_grad():
        expected = model(**tokenizer(["What is 1 plus 2?\n#### 3"], return_tensors="pt")).logits[0, 1].item()
    assert rm(["What is 1 plus 2?\n"], ["#### 3"])[0] == pytest.approx(expected, abs=1e-5)


def test_trainer_with_reward_model(tmp_path, warm_start_dir, addition, tokenizer):
    rm = RewardModel(_score_model(len(tokenizer), tokenizer.pad_token_id), tokenizer)
    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0], reward_model=rm)
    trainer.train()
    assert "reward/reward_model/mean" in trainer.state.log_history[0]


def test_reward_models_from_config_paths_with_label_index(tmp_path, warm_start_dir, addition, tokenizer):
    """Two reward models named in VerlConfig: a one-label model with a word tokenizer unlike the policy's, and a
    two-label classifier whose logit 1 is the reward (reward_model_label_index). Without the index: a clear
    error before training."""
    word_tok = _word_tokenizer()
    one, two = tmp_path / "rm_words", tmp_path / "rm_two_labels"
    _score_model(len(word_tok), word_tok.pad_token_id).save_pretrained(one)
    word_tok.save_pretrained(one)
    _score_model(len(tokenizer), tokenizer.pad_token_id, num_labels=2).save_pretrained(two)
    tokenizer.save_pretrained(two)
    args = small_config(tmp_path, reward_funcs=["gsm8k"], reward_weights=[1.0, 0.5, 0.5], max_steps=1,
                        reward_model_path=[str(one), str(two)], reward_model_label_index=1)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0])
    assert [name for name, _ in trainer.reward_funcs] == ["gsm8k", "reward_model", "reward_model_1"]
    trainer.train()
    logged = trainer.state.log_history[0]
    assert {"reward/reward_model/mean", "reward/reward_model_1/mean"} <= set(logged)
    with pytest.raises(ValueError, match="reward_model_label_index"):
        VerlTrainer(model=warm_start_dir, train_dataset=addition[0],
                    args=small_config(tmp_path, reward_model_path=str(two), reward_weights=None))


def test_a_reward_model_scores_the_whole_conversation_of_a_multi_turn_row(tokenizer):
    """Multi-turn rows: the reward model reads the tool call and its result, not only the final answer; a
    template that cannot render a `tool` turn is an error that says what to do."""
    from verl_hf.demo.tools_task import conversation

    rm_tok = _word_tokenizer()
    rm_tok.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
    model = _score_model(len(rm_tok), rm_tok.pad_token_id)
    rm = RewardModel(model, rm_tok)
    messages = conversation(123, 456, use_tool=True)
    text = "".join(f"{m['role']} {m['content']}\n" for m in messages)
    with torch.no_grad():
        direct = model(**rm_tok([text], return_tensors="pt")).logits[0, 0].item()
    statuses = [["ok"]]  # the multi-turn loop's column: what tells its rows from a dataset's own `messages`
    assert rm(["unused"], ["#### 56088"], messages=[messages], tool_statuses=statuses)[0] == pytest.approx(direct,
                                                                                                        abs=1e-5)
    alone = rm([messages[:1]], ["#### 56088"])[0]
    assert alone != pytest.approx(direct, abs=1e-5)  # the tool exchange changed what was scored
    # a single-turn run whose dataset has a `messages` column (a reference chat): the completion is scored
    assert rm([messages[:1]], ["#### 56088"], messages=[messages])[0] == pytest.approx(alone, abs=1e-6)
    rm_tok.chat_template = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
                            "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
                            "{{ m['content'] }}{% endfor %}")
    with pytest.raises(ValueError, match=r"cannot render this conversation \(roles \['assistant', 'tool', 'user'\]\)"
                                         r".*Give the reward model a tokenizer whose template renders them"):
        rm(["unused"], ["#### 56088"], messages=[messages], tool_statuses=statuses)
