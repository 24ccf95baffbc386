"""RolloutBatch: selecting and splitting keep every field aligned."""

import torch

from verl_hf.batch import RolloutBatch


def _batch():
    return RolloutBatch(
        prompt_ids=torch.arange(8).view(4, 2), prompt_mask=torch.ones(4, 2, dtype=torch.long),
        response_ids=torch.arange(12).view(4, 3), response_mask=torch.tensor([[1, 1, 0]] * 4),
        group_ids=torch.tensor([0, 0, 1, 1]), truncated=torch.zeros(4, dtype=torch.bool),
        prompts=["a", "a", "b", "b"], completions=["w", "x", "y", "z"], columns={"answer": ["1", "1", "2", "2"]},
        rewards=torch.tensor([1.0, 0.0, 0.5, 0.5]),
    )


def test_split_and_select_cut_every_field():
    first, second = _batch().split(2)
    assert second.prompts == ["b", "b"] and second.completions == ["y", "z"]
    assert second.columns == {"answer": ["2", "2"]}
    assert second.rewards.tolist() == [0.5, 0.5] and second.response_ids.tolist() == [[6, 7, 8], [9, 10, 11]]
    picked = _batch().select(torch.tensor([True, False, False, True]))
    assert picked.completions == ["w", "z"] and picked.group_ids.tolist() == [0, 1]
    assert picked.advantages is None  # unset fields stay unset


def test_input_ids_and_attention_mask_join_prompt_and_response():
    b = _batch()
    assert b.input_ids.shape == (4, 5)
    assert b.attention_mask[0].tolist() == [1, 1, 1, 1, 0]


def test_concat_pads_and_keeps_groups_apart():
    from verl_hf.batch import concat_batches

    a = _batch()
    b = RolloutBatch(
        prompt_ids=torch.tensor([[7, 7, 7]]), prompt_mask=torch.ones(1, 3, dtype=torch.long),
        response_ids=torch.tensor([[5]]), response_mask=torch.tensor([[1]]), group_ids=torch.tensor([0]),
        truncated=torch.zeros(1, dtype=torch.bool), prompts=["c"], completions=["v"], columns={"answer": ["3"]},
        rewards=torch.tensor([2.0]),
    )
    c = concat_batches([a, b], pad_token_id=0)
    assert len(c) == 5 and c.prompt_ids.shape == (5, 3) and c.response_ids.shape == (5, 3)
    assert c.prompt_ids[0].tolist() == [0, 0, 1] and c.prompt_mask[0].tolist() == [0, 1, 1]  # left-padded
    assert c.response_ids[4].tolist() == [5, 0, 0] and c.response_mask[4].tolist() == [1, 0, 0]  # right-padded
    assert c.group_ids.tolist() == [0, 0, 1, 1, 2]
    assert c.completions[-1] == "v" and c.columns["answer"][-1] == "3" and c.rewards.tolist()[-1] == 2.0
