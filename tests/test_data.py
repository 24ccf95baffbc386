"""Prompt preparation and the round sampler."""

import pytest
from datasets import Dataset

from verl_hf.data import RoundBatchSampler, apply_key_map, prepare_prompts, tokenize_prompt


def test_key_map_renames_and_checks(tokenizer):
    data = Dataset.from_dict({"question": ["a"], "solution": ["1"]})
    mapped = apply_key_map(data, {"prompt": "question", "answer": "solution"}, "train")
    assert mapped.column_names == ["prompt", "answer"]
    with pytest.raises(ValueError, match=r"maps 'prompt' to column 'q', but the train dataset has columns"):
        apply_key_map(data, {"prompt": "q"}, "train")
    with pytest.raises(ValueError, match="already has a 'prompt' column"):
        apply_key_map(Dataset.from_dict({"prompt": ["a"], "q": ["b"]}), {"prompt": "q"}, "train")


def test_long_prompts_dropped_and_counted(tokenizer, caplog):
    data = Dataset.from_dict({"prompt": ["short", "x" * 50, "also short"], "answer": ["1", "2", "3"]})
    with caplog.at_level("WARNING"):
        out = prepare_prompts(data, tokenizer, None, max_prompt_length=20, split="train")
    assert out["answer"] == ["1", "3"]
    assert "dropped 1 of 3 prompts" in caplog.text
    assert out["prompt_ids"][0] == tokenizer("short").input_ids
    with pytest.raises(ValueError, match="every train prompt is longer than max_prompt_length=2"):
        prepare_prompts(data, tokenizer, None, max_prompt_length=2, split="train")


def test_chat_prompts_use_the_template(tokenizer):
    messages = [{"role": "user", "content": "What is 1 plus 2?"}]
    with pytest.raises(ValueError, match="no chat_template"):
        tokenize_prompt(tokenizer, messages)
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    assert tokenize_prompt(tok, messages) == tok("user: What is 1 plus 2?\nassistant:").input_ids
    with pytest.raises(ValueError, match="must be text or a list of chat messages"):
        tokenize_prompt(tok, 42)


def test_round_sampler_repeats_rounds_and_splits_processes():
    per_process = [list(RoundBatchSampler(10, prompts_per_round=2, repeats=3, num_processes=2, process_index=r, seed=1))
                   for r in range(2)]
    for batches in per_process:
        assert len(batches) == 6  # 10 // (2 prompts * 2 processes) = 2 rounds, 3 repeats each
        assert batches[0] == batches[1] == batches[2] and batches[3] == batches[4] == batches[5]
    seen = [i for batches in per_process for b in batches[::3] for i in b]
    assert len(seen) == len(set(seen)) == 8  # disjoint prompts across processes and rounds


def test_round_sampler_epochs_reshuffle_deterministically():
    sampler = RoundBatchSampler(8, prompts_per_round=4, repeats=1, seed=0)
    first = list(sampler)
    assert list(sampler) == first
    sampler.set_epoch(1)
    assert list(sampler) != first
    with pytest.raises(ValueError, match="one rollout round takes 4 prompts on each of 4 processes"):
        RoundBatchSampler(8, prompts_per_round=4, repeats=1, num_processes=4)
