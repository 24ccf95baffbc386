"""Roles: log-probs match what generate sampled from; the reference never carries a graph."""

import torch

from verl_hf.batch import RolloutBatch
from verl_hf.roles import Actor, ReferencePolicy, sequence_logprobs
from verl_hf.rollout import HFGenerateEngine, SamplingConfig


def _rollout(policy, tokenizer, temperature):
    engine = HFGenerateEngine(policy, tokenizer.pad_token_id, [tokenizer.eos_token_id])
    actor = Actor(policy, tokenizer, engine, temperature=temperature)
    prompts = [tokenizer(p).input_ids for p in ["What is 12 plus 34?\n", "What is 99 plus 1?\n"]]
    params = SamplingConfig(max_new_tokens=10, num_return_sequences=2, temperature=temperature, seed=0)
    return actor, actor.generate_sequences(prompts, params, [{"prompt": "a", "answer": "46"}, {"prompt": "b", "answer": "100"}])


def test_logprobs_equal_generate_scores(policy, tokenizer):
    """Forward-pass log-probs of the sampled tokens equal generate's own (temperature-scaled) scores."""
    temperature = 0.7
    actor, batch = _rollout(policy, tokenizer, temperature)
    enc = tokenizer(["What is 12 plus 34?\n"] * 2 + ["What is 99 plus 1?\n"] * 2, return_tensors="pt", padding=True)
    # Re-score with generate's scores: output_scores are the processed (temperature-divided) logits.
    out = policy.generate(**enc, max_new_tokens=batch.response_ids.shape[1], do_sample=False, output_scores=True,
                          return_dict_in_generate=True, temperature=None, top_p=None, top_k=None,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    greedy = RolloutBatch(
        prompt_ids=enc.input_ids, prompt_mask=enc.attention_mask, response_ids=out.sequences[:, enc.input_ids.shape[1]:],
        response_mask=torch.ones_like(out.sequences[:, enc.input_ids.shape[1]:]), group_ids=torch.arange(4),
        truncated=torch.zeros(4, dtype=torch.bool))
    expected = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], dim=1)
    expected = expected.gather(-1, greedy.response_ids.unsqueeze(-1)).squeeze(-1)
    got, _ = sequence_logprobs(policy, greedy, temperature=1.0)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    # And the actor's no-grad path agrees with the differentiable one, micro-batched or not.
    with_grad, _ = sequence_logprobs(policy, batch, temperature)
    torch.testing.assert_close(actor.get_logprobs(batch, micro_batch_size=1), with_grad.detach(), atol=1e-5, rtol=1e-5)


def test_generate_sequences_repeats_columns_per_response(policy, tokenizer):
    _, batch = _rollout(policy, tokenizer, 1.0)
    assert batch.columns["answer"] == ["46", "46", "100", "100"]
    assert batch.prompts == ["a", "a", "b", "b"]
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert len(batch.completions) == 4


def test_reference_is_frozen_and_graph_free(policy, tokenizer):
    actor, batch = _rollout(policy, tokenizer, 1.0)
    ref = ReferencePolicy.from_actor(policy)
    assert all(not p.requires_grad for p in ref.model.parameters())
    ref_logprobs = ref.get_logprobs(batch, micro_batch_size=2)
    assert not ref_logprobs.requires_grad
    # Same weights as the actor at the start: KL is exactly zero.
    batch.ref_logprobs = ref_logprobs
    logprobs, _ = sequence_logprobs(policy, batch)
    assert ref.kl_divergence(batch, logprobs.detach(), "k3").abs().max() < 1e-5
    # Training the actor does not move the reference.
    with torch.no_grad():
        next(policy.parameters()).add_(0.5)
    assert not torch.allclose(ref.get_logprobs(batch, 2), sequence_logprobs(policy, batch)[0].detach())
    torch.testing.assert_close(ref.get_logprobs(batch, 2), ref_logprobs)
