"""The multi-turn rollout loop with a real tiny model on the HF engine: the training sequence is the sampled ids
plus the tokenized environment messages, token for token; the sampling log-probs of the model's tokens equal
the trainer's forward over the whole conversation; environment tokens get no gradient; the limits hold."""

import sys
from pathlib import Path

import pytest

from verl_hf.rewards import completion_text
import torch

sys.path.insert(0, str(Path(__file__).parent))

from agent_model import (QWEN3_TURNS, assert_thinking_kept, assert_three_turns, chat_rows, echo,  # noqa: E402
                         echo_rollout, every_turn_calls_echo, prompts, three_turns)

from verl_hf import Actor  # noqa: E402
from verl_hf.agent import MultiTurnRollout, Step, ToolEnvironment, as_tools  # noqa: E402


@pytest.fixture(scope="module")
def tool_model(tool_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(tool_model_path), AutoTokenizer.from_pretrained(tool_model_path),
            tool_model_path)


def test_three_turns_are_sampled_ids_plus_tool_messages_and_logprobs_match(tool_model):
    """Three turns of 8 echo conversations (tests/agent_model.py): model, tool, model, tool, model segments; each
    turn's prompt is the training sequence so far and its samples are kept as sampled; each tool segment is the
    template's continuation, token for token; tool tokens have rollout log-prob 0, and the model tokens'
    sampling log-probs equal the trainer's forward within 1e-4 (fp32)."""
    model, tokenizer, _ = tool_model
    assert_three_turns(three_turns(Actor(model, tokenizer), tokenizer))


@pytest.mark.parametrize("architecture", ["qwen3_moe", "gemma2"])
def test_three_turns_on_other_architectures(architecture, tmp_path):
    """The three-turn checks on an MoE (Qwen3-MoE) and a soft-capped, sliding-window model with tied embeddings
    (Gemma 2), each first taught to end its turns (a few seconds of SFT;
    most conversations reach three turns): token in, token out, and sampling log-probs equal to the trainer's
    forward within 1e-4."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_model import build_tool_model

    path = build_tool_model(tmp_path, steps=100, architecture=architecture)
    actor = Actor(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path))
    assert_three_turns(three_turns(actor, actor.tokenizer), every_sample=False)


@pytest.mark.parametrize("thinking", [True, False])
def test_three_turns_on_qwen3_with_its_multiturn_template(thinking, qwen3_thinking_model):
    """chat_template='qwen3_multiturn' on a Qwen3 that thinks before each turn (or with enable_thinking=false: the
    empty think block before each turn): three turns token in, token out, each turn's thinking kept in the
    conversation as sampled, and sampling log-probs equal to the trainer's forward within 1e-4."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_hf.agent.templates import put_chat_template

    tokenizer = AutoTokenizer.from_pretrained(qwen3_thinking_model)
    put_chat_template(tokenizer, None, None if thinking else {"enable_thinking": False})
    actor = Actor(AutoModelForCausalLM.from_pretrained(qwen3_thinking_model), tokenizer)
    figures = three_turns(actor, actor.tokenizer, **QWEN3_TURNS[thinking])
    assert_three_turns(figures, every_sample=False)
    assert_thinking_kept(figures, actor.tokenizer, thinking)


