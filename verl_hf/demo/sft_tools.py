"""The tool demo's warm start (`python -m verl_hf.demo.sft --task tools`): a tokenizer trained on the task's
conversations, a tiny model of the chosen family (families.py: Llama, Qwen3 or Mistral, each in its own tool
format), and supervised training on whole conversations (tools_task.py), stopped once sampled dev accuracy
through the tool reaches the target. See sft.py for why stopping on accuracy.

See it work: tests/test_demo_tools.py.
"""

from __future__ import annotations

from datasets import Dataset

from ..rewards.reasoning import split_think
from .families import Family, family
from .sft_loop import StopAtAccuracy, pad_collate, train_until
from .task import ANSWER_PREFIX
from .tiny import build_chat_tokenizer, build_tiny_model
from .tools_task import multiply, sft_conversations, tools_splits


def tool_schemas() -> list[dict]:
    from ..agent import as_tools

    return [tool.schema for tool in as_tools([multiply]).values()]


def tokenizer_for(conversations: list[list[dict]], family: Family):
    """The family's chat tokenizer, its BPE trained on the conversations as its template renders them (a
    scratch tokenizer with the same special tokens renders them first)."""
    scratch, schemas = build_chat_tokenizer(["scratch"], family=family), tool_schemas()
    texts = [scratch.apply_chat_template(c, tools=schemas, tokenize=False) for c in conversations]
    return build_chat_tokenizer(texts, family=family)


def tokenize_conversations(tokenizer, conversations: list[list[dict]]) -> Dataset:
    """input_ids of each whole conversation as the chat template renders it with the tools; labels are the
    assistant turns' ids up to their end-of-turn token (what the model samples), -100 elsewhere."""
    schemas, rows = tool_schemas(), []

    def extend(ids: list[int], messages: list[dict], header: bool) -> list[int]:
        text = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=header)
        return tokenizer(text, add_special_tokens=False).input_ids[len(ids):]

    for messages in conversations:
        ids, labels = [], []
        for end in range(1, len(messages) + 1):
            if messages[end - 1]["role"] != "assistant":
                new = extend(ids, messages[:end], header=False)
                ids, labels = ids + new, labels + [-100] * len(new)
                continue
            header = extend(ids, messages[:end - 1], header=True)  # "<|im_start|>assistant\n": the prompt's
            ids, labels = ids + header, labels + [-100] * len(header)
            turn = extend(ids, messages[:end], header=False)
            sampled = turn.index(tokenizer.eos_token_id) + 1
            ids, labels = ids + turn, labels + turn[:sampled] + [-100] * (len(turn) - sampled)
        rows.append({"input_ids": ids, "labels": labels})
    return Dataset.from_list(rows)


def tool_accuracy(model, tokenizer, dataset, do_sample: bool, seed: int = 0, max_turns: int = 3,
                  parser: str = "hermes", turn_length: int = 40) -> dict:
    """Accuracy (`#### <product>` as the last answer) and tool calls per problem of `dataset`'s conversations,
    played by verl_hf's multi-turn rollout with the real tool (greedy, or sampled at temperature 1)."""
    from ..agent import MultiTurnRollout, ToolEnvironment, as_tools
    from ..data import tokenize_prompt
    from ..roles import Actor

    schemas, tools = tool_schemas(), as_tools([multiply])
    rollout = MultiTurnRollout(lambda: ToolEnvironment(tools, parser), tokenizer, schemas, max_turns=max_turns,
                               max_tokens=160, env_timeout_s=60)
    rows = [{"prompt": p, "prompt_ids": tokenize_prompt(tokenizer, p, schemas), "answer": a}
            for p, a in zip(dataset["prompt"], dataset["answer"])]
    was_training = model.training
    model.eval()
    batch, metrics = Actor(model, tokenizer).generate_conversations(rollout, rows, max_new_tokens=turn_length,
                                                                    do_sample=do_sample, seed=seed)
    model.train(was_training)
    answers = [split_think(c)[1].strip() for c in batch.completions]  # a thinking model's answer after </think>
    correct = sum(a == f"{ANSWER_PREFIX}{r['answer']}" for a, r in zip(answers, rows))
    return {"accuracy": correct / len(rows), "tool_calls": metrics["tool_calls/mean"]}


def build_tools_warm_start(output_dir: str, seed: int = 0, tool_share: float = 0.3, target_accuracy: float = 0.15,
                           max_steps: int = 3000, check_every: int = 100, family_name: str = "llama") -> dict:
    """The tool demo's warm start for a model family (families.py), saved under `output_dir`; returns the
    figures of its training and its held-out accuracy and tool calls, greedy and sampled. Dev accuracy is
    measured every `check_every` steps."""
    chosen = family(family_name)
    train, dev, test = tools_splits(seed=0)
    conversations = sft_conversations(train, tool_share, seed, chosen)
    tokenizer = tokenizer_for(conversations[:2000], chosen)
    model = build_tiny_model(chosen.model_type, tokenizer, seed=seed, max_positions=chosen.max_positions)

    def accuracy(m, dataset, do_sample):
        return tool_accuracy(m, tokenizer, dataset, do_sample=do_sample, parser=chosen.parser,
                             turn_length=chosen.turn_length)

    stopper = StopAtAccuracy(lambda m: accuracy(m, dev, True)["accuracy"], target_accuracy, every=check_every)
    figures = train_until(model, tokenizer, tokenize_conversations(tokenizer, conversations),
                          pad_collate(tokenizer, left=False), stopper, output_dir, seed, max_steps)
    return {**figures, "test_greedy": accuracy(model, test, False), "test_sampled": accuracy(model, test, True)}
