"""MoE rollout routing replay (verl_hf/routing.py): the weights of replayed experts by hand, replaying a
forward's own routes changes nothing, other routes change the output and the router keeps its gradient,
gradient checkpointing replays in backward, routes travel through the batch and both engines' layouts, bad
setups are refused, and a VerlTrainer run replays the HF engine's routes (bf16 sampling copy, fp32 update)."""

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from architectures import build, build_tokenizer, chat_prompts, digit_share  # noqa: E402
from conftest import small_config  # noqa: E402

from verl_hf.batch import RolloutBatch, concat_batches  # noqa: E402
from verl_hf.routing import (NO_ROUTE, RoutingReplay, moe_routers, recorded_routes, replayed_scores,  # noqa: E402
                             routes_from_vllm)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    directory, tokenizer = tmp_path_factory.mktemp("moe"), build_tokenizer()
    return {"moe": build("qwen3_moe", directory, tokenizer), "dense": build("qwen3", directory, tokenizer),
            "tokenizer": tokenizer}


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def prompt_ids(tokenizer, num=4):
    return [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                          return_dict=False) for row in chat_prompts(num)]


class _Router(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm_topk_prob = norm


def test_replayed_scores_by_hand():
    logits, chosen = torch.tensor([[1.0, 2.0, 3.0, 0.0]]), torch.tensor([[2, 0]])
    # softmax: e^3 / Z = 0.643914, e^1 / Z = 0.087144 (Z = e + e^2 + e^3 + 1 = 31.19287); renormalised over
    # the two: 1 / (1 + e^-2) = 0.880797 and 0.119203.
    assert torch.allclose(replayed_scores(_Router(False), logits, chosen, torch.float32),
                          torch.tensor([[0.643914, 0.087144]]), atol=1e-6)
    assert torch.allclose(replayed_scores(_Router(True), logits, chosen, torch.float32),
                          torch.tensor([[0.880797, 0.119203]]), atol=1e-6)
    gpt_oss = type("GptOssTopKRouter", (torch.nn.Module,), {})()  # softmax over the chosen logits [3, 0]
    assert torch.allclose(replayed_scores(gpt_oss, logits, torch.tensor([[2, 3]]), torch.float32),
                          torch.tensor([[0.952574, 0.047426]]), atol=1e-6)  # 1 / (1 + e^-3)


# Every router the replay knows, as transformers builds it: replaying a forward's own routes gives that
# forward's logits bit for bit (so replayed_scores weighs experts exactly as each router does, dtype included).
TINY_MOE = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                      norm_topk_prob=True),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, layer_types=["full_attention"] * 2),
}


@pytest.mark.parametrize("model_type", sorted(TINY_MOE))
def test_every_known_router_replays_its_own_routes_exactly(model_type):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, **TINY_MOE[model_type])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 64, (2, 9))
    routes = _forward_routes(model, ids)
    with torch.no_grad():
        live = model(ids).logits
    replay = RoutingReplay(model)
    with replay.replaying(routes[:, :4], routes[:, 4:]), torch.no_grad():
        assert torch.equal(model(ids).logits, live)
    assert replay.take_metrics() == {"moe/replay_agreement": 1.0}


def test_routers_found_and_bad_models_refused(built):
    assert sorted(moe_routers(load(built["moe"]))) == [0, 1]
    with pytest.raises(ValueError, match="Qwen3ForCausalLM has no MoE router"):
        moe_routers(load(built["dense"]))
    model = load(built["moe"])
    model.model.layers[0].mlp.gate.__class__ = type("DeepseekV3TopKRouter", (torch.nn.Module,), {})
    with pytest.raises(ValueError, match=r"DeepseekV3TopKRouter.*routing_replay=False"):
        moe_routers(model)


def _forward_routes(model, ids):
    """The routes of one forward over ids (B, T), shaped (B, T, L, k)."""
    with recorded_routes(model) as forwards, torch.no_grad():
        model(ids)
    return forwards[0].reshape(*ids.shape, *forwards[0].shape[1:])


def _other_routes(routes, shift: int):
    """Routes with another first expert everywhere (the second kept distinct from it), 4 experts."""
    other = routes.clone()
    other[..., 0] = (routes[..., 0] + shift) % 4
    other[..., 1] = torch.where(other[..., 0] == routes[..., 1], routes[..., 0], routes[..., 1])
    return other