def test_environment_tokens_get_no_gradient(tool_model):
    """The loss reads model tokens only: its gradient at environment positions is exactly zero, and with a
    conversation cut after its first tool answer, changing that answer's ids leaves every weight's gradient
    unchanged (they are context for nothing after them, and never a target)."""
    from dataclasses import replace

    from verl_hf.algorithms import masked_mean
    from verl_hf.batch import TOKEN_FIELDS

    model, tokenizer, _ = tool_model
    actor = Actor(model, tokenizer)
    batch, _ = actor.generate_conversations(echo_rollout(tokenizer, max_turns=2), chat_rows(tokenizer, 1),
                                            max_new_tokens=16, seed=1)

    def gradients(b):
        model.zero_grad()
        logprobs, _ = actor.compute_logprobs(b)
        logprobs.retain_grad()
        masked_mean(-logprobs, b.response_mask.float()).backward()
        return logprobs.grad, {n: p.grad.clone() for n, p in model.named_parameters()}

    grad_logprobs, _ = gradients(batch)
    assert (grad_logprobs[batch.env_mask.bool()] == 0).all() and grad_logprobs[batch.response_mask.bool()].abs().sum() > 0
    env = batch.env_mask[0].tolist()
    end = next(t for t in range(env.index(1), len(env)) if not env[t])  # the end of the first tool answer
    cut = replace(batch, **{f: getattr(batch, f)[:, :end] for f in TOKEN_FIELDS if getattr(batch, f) is not None})
    _, grads = gradients(cut)
    changed = torch.where(cut.env_mask.bool(), 7, cut.response_ids)
    _, grads_changed = gradients(replace(cut, response_ids=changed))
    assert not torch.equal(changed, cut.response_ids) and all(torch.equal(grads[n], grads_changed[n]) for n in grads)


def test_max_turns_and_the_token_budget(tool_model):
    model, tokenizer, _ = tool_model
    actor = Actor(model, tokenizer)
    batch, metrics = actor.generate_conversations(echo_rollout(tokenizer, max_turns=2), chat_rows(tokenizer, 2),
                                                  max_new_tokens=16, seed=2)
    assert metrics["turns/mean"] == 2.0 and metrics["stop/max_turns"] == 1.0
    budget = 24
    batch, metrics = actor.generate_conversations(echo_rollout(tokenizer, max_turns=8, max_tokens=budget),
                                                  chat_rows(tokenizer, 4), max_new_tokens=16, seed=3)
    assert metrics["stop/budget"] == 1.0 and batch.response_attention_mask.sum(dim=1).max() <= budget
    assert batch.truncated.all()


class CountingGame:
    """An environment of our own (environment=): replies 'again' twice with a reward per turn, then ends."""

    def __init__(self):
        self.turns = 0

    def reset(self, row):
        return None

    def step(self, message):
        self.turns += 1
        return Step([{"role": "user", "content": "again"}], reward=float(self.turns), done=self.turns == 3)


def test_an_environment_of_our_own_places_each_turns_reward_on_its_last_token(tool_model):
    model, tokenizer, _ = tool_model
    rollout = MultiTurnRollout(CountingGame, tokenizer, None, max_turns=5, max_tokens=200, env_timeout_s=30)
    batch, metrics = Actor(model, tokenizer).generate_conversations(rollout, chat_rows(tokenizer, 2), max_new_tokens=16,
                                                                    seed=4)
    assert metrics["stop/done"] == 1.0 and metrics["turns/mean"] == 3.0
    last_turn = MultiTurnRollout(CountingGame, tokenizer, None, max_turns=3, max_tokens=200, env_timeout_s=30)
    cut, cut_metrics = Actor(model, tokenizer).generate_conversations(last_turn, chat_rows(tokenizer, 2),
                                                                      max_new_tokens=16, seed=4)
    assert cut_metrics["stop/done"] == 1.0 and cut.turn_rewards.sum(dim=1).tolist() == [6.0, 6.0]  # turn 3 scored
    for row in range(len(batch)):
        mask = batch.response_mask[row]
        turn_ends = [t for t in range(len(mask)) if mask[t] and (t + 1 == len(mask) or not mask[t + 1])]
        assert batch.turn_rewards[row, turn_ends].tolist() == [1.0, 2.0, 3.0]
        assert batch.turn_rewards[row].sum() == 6.0


