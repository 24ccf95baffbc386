"""Roles on the tiny model: shapes, masks, log-prob agreement, frozen reference, critic values, placement."""

import pytest
import torch

from verl_hf import Actor, Critic, ReferencePolicy, ResourcePool, RLHFDataset
from verl_hf.batch import RolloutBatch
from verl_hf.roles import sequence_logprobs

PROMPTS = ["What is 12 plus 34?\n", "What is 99 plus 10?\n"]


@pytest.fixture()
def actor(policy, tokenizer):
    return Actor(policy, tokenizer, temperature=0.7)


def test_generate_sequences_shapes_masks_and_columns(actor, addition):
    data = RLHFDataset(addition[1].select(range(3)), actor.tokenizer, max_prompt_length=32)
    batch = next(iter(data.dataloader(batch_size=3, shuffle=False)))
    out = actor.generate_sequences(batch, max_new_tokens=10, num_return_sequences=2, seed=0)
    assert isinstance(out, RolloutBatch) and len(out) == 6
    assert out.prompt_ids.shape == out.prompt_mask.shape and out.prompt_ids.shape[0] == 6
    assert out.response_ids.shape == out.response_mask.shape == out.rollout_logprobs.shape
    assert out.response_ids.shape[1] <= 10
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert out.columns["answer"][0] == out.columns["answer"][1] == addition[1]["answer"][0]
    assert (out.rollout_logprobs[out.response_mask == 0] == 0).all()
    assert out.input_ids.shape == out.attention_mask.shape


def test_sampling_logprobs_equal_scoring_logprobs(actor):
    """What generate recorded while sampling equals a fresh forward pass (temperature applied in both)."""
    out = actor.generate_sequences(PROMPTS, max_new_tokens=10, num_return_sequences=3, seed=1)
    rescored = actor.get_logprobs(out, micro_batch_size=2)
    torch.testing.assert_close(rescored * out.response_mask, out.rollout_logprobs, atol=1e-4, rtol=1e-4)


def test_input_ids_and_prompt_ids_forms_agree(actor):
    enc = actor.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    a = actor.generate_sequences(input_ids=enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=8,
                                 do_sample=False)
    b = actor.generate_sequences(prompt_ids=[actor.tokenizer(p).input_ids for p in PROMPTS], max_new_tokens=8,
                                 do_sample=False)
    assert torch.equal(a.response_ids, b.response_ids) and a.completions == b.completions
    with pytest.raises(ValueError, match="needs prompts, prompt_ids= or input_ids="):
        actor.generate_sequences()


def test_logprobs_equal_generate_scores(policy, tokenizer):
    """Forward-pass log-probs of greedy tokens equal generate's own output_scores."""
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    out = policy.generate(**enc, max_new_tokens=8, do_sample=False, output_scores=True, return_dict_in_generate=True,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    response = out.sequences[:, enc.input_ids.shape[1]:]
    batch = RolloutBatch(prompt_ids=enc.input_ids, prompt_mask=enc.attention_mask, response_ids=response,
                         response_mask=torch.ones_like(response), group_ids=torch.arange(2),
                         truncated=torch.zeros(2, dtype=torch.bool))
    expected = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
    expected = expected.gather(-1, response.unsqueeze(-1)).squeeze(-1)
    got, entropy = sequence_logprobs(policy, batch, with_entropy=True)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert entropy.shape == got.shape and (entropy >= 0).all()


def test_actor_update_changes_weights_and_lowers_loss(actor):
    out = actor.generate_sequences(PROMPTS, max_new_tokens=8, num_return_sequences=2, seed=0)
    before = [p.clone() for p in actor.model.parameters()]
    losses = []
    for _ in range(3):
        logprobs, _ = actor.compute_logprobs(out)
        loss = -(logprobs * out.response_mask).sum() / out.response_mask.sum()
        losses.append(loss.item())
        actor.update(loss)
    assert losses[-1] < losses[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, actor.model.parameters()))