def test_own_routes_change_nothing_and_others_do(built):
    model = load(built["moe"])
    ids = torch.tensor([prompt_ids(built["tokenizer"], 2)[0][:12], prompt_ids(built["tokenizer"], 2)[1][:12]])
    routes = _forward_routes(model, ids)
    with torch.no_grad():
        live = model(ids).logits
    replay = RoutingReplay(model)
    with replay.replaying(routes[:, :5], routes[:, 5:]), torch.no_grad():
        same = model(ids).logits
    assert torch.equal(same, live)
    assert replay.take_metrics() == {"moe/replay_agreement": 1.0}
    other = _other_routes(routes, 1)
    with replay.replaying(other[:, :5], other[:, 5:]):
        changed = model(ids).logits
        changed.sum().backward()
    assert not torch.allclose(changed, live, atol=1e-4)
    assert replay.take_metrics()["moe/replay_agreement"] < 0.5
    assert model.model.layers[1].mlp.gate.weight.grad.abs().sum() > 0  # the router still learns
    with torch.no_grad():
        assert torch.equal(model(ids).logits, live)  # outside `replaying` the model routes live again


def test_gradient_checkpointing_replays_in_backward(built):
    model = load(built["moe"])
    ids = torch.tensor([prompt_ids(built["tokenizer"], 1)[0][:10]])
    routes = _forward_routes(model, ids)
    other = _other_routes(routes, 2)
    replay = RoutingReplay(model)
    grads = []
    for checkpointing in (False, True):
        model.zero_grad()
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with replay.replaying(other[:, :4], other[:, 4:]):
            model(ids).logits.square().mean().backward()
        grads.append(model.model.layers[0].mlp.experts.gate_up_proj.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)  # the recompute in backward replayed the same routes
    model.zero_grad()
    with replay.replaying(other[:, :4], other[:, 4:]):
        loss = model(ids).logits.square().mean()
    with pytest.raises(RuntimeError, match="outside RoutingReplay.replaying"):
        loss.backward()


def test_hf_engine_routes_replay_its_own_samples(built):
    from verl_hf.roles import Actor

    model, tokenizer = load(built["moe"]), built["tokenizer"]
    actor = Actor(model, tokenizer, routing_replay=True)
    batch = actor.generate_sequences(prompt_ids=prompt_ids(tokenizer), max_new_tokens=6, num_return_sequences=2,
                                     seed=0)
    assert batch.prompt_routes.shape == (*batch.prompt_ids.shape, 2, 2)
    assert batch.response_routes.shape == (*batch.response_ids.shape, 2, 2)
    assert (batch.prompt_routes[batch.prompt_mask == 0] == NO_ROUTE).all()
    assert (batch.prompt_routes[batch.prompt_mask == 1] >= 0).all()
    assert (batch.response_routes[:, -1] == NO_ROUTE).all()  # the last token never ran through the model
    gap = (actor.get_logprobs(batch) - batch.rollout_logprobs)[batch.response_mask.bool()].abs()
    assert gap.max() < 1e-5
    assert actor.routing_metrics()["moe/replay_agreement"] > 0.99
    # evaluation and ReMax baselines ask for no routes
    assert actor.generate_sequences(prompt_ids=prompt_ids(tokenizer, 1), max_new_tokens=2,
                                    return_routes=False).prompt_routes is None


def _batch(prompt_width, response_width, fill):
    rows = 2
    return RolloutBatch(
        prompt_ids=torch.ones(rows, prompt_width, dtype=torch.long), prompt_mask=torch.ones(rows, prompt_width),
        response_ids=torch.ones(rows, response_width, dtype=torch.long),
        response_mask=torch.ones(rows, response_width), group_ids=torch.zeros(rows, dtype=torch.long),
        truncated=torch.zeros(rows, dtype=torch.bool),
        prompt_routes=torch.full((rows, prompt_width, 2, 2), fill, dtype=torch.int16),
        response_routes=torch.full((rows, response_width, 2, 2), fill, dtype=torch.int16))


def test_routes_follow_the_batch():
    joined = concat_batches([_batch(3, 2, 1), _batch(5, 4, 2)], pad_token_id=0)
    assert joined.prompt_routes.shape == (4, 5, 2, 2) and joined.response_routes.shape == (4, 4, 2, 2)
    assert (joined.prompt_routes[:2, :2] == NO_ROUTE).all() and (joined.prompt_routes[:2, 2:] == 1).all()
    assert (joined.response_routes[:2, 2:] == NO_ROUTE).all() and (joined.response_routes[:2, :2] == 1).all()
    first = joined.select([0, 1])
    first.prompt_mask[:, :2], first.response_mask[:, 2:] = 0, 0
    cut = first.without_padding()
    assert cut.prompt_routes.shape == (2, 3, 2, 2) and cut.response_routes.shape == (2, 2, 2, 2)
    assert (cut.prompt_routes == 1).all() and (cut.response_routes == 1).all()