def test_grpo_with_tools_trains_end_to_end(tool_model, tmp_path):
    """VerlTrainer(environment=...): conversations every round and at evaluation, rewards that read the whole
    conversation and the tool calls' outcomes, the multi-turn metrics logged, the weights trained."""
    from datasets import Dataset

    from conftest import small_config
    from verl_hf import VerlTrainer

    import copy

    shared, tokenizer, _ = tool_model
    model = copy.deepcopy(shared)  # trained here: the module's model stays as built for the other tests
    data = Dataset.from_list([{"prompt": p, "answer": p[0]["content"]} for p in prompts(32, seed=9)])
    seen = []

    def used_the_tool(prompts, completions, completion_ids, messages, tool_statuses, **columns):
        seen.append(messages[0])
        # each completion is the conversation's messages after the prompt (TRL's contract): its text's length varies
        return [float(bool(s) and all(x == "ok" for x in s)) + 0.1 * len(completion_text(c))
                for s, c in zip(tool_statuses, completions)]

    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=2, max_turns=2,
                        max_response_length=48, max_turn_length=12, per_device_train_batch_size=16, num_generations=4,
                        per_device_eval_batch_size=8, learning_rate=1e-3)
    # environment=: the tool environment with our own parser (the tiny model writes no Hermes calls)
    trainer = VerlTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=data,
                          eval_dataset=data.select(range(8)), reward_funcs=[used_the_tool],
                          environment=lambda: ToolEnvironment(as_tools([echo]), every_turn_calls_echo))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "turns/mean" in h]
    # two turns each (but for a turn that runs to its length: its sample ends); the second's call runs too,
    # unless the model ended with an empty turn (no call: done)
    assert len(logs) == 2 and all(1.5 <= h["turns/mean"] <= 2.0 and 1.0 <= h["tool_calls/mean"] <= 2.0
                                  for h in logs), [{k: h[k] for k in h if k.startswith(("turns", "tool", "stop"))}
                                                   for h in logs]
    assert all(0 < h["env_tokens/frac"] < 1 for h in logs)
    assert seen and seen[0][0]["role"] == "user" and any(m["role"] == "tool" for m in seen[0])
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert "eval_reward" in trainer.evaluate()


def test_the_tools_front_door_and_its_errors_before_any_model_loads(tool_model, tmp_path, monkeypatch):
    """tools=[fn]: the prompts show the tools through the chat template, and conversations run (this model
    writes no Hermes calls, so each ends after its first turn). Bad tools, a template without tool support,
    both front doors at once, a non-factory environment and multi-turn settings without multi-turn are refused
    before the policy is loaded."""
    from datasets import Dataset

    from conftest import small_config
    from verl_hf import VerlTrainer
    from verl_hf import trainer_setup

    _, tokenizer, path = tool_model
    data = Dataset.from_list([{"prompt": p, "answer": "1"} for p in prompts(16, seed=2)])
    args = small_config(tmp_path, reward_funcs=["exact_match"], reward_weights=None, max_steps=1,
                        max_prompt_length=64, max_response_length=24, per_device_train_batch_size=16,
                        num_generations=4)
    trainer = VerlTrainer(model=path, args=args, train_dataset=data, tools=[echo])
    assert "Tools: echo(text)" in tokenizer.decode(trainer.train_dataset[0]["prompt_ids"])
    trainer.train()
    assert next(h for h in trainer.state.log_history if "turns/mean" in h)["stop/done"] == 1.0

    def undocumented(x: int) -> int:
        return x

    monkeypatch.setattr(trainer_setup, "load_policy", lambda *a, **k: pytest.fail("the policy was loaded"))
    cases = [({"tools": [undocumented]}, ValueError, "tool 'undocumented': .*docstring"),
             ({"tools": [echo, echo]}, ValueError, "two tools are named 'echo'"),
             ({"tools": [echo], "environment": CountingGame}, ValueError, "not both"),
             ({"environment": CountingGame()}, TypeError, "Pass the class, not an instance")]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            VerlTrainer(model=path, args=args, train_dataset=data, **kwargs)
    with pytest.raises(ValueError, match="max_turns=3 takes effect only when rollouts are multi-turn"):
        VerlTrainer(model=path, args=small_config(tmp_path, max_turns=3), train_dataset=data)
    plain = data.map(lambda row: {"prompt": row["prompt"][0]["content"]})
    with pytest.raises(ValueError, match="need chat prompts"):
        VerlTrainer(model=path, args=args, train_dataset=plain, tools=[echo])


