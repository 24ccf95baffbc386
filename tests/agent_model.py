"""A tiny Llama that ends its turns: a few seconds of supervised training on short chats (a question, a
number, a follow-up, a number), so that multi-turn tests run real conversations with a real model (random
weights ramble until the token limit and every sample ends after one turn); and the three-turn echo rollout
that every engine must play token for token (`three_turns`, `assert_three_turns`). Used by
tests/test_agent_loop.py (HF engine) and tests/test_agent_vllm.py (colocated vLLM, vLLM server).
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import torch

from architectures import CHATML_TOOLS, build, build_tokenizer


def conversation(a: int, b: int, thinking: bool = False) -> list[dict]:
    """A question, an answer, the tool's echo of it, the answer again; `thinking`: each assistant turn opens with
    its reasoning in a Qwen3 think block."""
    think = f"<think>\n{a} plus {b}\n</think>\n\n" if thinking else ""
    return [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": think + str(a + b)},
            {"role": "tool", "content": str(a + b)}, {"role": "assistant", "content": f"{think}{a + b}."}]


def prompts(num: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    return [conversation(rng.randint(10, 99), rng.randint(10, 99))[:1] for _ in range(num)]


def _training_rows(tokenizer, num: int, seed: int, thinking: bool = False):
    """(ids, loss mask) of whole conversations: the loss on the assistant's turns only. `thinking` (Qwen3): every
    other conversation thinks before each turn, the others are rendered with enable_thinking=false (the empty
    think block before each turn), so one model serves both settings."""
    rng, rows = random.Random(seed), []
    for i in range(num):
        thinks = thinking and i % 2 == 0
        messages = conversation(rng.randint(10, 99), rng.randint(10, 99), thinks)
        options = {"enable_thinking": False} if thinking and not thinks else {}
        ids, mask = [], []
        for end in range(1, len(messages) + 1):
            text = tokenizer.apply_chat_template(messages[:end], tokenize=False, **options)
            new = tokenizer(text, add_special_tokens=False).input_ids[len(ids):]
            ids, mask = ids + new, mask + [int(messages[end - 1]["role"] == "assistant")] * len(new)
        rows.append((ids, mask))
    return rows


def build_tool_model(directory: Path, steps: int = 60, architecture: str = "llama", chat_template: str | None = None,
                     thinking: bool = False, **sizes) -> str:
    """Train and save a tiny model of `architecture` (tests/architectures.py) and its tokenizer under
    directory/<architecture>; returns the path. `chat_template`: a template shipped with verl_hf in place of
    CHATML_TOOLS; `thinking` (Qwen3): taught both to think before each turn and to answer after the empty think
    block of enable_thinking=false. `sizes`: a larger model (architectures.build)."""
    from transformers import AutoModelForCausalLM

    from verl_hf.agent.templates import template_text

    tokenizer = build_tokenizer()
    tokenizer.chat_template = template_text(chat_template) if chat_template else CHATML_TOOLS
    path = Path(build(architecture, directory, tokenizer, **sizes))
    model = AutoModelForCausalLM.from_pretrained(path)
    rows = _training_rows(tokenizer, 256, seed=0, thinking=thinking)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = random.Random(1)
    for _ in range(steps):
        batch = generator.sample(rows, 32)
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in batch])
        mask = torch.tensor([m + [0] * (width - len(m)) for _, m in batch])
        logits = model(input_ids=ids, attention_mask=(mask >= 0).long()).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                 reduction="none")
        loss = (loss * mask[:, 1:].reshape(-1)).sum() / mask[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def echo(text: str) -> str:
    """Repeat the text.

    Args:
        text: What to repeat.
    """
    return text


def every_turn_calls_echo(text: str):
    """A parser of our own (tool_call_parser accepts any callable): every non-empty turn is one echo call."""
    from verl_hf.agent import ToolCall

    return [ToolCall("echo", {"text": text.strip()[:6]})] if text.strip() else []


def chat_rows(tokenizer, num: int = 4) -> list[dict]:
    """Dataset rows as the trainer hands them to the loop: chat `prompt`, its `prompt_ids`, an `answer`."""
    return [{"prompt": p, "prompt_ids": list(tokenizer.apply_chat_template(p, add_generation_prompt=True,
                                                                            return_dict=False)), "answer": i}
            for i, p in enumerate(prompts(num, seed=3))]


def echo_rollout(tokenizer, max_turns: int = 3, max_tokens: int = 160):
    from verl_hf.agent import MultiTurnRollout, ToolEnvironment, as_tools

    tools = as_tools([echo])
    return MultiTurnRollout(lambda: ToolEnvironment(tools, every_turn_calls_echo, max_tool_calls=8), tokenizer,
                            None, max_turns=max_turns, max_tokens=max_tokens, env_timeout_s=30)


def segments(ids: list[int], from_model: list[int]) -> list[tuple[int, list[int]]]:
    """[(from_model, [ids])] runs of the response."""
    runs = []
    for token, model in zip(ids, from_model):
        if runs and runs[-1][0] == model:
            runs[-1][1].append(token)
        else:
            runs.append((model, [token]))
    return runs


@contextlib.contextmanager
def recorded(engine):
    """The real engine, each of its generate calls' (prompt ids, Rollout, time sent) recorded while inside: what
    the loop sent and when, and what the engine sampled, to compare with the training sequence."""
    import time

    calls, generate = [], engine.generate

    def recording(prompt_ids, params):
        sent = time.monotonic()
        out = generate(prompt_ids, params)
        calls.append((prompt_ids, out, sent))
        return out

    engine.generate = recording
    try:
        yield calls
    finally:
        del engine.generate  # the class's method again


# three_turns' lengths for the Qwen3 model that thinks (thinking on: longer turns) and with enable_thinking=false
QWEN3_TURNS = {True: dict(max_new_tokens=48, budget=230), False: dict(max_new_tokens=16, budget=230)}


def assert_thinking_kept(figures: dict, tokenizer, thinking: bool) -> None:
    """At least half the conversations keep a think block (thinking on: the model's; off: the generation
    prompt's empty one) in every later turn, as sampled."""
    texts = [tokenizer.decode(ids) for ids in figures["responses"]]
    blocks = "</think>" if thinking else "<think>\n\n</think>\n\n"
    assert sum(t.count(blocks) >= 2 for t in texts) >= len(texts) // 2, texts


def three_turns(actor, tokenizer, max_new_tokens: int = 16, budget: int = 160) -> dict:
    """8 echo conversations (4 prompts x 2) of three turns through `actor.generate_conversations` on the
    actor's engine, and what `assert_three_turns` checks, as plain values (a colocated vLLM engine runs in a
    process of its own and sends them back as JSON)."""
    rows = chat_rows(tokenizer)
    with recorded(actor.engine) as calls:
        batch, metrics = actor.generate_conversations(echo_rollout(tokenizer, max_tokens=budget), rows,
                                                      max_new_tokens=max_new_tokens,
                                                      num_return_sequences=2, seed=0)
    model_tokens, env = batch.response_mask.bool(), batch.env_mask.bool()
    gap = (actor.get_logprobs(batch) - batch.rollout_logprobs)[model_tokens].abs().max().item()
    conversations = [_conversation(batch, row, rows[row // 2], calls, tokenizer) for row in range(len(batch))]
    responses = [batch.response_ids[r][batch.response_attention_mask[r].bool()].tolist() for r in range(len(batch))]
    return dict(metrics=metrics, logprob_gap=gap, model_tokens=int(model_tokens.sum()), responses=responses,
                env_logprob_max=batch.rollout_logprobs[env].abs().max().item(), conversations=conversations)


def _conversation(batch, row: int, data_row: dict, calls: list, tokenizer) -> dict:
    """One conversation's checks, per turn: the engine was sent the training sequence so far (token in), its
    sampled ids are the model segment (token out), and each tool segment is exactly the template's
    continuation of what was shown."""
    from verl_hf.agent import continuation_ids

    real = batch.response_attention_mask[row].bool()
    ids, from_model = batch.response_ids[row][real].tolist(), batch.response_mask[row][real].tolist()
    runs = segments(ids, from_model)
    messages, shown = batch.columns["messages"][row], list(data_row["prompt"])
    sent, sampled, tool = [], [], []
    before = 0  # response tokens before this turn
    for turn, (_, model_ids) in enumerate(runs[::2]):
        # the engine call that was sent this conversation's training sequence so far (in step: one call per turn
        # with every conversation; on a server: a call per sample and turn)
        expected = data_row["prompt_ids"] + ids[:before]
        found = [(out, i) for prompt_ids, out, _ in calls for i, p in enumerate(prompt_ids) if p == expected]
        sent.append(len(found) >= 1)
        sampled.append(any(out.response_ids[i, : int(out.response_mask[i].sum())].tolist() == model_ids
                           for out, i in found))
        before += len(model_ids)
        if 2 * turn + 1 < len(runs):
            env = runs[2 * turn + 1][1]
            answer = messages[len(shown) + 1: len(shown) + 2]
            tool.append(env == continuation_ids(tokenizer, shown, model_ids, answer))
            shown = [*shown, messages[len(shown)], *answer]
            before += len(env)
    ends = [m[-1] == tokenizer.eos_token_id for model, m in runs if model]
    return dict(segments=[model for model, _ in runs], sent=sent, sampled=sampled, tool=tool, turns_end_in_eos=ends)


def assert_three_turns(figures: dict, every_sample: bool = True) -> None:
    """Every conversation ran three turns and each turn is token in, token out (see `_conversation`); the
    tool tokens have log-prob 0 and the model's equal the trainer's within 1e-4. Without `every_sample` (a
    model that sometimes runs on to its turn's token limit) a conversation may stop early, ending in an
    unfinished turn or at the sample's token budget, but most reach three turns and every turn that happened
    holds the same checks."""
    metrics = figures["metrics"]
    if every_sample:  # the last turn is answered too (its calls run), with nothing appended after it
        assert metrics["turns/mean"] == 3.0 and metrics["stop/max_turns"] == 1.0 and \
            metrics["tool_calls/mean"] == 3.0, metrics
    else:
        ended = metrics["stop/max_turns"] + metrics["stop/length"] + metrics["stop/budget"]
        assert metrics["stop/max_turns"] >= 0.5 and ended == 1.0, metrics
    for c in figures["conversations"]:
        turns = len(c["sent"])
        assert c["segments"] == [1, 0, 1, 0, 1][:2 * turns - 1], c  # model, tool, model, tool, model
        assert turns == 3 or not every_sample, c
        assert all(c["turns_end_in_eos"][:turns - 1]) and all(c["sent"]) and all(c["sampled"]), c
        assert len(c["tool"]) == turns - 1 and all(c["tool"]), c
    assert figures["env_logprob_max"] == 0.0, figures["env_logprob_max"]
    assert figures["model_tokens"] > 0 and figures["logprob_gap"] < 1e-4, figures["logprob_gap"]  # fp32, 3 turns