def test_reference_is_frozen_graph_free_and_kl_zero_at_start(policy, tokenizer, actor):
    out = actor.generate_sequences(PROMPTS, max_new_tokens=8, num_return_sequences=2, seed=0)
    ref = ReferencePolicy.from_actor(policy, temperature=0.7)
    assert all(not p.requires_grad for p in ref.model.parameters())
    with torch.enable_grad():
        ref_logprobs = ref.get_logprobs(out)
    assert not ref_logprobs.requires_grad
    assert ref.kl_divergence(out).abs().max() < 1e-4  # the rollout's own log-probs vs identical weights
    logprobs, _ = actor.compute_logprobs(out)
    kl = ref.kl_divergence(out, logprobs, kind="k3")
    assert kl.abs().max() < 1e-5 and kl.shape == out.response_ids.shape
    with torch.no_grad():
        next(policy.parameters()).add_(0.5)  # the actor moves, the reference does not
    torch.testing.assert_close(ref.get_logprobs(out), ref_logprobs)


def test_critic_values_shapes_and_training(warm_start_dir, tokenizer, actor):
    critic = Critic.from_pretrained(warm_start_dir, learning_rate=1e-2)
    out = actor.generate_sequences(PROMPTS, max_new_tokens=8, num_return_sequences=2, seed=0)
    values = critic.compute_values(out)
    assert values.shape == out.response_ids.shape and not values.requires_grad
    assert (values[out.response_mask == 0] == 0).all()
    target = torch.ones_like(values)
    for _ in range(20):
        v = critic.forward_values(out)
        critic.update(((v - target) ** 2 * out.response_mask).sum() / out.response_mask.sum())
    after = critic.compute_values(out)
    assert ((after - target).abs() * out.response_mask).sum() < ((values - target).abs() * out.response_mask).sum()
    with pytest.raises(ValueError, match="num_labels=1"):
        Critic(actor.model)


def test_from_pretrained_passes_hf_options(warm_start_dir):
    actor = Actor.from_pretrained(warm_start_dir, dtype=torch.bfloat16, attn_implementation="eager")
    assert actor.model.dtype == torch.bfloat16 and actor.model.config._attn_implementation == "eager"
    assert actor.tokenizer.pad_token == "<pad>"


def test_deploy_places_weights_on_the_slice(policy, tokenizer):
    pool = ResourcePool(["cpu", "cpu"], name="test")
    assert pool.slice(1, 2).devices == [torch.device("cpu")]
    ref = ReferencePolicy(policy).deploy(pool.slice(0, 1))
    assert all(p.device == torch.device("cpu") for p in ref.model.parameters())
    with pytest.raises(ValueError, match="outside pool"):
        pool.slice(1, 3)
    with pytest.raises(ValueError, match="a trained role takes one device"):
        Actor(policy, tokenizer).deploy(pool)


def test_rlhf_dataset_multi_turn_chat_and_response_length(tokenizer):
    from datasets import Dataset

    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    chats = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
              {"role": "user", "content": "What is 2 plus 2?"}]] * 2
    data = RLHFDataset(Dataset.from_dict({"prompt": chats, "answer": ["4", "4"]}), tok, max_prompt_length=200,
                       max_response_length=5)
    batch = next(iter(data.dataloader(batch_size=2, shuffle=False)))
    assert batch["prompt_ids"][0] == tok("user: Hi\nassistant: Hello\nuser: What is 2 plus 2?\nassistant:").input_ids
    assert batch["answer"] == ["4", "4"] and len(batch["rows"]) == 2
    out = Actor(Actor.auto_class.from_pretrained(tokenizer.name_or_path), tok).generate_sequences(batch, seed=0)
    assert out.response_ids.shape[1] <= 5 and out.prompts[0] == chats[0]


def test_save_pretrained_round_trip(actor, tmp_path):
    actor.save_pretrained(str(tmp_path))
    again = Actor.from_pretrained(str(tmp_path))
    for a, b in zip(actor.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)
    assert again.tokenizer.decode(again.tokenizer("#### 12").input_ids) == "#### 12"