def test_multi_turn_batches_join_and_dynamic_sampling_reads_turn_rewards(tool_model):
    """Rounds of conversations join (dynamic sampling refills) whether or not their environments gave any
    reward, and a group whose outcome rewards are equal but whose turn rewards differ is informative."""
    from types import SimpleNamespace

    from verl_hf.batch import concat_batches
    from verl_hf.round import split_informative

    model, tokenizer, _ = tool_model
    actor = Actor(model, tokenizer)
    scored, _ = actor.generate_conversations(
        MultiTurnRollout(CountingGame, tokenizer, None, max_turns=2, max_tokens=200, env_timeout_s=30),
        chat_rows(tokenizer, 1), max_new_tokens=16, num_return_sequences=2, seed=5)
    plain, _ = actor.generate_conversations(echo_rollout(tokenizer, max_turns=2), chat_rows(tokenizer, 1),
                                            max_new_tokens=16, num_return_sequences=2, seed=6)
    joined = concat_batches([scored, plain], tokenizer.pad_token_id)
    assert joined.turn_rewards.shape == joined.response_ids.shape and joined.turn_rewards[2:].sum() == 0
    assert joined.env_mask.shape == joined.response_ids.shape
    scored.rewards, scored.valid = torch.zeros(2), torch.ones(2, dtype=torch.bool)  # equal outcome rewards
    scored.turn_rewards.zero_()
    scored.turn_rewards[0, 0] = 1.0  # only the first sample's environment rewarded a turn
    no_constraint = SimpleNamespace(flat_groups=lambda batch, flat: flat)
    informative, flat = split_informative(scored, no_constraint)
    assert len(informative) == 2 and len(flat) == 0


def test_evaluation_counts_the_environments_turn_rewards_and_reports_the_rollout(tool_model, tmp_path):
    """trainer.evaluate() with environment=: each conversation's turn rewards (1 + 2 + 3 from CountingGame) join
    the reward functions' total in eval_reward, and the multi-turn metrics are reported with the eval prefix."""
    from datasets import Dataset

    from conftest import small_config
    from verl_hf import VerlTrainer

    _, tokenizer, path = tool_model
    data = Dataset.from_list([{"prompt": p, "answer": "1"} for p in prompts(8, seed=11)])

    def half(completions, **columns):
        return [0.5] * len(completions)

    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1, max_turns=5,
                        max_response_length=200, max_turn_length=16, per_device_eval_batch_size=8)
    trainer = VerlTrainer(model=path, args=args, train_dataset=data, eval_dataset=data, reward_funcs=[half],
                          environment=CountingGame)
    metrics = trainer.evaluate()
    assert metrics["eval_turns/mean"] == 3.0 and metrics["eval_stop/done"] == 1.0
    assert metrics["eval_turn_reward"] == 6.0 and metrics["eval_reward"] == 6.5 and metrics["eval_reward/half"] == 0.5


class OpensWithAQuestion(CountingGame):
    """An environment that opens the conversation itself (reset returns messages), from the row's `n`."""

    def reset(self, row):
        return [{"role": "user", "content": f"What is {row['n']} plus 1?"}]