def test_vllm_routes_are_placed_where_they_ran():
    import numpy as np

    from verl_hf.rollout.vllm_engine import rollout_from_tokens

    # Row 0: prompt [5, 6, 7], response [8, 9(EOS)]; vLLM ran positions 0..3 (not the EOS). Row 1: a 2-token
    # prompt with a cached first position (vLLM returned positions 1..3 only) and a 3-token response.
    rollout = rollout_from_tokens([[5, 6, 7], [5, 6]], [[8, 9], [8, 8, 9]], None, 1, 0, [9])
    layers = 3  # vLLM counts every decoder layer; the model's routes keep the first 2
    ran = [np.arange(4 * layers * 2).reshape(4, layers, 2).astype("uint8"),
           np.full((3, layers, 2), 7, dtype="uint8")]
    prompt, response = routes_from_vllm(ran, rollout, slots=2)
    assert torch.equal(prompt[0], torch.from_numpy(ran[0][:3, :2].astype("int16")))
    assert torch.equal(response[0, 0], torch.from_numpy(ran[0][3, :2].astype("int16")))
    assert (response[0, 1] == NO_ROUTE).all()  # the EOS
    assert (prompt[1, 0] == NO_ROUTE).all() and (prompt[1, 1] == NO_ROUTE).all()  # left padding, cached
    assert (prompt[1, 2] == 7).all() and (response[1, :2] == 7).all() and (response[1, 2] == NO_ROUTE).all()
    with pytest.raises(RuntimeError, match="routes for 5 positions"):
        routes_from_vllm([np.zeros((5, layers, 2), dtype="uint8"), ran[1]], rollout, slots=2)
    with pytest.raises(RuntimeError, match="enable_return_routed_experts"):
        routes_from_vllm([None, ran[1]], rollout, slots=2)


def test_setups_that_cannot_replay_are_refused(tmp_path, built):
    from verl_hf import VerlTrainer

    with pytest.raises(ValueError, match="vLLM server engine does not return them"):
        small_config(tmp_path, routing_replay=True, rollout_engine="vllm_server", vllm_server_url="http://x:1")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="GPU model runner"):
            small_config(tmp_path, routing_replay=True, rollout_engine="vllm")
    args = small_config(tmp_path, routing_replay=True, reward_funcs=None, reward_weights=None, max_prompt_length=48)
    with pytest.raises(ValueError, match="Qwen3ForCausalLM has no MoE router"):
        VerlTrainer(model=built["dense"], args=args, train_dataset=chat_prompts(), reward_funcs=[digit_share])


def test_trainer_replays_the_bf16_samplers_routes(tmp_path, built):
    """bf16 sampling copy, fp32 master weights: the sampler's routes reach the update (its replay agreement is
    logged at every step; the unit tests above show that replayed routes are the ones used) and the router,
    replayed, still learns."""
    from verl_hf import VerlTrainer

    args = small_config(tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=2, learning_rate=1e-3,
                        max_prompt_length=48, max_response_length=8, rollout_is="token", reward_funcs=None,
                        reward_weights=None, routing_replay=True, rollout_hf_weights="copy", rollout_dtype="bfloat16")
    trainer = VerlTrainer(model=built["moe"], args=args, train_dataset=chat_prompts(), reward_funcs=[digit_share])
    router = trainer.model.model.layers[0].mlp.gate.weight
    before = router.detach().clone()
    trainer.train()
    agreement = [h["moe/replay_agreement"] for h in trainer.state.log_history if "moe/replay_agreement" in h]
    assert len(agreement) == 2 and all(0.9 < a <= 1.0 for a in agreement)
    assert not torch.equal(before, router.detach())
    assert trainer.last_round.prompt_routes is None  # the micro-batches alone hold the routes


def test_hooks_leave_copies_and_other_instances_alone(built):
    """A deep copy of the policy (a reference) routes live inside the policy's `replaying`; a second
    RoutingReplay on the same model does not break gradient checkpointing; PEFT's modules_to_save router copy
    is the one replayed; an engine without routes is refused."""
    import copy

    from peft import LoraConfig, get_peft_model

    from verl_hf.roles import Actor
    from verl_hf.rollout import RolloutEngine

    model = load(built["moe"])
    ids = torch.tensor([prompt_ids(built["tokenizer"], 1)[0][:10]])
    routes = _forward_routes(model, ids)
    other = _other_routes(routes, 1)
    RoutingReplay(model)  # an earlier instance, e.g. from a trainer built before on the same model
    replay = RoutingReplay(model)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference_live = reference(ids).logits
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    with replay.replaying(other[:, :4], other[:, 4:]):
        with torch.no_grad():
            assert torch.equal(reference(ids).logits, reference_live)
        model(ids).logits.sum().backward()
    replay.close()

    peft_model = get_peft_model(load(built["moe"]), LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["gate"]))
    peft_replay = RoutingReplay(peft_model)
    with peft_replay.replaying(other[:, :4], other[:, 4:]), torch.no_grad():
        peft_model(ids)
    assert peft_replay.take_metrics()["moe/replay_agreement"] < 0.5

    class NoRoutes(RolloutEngine):
        def generate(self, prompt_ids, params):
            raise NotImplementedError

    with pytest.raises(ValueError, match="NoRoutes does not"):
        Actor(load(built["moe"]), built["tokenizer"], engine=NoRoutes(), routing_replay=True)
