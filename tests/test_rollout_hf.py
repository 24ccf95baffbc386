"""The engine contract and the HF generate engine: padding, EOS masking, truncation, grouping, seeds."""

import pytest
import torch

from verl_hf.rollout import HFCopyEngine, HFGenerateEngine, HFSharedEngine, RolloutEngine, SamplingConfig
from verl_hf.rollout.base import left_pad, mask_after_eos
from verl_hf.rollout.vllm_engine import VLLMEngine
from verl_hf.rollout.vllm_server import VLLMServerEngine


def test_an_engine_that_only_generates_gets_the_safe_defaults(policy):
    class OnlyGenerates(RolloutEngine):
        def generate(self, prompt_ids, params): ...

    engine = OnlyGenerates()
    # Samples from weights nobody syncs: not fed by the sync, not shared, no cast, not the training model.
    assert (engine.receives_weights, engine.shared_by_processes, engine.dtype) == (False, False, None)
    assert not engine.generates_from(policy)
    assert engine.prepare_for_weights() is None and engine.finish_sync() is None and engine.sleep() is None
    for method, args in (("weight_names", ()), ("load_weights", ([],)), ("get_weights", ([],))):
        with pytest.raises(NotImplementedError, match=f"OnlyGenerates has no {method}: .* receives_weights = True"):
            getattr(engine, method)(*args)
    with pytest.raises(TypeError, match="abstract"):
        RolloutEngine()  # generate is the one method every engine writes


def test_every_engine_is_a_rollout_engine(policy, tokenizer):
    for cls in (HFSharedEngine, HFCopyEngine, VLLMEngine, VLLMServerEngine):
        assert issubclass(cls, RolloutEngine), cls
    assert HFGenerateEngine is HFSharedEngine  # the former name
    shared = HFSharedEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    copy = HFCopyEngine.of(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id], dtype=torch.bfloat16)
    assert shared.generates_from(policy) and not shared.receives_weights and shared.dtype == torch.float32
    assert not copy.generates_from(policy) and copy.receives_weights and copy.dtype == torch.bfloat16
    assert not VLLMEngine.shared_by_processes and VLLMServerEngine.shared_by_processes


def test_actor_refuses_an_engine_outside_the_contract(policy, tokenizer):
    from verl_hf.roles import Actor

    class DuckTyped:
        def generate(self, prompt_ids, params): ...

    with pytest.raises(TypeError, match="DuckTyped is not a verl_hf.rollout.RolloutEngine: subclass it"):
        Actor(policy, tokenizer, engine=DuckTyped())


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
    engine = HFSharedEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id])
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
    engine = HFSharedEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    prompts = [tokenizer("What is 47 plus 38?\n").input_ids] * 4
    sample = lambda seed: engine.generate(prompts, SamplingConfig(max_new_tokens=12, seed=seed)).response_ids
    assert torch.equal(sample(1), sample(1))
    greedy = SamplingConfig(max_new_tokens=12, do_sample=False)
    a, b = engine.generate(prompts, greedy), engine.generate(prompts, greedy)
    assert torch.equal(a.response_ids, b.response_ids)
    assert (a.response_ids == a.response_ids[0]).all()  # same prompt, greedy: same answer


def test_generate_restores_training_mode(policy, tokenizer):
    policy.train()
    HFSharedEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id]).generate(
        [[5, 6]], SamplingConfig(max_new_tokens=2))
    assert policy.training


def test_model_generation_config_does_not_change_sampling(policy, tokenizer):
    """A repetition penalty shipped in the model's generation_config must not reach RL sampling."""
    engine = HFSharedEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    prompts = [tokenizer("What is 11 plus 11?\n").input_ids]
    greedy = SamplingConfig(max_new_tokens=10, do_sample=False)
    plain = engine.generate(prompts, greedy).response_ids
    policy.generation_config.repetition_penalty = 5.0
    policy.generation_config.no_repeat_ngram_size = 1
    assert torch.equal(engine.generate(prompts, greedy).response_ids, plain)
    out = policy.generate(torch.tensor(prompts), max_new_tokens=10, do_sample=False,
                          pad_token_id=tokenizer.pad_token_id)  # plain generate does apply them
    assert not torch.equal(out[:, len(prompts[0]):][:, : plain.shape[1]], plain)


@pytest.mark.parametrize("bf16", [False, True])
def test_auto_hf_engine_decodes_in_the_mixed_precision_dtype(policy, tokenizer, bf16):
    """rollout_hf_weights='auto': the policy itself in fp32; under bf16 mixed precision a bf16 copy (with eager
    attention on a CPU, for short sequences), whose attention choice leaves the policy's config alone."""
    from verl_hf import VerlConfig
    from verl_hf.rollout import make_rollout_engine

    args = VerlConfig(output_dir="/tmp/verl-hf-engine", report_to="none", use_cpu=True, bf16=bf16,
                      per_device_train_batch_size=8, num_generations=4)
    policy_attention = policy.config._attn_implementation
    engine = make_rollout_engine(policy, tokenizer, args)
    if not bf16:
        assert isinstance(engine, HFSharedEngine) and engine.generates_from(policy)
        return
    assert isinstance(engine, HFCopyEngine) and engine.dtype == torch.bfloat16
    if not torch.cuda.is_available():
        assert engine.model.config._attn_implementation == "eager"
    assert policy.config._attn_implementation == policy_attention and engine.model.config is not policy.config