def test_reset_opens_the_conversation_and_errors_name_the_sample_in_the_batch(tool_model):
    """reset()'s messages replace the row's prompt: they are the prompt ids (templated like a dataset prompt),
    the reward functions' `prompts` and the start of `messages`. A bad opening, one longer than the prompt
    limit, and a step that fails on one sample are errors that name that sample by its index in the batch."""
    from transformers import AutoModelForCausalLM

    from verl_hf.data import tokenize_prompt

    _, tokenizer, path = tool_model
    actor = Actor(AutoModelForCausalLM.from_pretrained(path), tokenizer)
    rows = [{**row, "n": 10 + i} for i, row in enumerate(chat_rows(tokenizer, 2))]
    rollout = MultiTurnRollout(OpensWithAQuestion, tokenizer, None, max_turns=2, max_tokens=100, env_timeout_s=30,
                               max_prompt_tokens=64)
    batch, _ = actor.generate_conversations(rollout, rows, max_new_tokens=16, num_return_sequences=2, seed=7)
    for row in range(len(batch)):
        opening = [{"role": "user", "content": f"What is {10 + row // 2} plus 1?"}]
        ids = batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist()
        assert ids == tokenize_prompt(tokenizer, opening) and ids != rows[row // 2]["prompt_ids"]
        assert batch.prompts[row] == opening and batch.columns["messages"][row][:1] == opening

    class Bad(CountingGame):
        def __init__(self, opening):
            super().__init__()
            self.opening = opening

        def reset(self, row):
            return self.opening if row["n"] == 11 else None

    for opening, error, message in [("hello", TypeError, "returned 'hello' for sample 1: return None"),
                                    ([{"role": "user", "content": "x " * 80}], ValueError,
                                     "opened sample 1 with .* tokens, more than max_prompt_length=64")]:
        bad = MultiTurnRollout(lambda: Bad(opening), tokenizer, None, max_turns=2, max_tokens=100, env_timeout_s=30,
                               max_prompt_tokens=64)
        with pytest.raises(error, match=message):
            actor.generate_conversations(bad, rows, max_new_tokens=16)

    class FailsOnTheSecondRow(CountingGame):
        def reset(self, row):
            self.n = row["n"]

        def step(self, message):
            self.turns += 1
            if self.n == 11 and self.turns == 2:  # samples 2 and 3, when only they are still playing
                raise KeyError("no such state")
            return Step([{"role": "user", "content": "again"}], done=self.n == 10)

    failing = MultiTurnRollout(FailsOnTheSecondRow, tokenizer, None, max_turns=3, max_tokens=100, env_timeout_s=30)
    with pytest.raises(RuntimeError, match="environment.step failed on sample 2 of the batch: KeyError"):
        actor.generate_conversations(failing, rows, max_new_tokens=16, num_return_sequences=2)


def record_rounds(monkeypatch) -> list:
    """The batches of every round after their advantages, kept to look at (the real method runs)."""
    from verl_hf.round import RoundBuilder

    seen, original = [], RoundBuilder.compute_advantages

    def recording(self, batch, step):
        batch, kl = original(self, batch, step)
        seen.append(batch)
        return batch, kl

    monkeypatch.setattr(RoundBuilder, "compute_advantages", recording)
    return seen


def test_ppo_with_a_critic_and_kl_in_the_reward_trains_on_conversations(tool_model, tmp_path, monkeypatch):
    """GAE with a critic over conversations with per-turn rewards and the KL penalty in the reward: values,
    advantages and returns exist on the model's tokens only (the critic is never fitted to tool tokens), and
    both the actor and the critic train."""
    from datasets import Dataset

    from conftest import small_config
    from verl_hf import VerlTrainer

    _, tokenizer, path = tool_model
    data = Dataset.from_list([{"prompt": p, "answer": "1"} for p in prompts(16, seed=12)])
    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=2, max_turns=3,
                        max_response_length=120, max_turn_length=16, per_device_train_batch_size=8, num_generations=1,
                        adv_estimator="gae", critic_learning_rate=1e-3, use_kl_in_reward=True, kl_coef=0.05)
    trainer = VerlTrainer(model=path, args=args, train_dataset=data, environment=CountingGame,
                          reward_funcs=[lambda completions, **kw: [float(len(completion_text(c)) % 2)
                                                                   for c in completions]])
    seen = record_rounds(monkeypatch)
    trainer.train()
    env = seen[0].env_mask.bool()
    assert env.any() and seen[0].turn_rewards.sum() > 0
    for name in ("advantages", "returns", "token_level_rewards"):
        assert (getattr(seen[0], name)[env] == 0).all(), name
    logs = [h for h in trainer.state.log_history if "critic/value_loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["critic/value_loss"])) for h in logs)
    assert all(h["kl/in_reward"] >= 0 for h in trainer.state.log_history if "kl/in_reward" in h)


class ParityGame(CountingGame):
    """CountingGame whose turn reward is the turn's text length parity, so one prompt's samples differ by turn."""

    def step(self, message):
        from dataclasses import replace

        return replace(super().step(message), reward=float(len(message["content"]) % 2))


def test_mt_grpo_credits_each_turn_by_the_environments_turn_rewards(tool_model, tmp_path, monkeypatch):
    """adv_estimator='mt_grpo' over real conversations: the round's advantages are mt_grpo_advantages of its
    turn rewards, they differ between a sample's turns, and tool tokens get none. Without an environment (tools
    alone give no turn rewards) or with Safe-RLHF costs it is refused before any model loads."""
    from datasets import Dataset

    from conftest import small_config
    from verl_hf import VerlTrainer
    from verl_hf.algorithms import mt_grpo_advantages, turn_index
    from verl_hf.round import advantage_groups

    _, tokenizer, path = tool_model
    data = Dataset.from_list([{"prompt": p, "answer": "1"} for p in prompts(8, seed=14)])
    settings = dict(reward_funcs=None, reward_weights=None, max_steps=1, max_turns=3, max_response_length=120,
                    max_turn_length=16, per_device_train_batch_size=8, num_generations=4, adv_estimator="mt_grpo")
    args, outcome = small_config(tmp_path, **settings), [lambda completions, **kw: [float(len(c) % 3 == 0) for c in
                                                                                    completions]]
    trainer = VerlTrainer(model=path, args=args, train_dataset=data, environment=ParityGame, reward_funcs=outcome)
    seen = record_rounds(monkeypatch)
    trainer.train()
    batch = seen[0]
    mask = batch.response_mask.float()
    expected, _ = mt_grpo_advantages(batch.token_level_rewards, mask, advantage_groups(batch), batch.turn_rewards)
    torch.testing.assert_close(batch.advantages, expected)
    index, adv = turn_index(mask), batch.advantages
    by_turn = [{round(adv[r, t].item(), 5) for t in range(mask.shape[1]) if mask[r, t]} for r in range(len(batch))]
    assert any(len(values) > 1 for values in by_turn), by_turn  # turns of one sample credited apart
    assert all(len({round(adv[r, t].item(), 5) for t in range(mask.shape[1]) if mask[r, t] and index[r, t] == k}) <= 1
               for r in range(len(batch)) for k in range(3))  # one value per turn
    assert (adv[batch.env_mask.bool()] == 0).all()

    class Unrewarding(CountingGame):  # an environment whose step gives no reward: said, not silently GRPO
        def step(self, message):
            from dataclasses import replace

            return replace(super().step(message), reward=None)

    quiet = VerlTrainer(model=path, args=small_config(tmp_path, **settings, output_dir=str(tmp_path / "quiet")),
                        train_dataset=data, environment=Unrewarding, reward_funcs=outcome)
    with pytest.warns(RuntimeWarning, match="the environment rewarded no turn of this round"):
        quiet.train()
    with pytest.raises(ValueError, match="adv_estimator='mt_grpo' credits each turn .* only an environment= gives"):
        VerlTrainer(model=path, args=args, train_dataset=data, tools=[echo])
    with pytest.raises(ValueError, match="Safe-RLHF with adv_estimator='mt_grpo'"):
        small_config(tmp_path, adv_estimator="mt_grpo", cost_funcs=["gsm8k"])


def test_an_environment_alone_rewards_a_run(tool_model, tmp_path):
    """environment= without any reward function: the per-turn rewards are the whole reward (no dummy function
    needed). `environment_return` (weight 0) reports each episode's sum; the training reward and eval_reward
    are the episodes' rewards, and accuracy reads the episode's return against eval_correct_threshold."""
    import json
    import os

    from datasets import Dataset

    from conftest import small_config
    from verl_hf import VerlTrainer
    from verl_hf.callbacks import CompletionSamplesCallback

    _, tokenizer, path = tool_model
    data = Dataset.from_list([{"prompt": p, "answer": "1"} for p in prompts(8, seed=13)])
    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1, max_turns=5,
                        max_response_length=200, max_turn_length=16, per_device_train_batch_size=8,
                        per_device_eval_batch_size=8)
    samples = CompletionSamplesCallback(num_samples=2, formats=("jsonl", "parquet"))
    trainer = VerlTrainer(model=path, args=args, train_dataset=data, eval_dataset=data, environment=CountingGame,
                          callbacks=[samples])
    assert [name for name, _ in trainer.reward_funcs] == ["environment_return"] and trainer.reward_weights == [0.0]
    trainer.train()
    written = [json.loads(line) for line in open(os.path.join(args.output_dir, "completions", "samples.jsonl"))]
    for row in written:  # whole conversations, as in the parquet file
        conversation = json.loads(row["conversation"])
        assert json.dumps(conversation[:1]) == row["prompt"] and [m["role"] for m in conversation[1:3]] == \
            ["assistant", "user"]
        assert row["turn_rewards"] == [1.0, 2.0, 3.0] and row["reward"] == 6.0 and row["tool_statuses"] == []
    assert len(written) == 2 and os.path.exists(os.path.join(args.output_dir, "completions", "step_1.parquet"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_hf.callbacks.samples import parquet_schema

    no_tools = [{**row, "tool_statuses": [], "reward/environment_return": None} for row in written]
    with_tools = [{**row, "tool_statuses": ["ok"]} for row in written]
    for i, rows in enumerate((no_tools, with_tools)):  # steps that called no tool join those that did
        pq.write_table(pa.Table.from_pylist(rows, schema=parquet_schema(rows)), tmp_path / f"step_{i}.parquet")
    assert pq.read_table([tmp_path / "step_0.parquet", tmp_path / "step_1.parquet"]).num_rows == 4
    logged = next(h for h in trainer.state.log_history if "reward/turns/mean" in h)
    assert logged["reward/mean"] == logged["reward/turns/mean"] == logged["reward/environment_return/mean"] > 0
    metrics = trainer.evaluate()
    assert metrics["eval_reward"] == metrics["eval_turn_reward"] == metrics["eval_reward/environment_return"] == 6.0
    assert metrics["eval_accuracy"] == 1.0
    with pytest.raises(ValueError, match="no reward: .*or environment= whose step"):
        VerlTrainer(model=path, args=args, train_dataset=data, tools=[echo])
    with pytest.raises(ValueError, match=r"reward_weights=\[1.0\] weighs no reward function: with environment= alone"):
        VerlTrainer(model=path, args=small_config(tmp_path, reward_funcs=None, reward_weights=[1.0]),
                    train_dataset=data, environment=CountingGame)


def test_rollout_importance_sampling_reads_the_models_tokens_only(tool_model, tmp_path):
    """rollout_is over conversations (sequence level, which sums over every token it is given): the weights
    pi_old / pi_rollout come from the model's tokens only. The HF engine samples from the trained weights
    themselves, so every weight is 1 to rounding: a tool token let in (its rollout log-prob is 0, the
    policy's is not) would move the sequence weight far from 1. The token level reads the same mask."""
    level = "sequence"
    from datasets import Dataset

    from conftest import small_config
    from verl_hf import VerlTrainer

    _, tokenizer, path = tool_model
    data = Dataset.from_list([{"prompt": p, "answer": "1"} for p in prompts(8, seed=14)])
    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1, max_turns=3,
                        max_response_length=120, max_turn_length=16, per_device_train_batch_size=8,
                        rollout_is=level, rollout_is_threshold=2.0)
    trainer = VerlTrainer(model=path, args=args, train_dataset=data, environment=CountingGame)
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "rollout_is/mean" in h)
    assert logged["env_tokens/frac"] > 0.2 and logged["rollout_is/rejected_frac"] == 0.0
    assert logged["rollout_is/mean"] == pytest.approx(1.0, abs=1e-3) and logged["rollout_is/max"] < 1.01


