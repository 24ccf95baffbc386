"""GKD's dataset share (gkd_lambda): which rounds take the dataset's answers, and those answers as a batch of
the engine's layout, by hand on the demo tokenizer."""

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from verl_hf.dataset_answers import answer_text, check_answer_column, dataset_answers, samples_on_policy

WARM_START = str(Path(__file__).resolve().parents[1] / "verl_hf/demo/warm_start")


def test_the_draw_is_the_share_and_depends_only_on_seed_and_step():
    assert all(samples_on_policy(1.0, 0, step) for step in range(50))
    assert not any(samples_on_policy(0.0, 0, step) for step in range(50))
    draws = [samples_on_policy(0.3, 7, step) for step in range(2000)]
    assert 0.27 < sum(draws) / len(draws) < 0.33
    assert draws == [samples_on_policy(0.3, 7, step) for step in range(2000)]  # every process, every resume
    assert draws != [samples_on_policy(0.3, 8, step) for step in range(2000)]


def test_dataset_answers_have_the_engine_layout():
    """Two prompts of different lengths, two copies each; answers end in EOS, the long one is cut to the limit
    and marked truncated; prompts left-padded, responses right-padded with the pad id."""
    tokenizer = AutoTokenizer.from_pretrained(WARM_START)
    rows = [{"prompt": "p0", "prompt_ids": [5, 6, 7], "completion": "12", "answer": "12"},
            {"prompt": "p1", "prompt_ids": [8], "completion": [{"role": "assistant", "content": "3456789"}],
             "answer": "3456789"}]
    short, long = (tokenizer("12", add_special_tokens=False)["input_ids"],
                   tokenizer("3456789", add_special_tokens=False)["input_ids"])
    limit = len(short) + 1
    assert len(long) + 1 > limit  # the second answer does not fit
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    batch = dataset_answers(rows, tokenizer, [eos], num_generations=2, max_response_length=limit)
    assert batch.prompt_ids.tolist() == [[5, 6, 7]] * 2 + [[pad, pad, 8]] * 2
    assert batch.prompt_mask.tolist() == [[1, 1, 1]] * 2 + [[0, 0, 1]] * 2
    assert batch.response_ids.tolist() == [short + [eos]] * 2 + [long[:limit]] * 2
    assert batch.response_mask.tolist() == [[1] * limit] * 4
    assert batch.truncated.tolist() == [False, False, True, True]
    assert batch.group_ids.tolist() == [0, 0, 1, 1] and batch.rollout_logprobs is None and batch.from_dataset
    assert batch.prompts == ["p0", "p0", "p1", "p1"] and batch.completions[0] == "12"
    assert batch.columns["answer"] == ["12", "12", "3456789", "3456789"]


def test_padded_answers_are_masked():
    tokenizer = AutoTokenizer.from_pretrained(WARM_START)
    rows = [{"prompt_ids": [5], "completion": "1"}, {"prompt_ids": [6], "completion": "123"}]
    batch = dataset_answers(rows, tokenizer, [tokenizer.eos_token_id], num_generations=1, max_response_length=16)
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in ("1", "123")]
    assert batch.response_mask.sum(dim=1).tolist() == lengths
    assert torch.all(batch.response_ids[0, lengths[0]:] == tokenizer.pad_token_id)


def test_an_answer_ends_where_the_engines_would_end_it():
    """An answer that already ends in EOS gets no second one; an answer holding an id that ends responses (the
    generation config's, not the tokenizer's) stops there, as the engines' samples stop."""
    tokenizer = AutoTokenizer.from_pretrained(WARM_START)
    eos, other_end = tokenizer.eos_token_id, tokenizer("9", add_special_tokens=False)["input_ids"][-1]
    rows = [{"prompt_ids": [5], "completion": "12" + tokenizer.eos_token}, {"prompt_ids": [6], "completion": "3 9 4"}]
    batch = dataset_answers(rows, tokenizer, [eos, other_end], num_generations=1, max_response_length=16)
    first = tokenizer("12", add_special_tokens=False)["input_ids"] + [eos]
    second = tokenizer("3 9", add_special_tokens=False)["input_ids"]
    assert second[-1] == other_end
    assert batch.response_mask.sum(dim=1).tolist() == [len(first), len(second)]
    assert batch.response_ids[0, : len(first)].tolist() == first and not batch.truncated.any()
    assert batch.response_ids[1, : len(second)].tolist() == second


@pytest.mark.parametrize("completion", [None, 3, [{"role": "user", "content": "hi"}],
                                        [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]])
def test_an_answer_of_another_form_is_refused_naming_the_row(completion):
    with pytest.raises(ValueError, match=r"row 4 holds .*give each row a string, or a list of one assistant message"):
        answer_text(completion, 4)


def test_a_dataset_without_answers_is_refused_with_the_fix():
    from datasets import Dataset

    with pytest.raises(ValueError, match=r"its 'completion' column, which it lacks \(columns: \['prompt'\]\).*"
                                         r"data_key_map"):
        check_answer_column(Dataset.from_list([{"prompt": "1+1="}]))
    with pytest.raises(ValueError, match=r"row 1 holds None"):
        check_answer_column(Dataset.from_list([{"prompt": "a", "completion": "x"}, {"prompt": "b", "completion": None}]))
    renamed = Dataset.from_list([{"prompt": "a", "response": "x"}, {"prompt": "b", "response": None}])
    with pytest.raises(ValueError, match=r"row 1 holds None"):  # data_key_map names the column
        check_answer_column(renamed, {"completion": "response"})
