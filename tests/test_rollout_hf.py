"""The HF generate engine: padding, EOS masking, truncation, grouping, seeds."""

import torch

from verl_hf.rollout import HFGenerateEngine, SamplingConfig
from verl_hf.rollout.base import left_pad, mask_after_eos


def test_left_pad_hand_example():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_mask_after_eos_keeps_eos_and_pads_the_rest():
    # EOS = 2. Row 0 stops at t=1; row 1 never stops (truncated); row 2 stops at once; row 3 has two EOS.
    response = torch.tensor([[9, 2, 9, 9], [9, 9, 9, 9], [2, 9, 9, 9], [9, 9, 2, 2]])
    ids, mask, truncated = mask_after_eos(response, eos_ids=[2], pad_id=0)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
    assert ids.tolist() == [[9, 2, 0, 0], [9, 9, 9, 9], [2, 0, 0, 0], [9, 9, 2, 0]]
    assert truncated.tolist() == [False, True, False, False]


def test_generate_groups_rows_and_respects_eos(policy, tokenizer):
    engine = HFGenerateEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    prompts = [tokenizer("What is 12 plus 34?\n").input_ids, tokenizer("What is 5 plus 6?\n").input_ids]
    out = engine.generate(prompts, SamplingConfig(max_new_tokens=12, num_return_sequences=3, seed=0))
    assert out.prompt_ids.shape[0] == out.response_ids.shape[0] == 6
    # Rows 0-2 belong to prompt 0, left-padded to the longer prompt.
    assert out.prompt_ids[0].tolist() == out.prompt_ids[2].tolist()
    assert out.prompt_mask[3].sum() == len(prompts[1])
    for ids, mask, trunc in zip(out.response_ids, out.response_mask, out.truncated):
        valid = ids[mask.bool()].tolist()
        assert (tokenizer.eos_token_id in valid) != bool(trunc)
        if not trunc:
            assert valid.index(tokenizer.eos_token_id) == len(valid) - 1
        assert (ids[~mask.bool()] == tokenizer.pad_token_id).all()


def test_seed_makes_sampling_repeatable_and_greedy_is_deterministic(policy, tokenizer):
    engine = HFGenerateEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    prompts = [tokenizer("What is 47 plus 38?\n").input_ids] * 4
    sample = lambda seed: engine.generate(prompts, SamplingConfig(max_new_tokens=12, seed=seed)).response_ids
    assert torch.equal(sample(1), sample(1))
    greedy = SamplingConfig(max_new_tokens=12, do_sample=False)
    a, b = engine.generate(prompts, greedy), engine.generate(prompts, greedy)
    assert torch.equal(a.response_ids, b.response_ids)
    assert (a.response_ids == a.response_ids[0]).all()  # same prompt, greedy: same answer


def test_generate_restores_training_mode(policy, tokenizer):
    policy.train()
    HFGenerateEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id]).generate(
        [[5, 6]], SamplingConfig(max_new_tokens=2))
    assert policy.training


def test_model_generation_config_does_not_change_sampling(policy, tokenizer):
    """A repetition penalty shipped in the model's generation_config must not reach RL sampling."""
    engine = HFGenerateEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    prompts = [tokenizer("What is 11 plus 11?\n").input_ids]
    greedy = SamplingConfig(max_new_tokens=10, do_sample=False)
    plain = engine.generate(prompts, greedy).response_ids
    policy.generation_config.repetition_penalty = 5.0
    policy.generation_config.no_repeat_ngram_size = 1
    assert torch.equal(engine.generate(prompts, greedy).response_ids, plain)
    out = policy.generate(torch.tensor(prompts), max_new_tokens=10, do_sample=False,
                          pad_token_id=tokenizer.pad_token_id)  # plain generate does apply them
    assert not torch.equal(out[:, len(prompts[0]):][:, : plain.shape[1]], plain)