def nap(text: str) -> str:
    """Sleep half a second, as a slow tool does.

    Args:
        text: Anything.
    """
    import time

    time.sleep(0.5)
    return "rested"


def test_sixteen_samples_whose_tool_sleeps_finish_a_turn_at_once(tool_model):
    """16 conversations (8 prompts x 2) whose turn calls a tool that sleeps 0.5 s: their tools run at once, so
    the turn takes about 0.5 s of tool time, not 16 x 0.5 s."""
    import time

    from verl_hf.agent import ToolCall

    from transformers import AutoModelForCausalLM

    _, tokenizer, path = tool_model
    tools = as_tools([nap])
    rollout = MultiTurnRollout(lambda: ToolEnvironment(tools, lambda text: [ToolCall("nap", {"text": "x"})]),
                               tokenizer, None, max_turns=1, max_tokens=100, env_timeout_s=30)
    actor = Actor(AutoModelForCausalLM.from_pretrained(path), tokenizer)
    actor.generate_conversations(rollout, chat_rows(tokenizer, 1), max_new_tokens=16, seed=0)  # warm
    start = time.perf_counter()
    batch, metrics = actor.generate_conversations(rollout, chat_rows(tokenizer, 8), max_new_tokens=16,
                                                  num_return_sequences=2, seed=0)
    elapsed = time.perf_counter() - start
    calls = sum(len(s) for s in batch.columns["tool_statuses"])  # a turn that ran to its length calls nothing
    assert len(batch) == 16 and calls >= 12 and all(s in ([], ["ok"]) for s in batch.columns["tool_statuses"])
    assert elapsed < 2.5, (elapsed, calls)  # one after another: 0.5 s per call


@pytest.mark.parametrize("distill_loss", ["reverse_kl", "gkd"])
def test_a_teacher_scores_conversations_with_the_environments_tokens_in_context(tool_model, tmp_path, distill_loss):
    """On-policy distillation over conversations, the student its own teacher: the teacher reads the whole
    conversation (the environment's tokens attended, as the student read them), so its log-probs and
    distributions at the model's tokens are the student's and the signal is 0 to rounding. A teacher that
    scored without the environment's tokens in context would differ; the environment's tokens themselves are
    out of the mask (response_mask) every distillation term is taken over."""
    from datasets import Dataset

    from conftest import small_config
    from verl_hf import VerlTrainer

    _, _, path = tool_model
    data = Dataset.from_list([{"prompt": p, "answer": "1"} for p in prompts(8, seed=15)])
    args = small_config(tmp_path, reward_funcs=None, reward_weights=None, max_steps=1, max_turns=3,
                        max_response_length=120, max_turn_length=16, per_device_train_batch_size=8,
                        teacher_model_path=path, distill_loss=distill_loss)
    trainer = VerlTrainer(model=path, args=args, train_dataset=data, environment=CountingGame)
    trainer.train()
    logged = next(h for h in trainer.state.log_history if f"distill/{distill_loss}" in h)
    assert logged["env_tokens/frac"] > 0.2, logged
    assert logged[f"distill/{distill_loss}"] == pytest.approx(0.0, abs=1e-5), logged
