"""Token in, token out against the real chat templates of popular models (tests/chat_templates/*.jinja, each
naming its source on its first line): which of them `check_extendable` accepts or refuses (and with what
message), and, for the accepted ones, that a conversation built by the multi-turn loop's rule (the prompt's
ids from the template, each assistant turn's ids as sampled followed by its end-of-turn token, then
`continuation_ids` for the reply) is token for token the tokenization of the template's rendering of the
whole conversation, or, where a template renders a turn otherwise than it was sampled, exactly what holds.

The tokenizers are small byte-level BPEs trained here (no model, no Hub) with each template's control tokens
as special tokens, eos_token its end-of-turn token and a distinct pad token. They split text before BPE with
the pre-tokenizer regex of Llama 3 / Qwen2's tokenizers (runs of newlines are one piece, as in those models),
so that a turn tokenized on its own splits as it does inside the rendered conversation.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from verl_hf.agent import ChatTemplateError, as_tools, check_extendable, continuation_ids  # noqa: E402
from verl_hf.agent.chat import assistant_turn, render  # noqa: E402
from verl_hf.data import tokenize_prompt  # noqa: E402

TEMPLATES = Path(__file__).parent / "chat_templates"
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
            "<｜tool▁sep｜>", "<think>", "</think>"]
GLM = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
       "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
       "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]
# name -> special tokens (in id order), bos, eos (the template's end of an assistant turn), pad
SPECS = {
    "qwen2_5_instruct": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|endoftext|>"),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|endoftext|>"),
    "llama3_1_instruct": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"],
                          "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>"),
    "mistral_7b_instruct_v0_3": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                  "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "<pad>"],
                                 "<s>", "</s>", "<pad>"),
    "mistral_small_3_1_instruct": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                    "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
                                    "[/SYSTEM_PROMPT]", "<pad>"], "<s>", "</s>", "<pad>"),
    "llama3_2_instruct": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"],
                          "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>"),
    "gemma3_pythonic": (["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
                        "<bos>", "<end_of_turn>", "<pad>"),
    "qwq_32b": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|endoftext|>"),
    "deepseek_r1_distill_qwen": (DEEPSEEK, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"),
    "deepseek_v3_1": (DEEPSEEK, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"),
    "glm_4_5": (GLM, None, "<|endoftext|>", "[MASK]"),
    "glm_4_6": (GLM, None, "<|endoftext|>", "[MASK]"),
    "phi_4_mini": (["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
                    "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>"], None, "<|end|>", "<|endoftext|>"),
    "gemma2_it": (["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<end_of_turn>", "<pad>"),
    "gemma3_it": (["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
                  "<bos>", "<end_of_turn>", "<pad>"),
}
# What the template renders after the end-of-turn token of the conversation's last turn (not in the sampled ids).
TAIL = {"qwen2_5_instruct": "\n", "llama3_1_instruct": "", "mistral_7b_instruct_v0_3": "",
        "mistral_small_3_1_instruct": "", "gemma2_it": "\n", "gemma3_it": "\n", "llama3_2_instruct": "",
        "gemma3_pythonic": "\n", "deepseek_v3_1": ""}
# Mistral v0.3 renders an assistant message as " " + content: the model samples that space as the start of its
# turn (SentencePiece's "▁" of its first token), so a turn's text is " " + the message content.
SEPARATOR = {"mistral_7b_instruct_v0_3": " "}
CORPUS = ["What is 12 times 34? I will work it out. 12 times 34 is 408. And 408 plus 1? 409.",
          '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>',
          '{"name": "multiply", "parameters": {"a": 12, "b": 34}}', "<tool_response>\n408\n</tool_response>",
          "system\n\nuser\n\nassistant\n\nipython\n\nmodel\n\n" * 4, "Cutting Knowledge Date: December 2023\n"
          "Today Date: 26 Jul 2024\n\n", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
          "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def square(x: int) -> int:
    """Square an integer.

    Args:
        x: The number.
    """
    return x * x


TOOLS = [t.schema for t in as_tools([multiply]).values()]
# vLLM's Gemma 3 pythonic template drops the comma between a call's arguments (test_gemma3_pythonic_...): its
# token-for-token case calls a tool of one argument.
ONE_ARGUMENT_TOOLS = [t.schema for t in as_tools([square]).values()]
QUESTION = [{"role": "user", "content": "What is 12 times 34?"}]


@functools.cache
def build(name: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials, bos, eos, pad = SPECS[name]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=pad)
    tokenizer.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    return tokenizer


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def rollout(tokenizer, prompt: list[dict], texts: list[str], replies: list[list[dict]], tools=None, calls=None):
    """The multi-turn loop's sequence: the prompt's ids, then per turn its sampled ids (`texts` tokenized) and its
    end-of-turn token, then (except after the last turn) `continuation_ids` for that turn's reply, given the
    `calls` read from each turn (calls_in). Also returns the conversation as the loop records it (each turn's
    text decoded from its ids, with its calls)."""
    calls = calls or [()] * len(texts)
    ids, messages = tokenize_prompt(tokenizer, prompt, tools), list(prompt)
    for i, text in enumerate(texts):
        turn = ids_of(tokenizer, text) + [tokenizer.eos_token_id]
        ids += turn
        answer = replies[i] if i < len(replies) else []
        if answer:
            ids += continuation_ids(tokenizer, messages, turn, answer, tools, calls[i])
        messages += [assistant_turn(tokenizer, turn, calls[i]), *answer]
    return ids, messages


def conversation(prompt: list[dict], contents: list[str], replies: list[list[dict]], calls=None) -> list[dict]:
    """The messages with each assistant turn's content as the template renders it; a turn with `calls` as the
    templates' tool-call message (no content besides its calls)."""
    messages = list(prompt)
    for i, content in enumerate(contents):
        turn = {"role": "assistant", "content": content}
        if calls and calls[i]:
            turn = {"role": "assistant", "content": "", "tool_calls": list(calls[i])}
        messages += [turn, *(replies[i] if i < len(replies) else [])]
    return messages


PARSER = {"qwen2_5_instruct": "hermes", "qwen3": "hermes", "llama3_1_instruct": "llama3_json",
          "mistral_7b_instruct_v0_3": "mistral", "mistral_small_3_1_instruct": "mistral",
          "llama3_2_instruct": "llama3_json", "gemma3_pythonic": "pythonic"}


def calls_in(name: str, texts: list[str]) -> list[tuple]:
    """Each turn's calls as the tool environment reads them: the family's parser, ids the model's or call_id(n)."""
    from verl_hf.agent import TOOL_CALL_PARSERS
    from verl_hf.agent.environment import call_id, template_calls

    out, made = [], 0
    for text in texts:
        calls = TOOL_CALL_PARSERS[PARSER[name]](text)
        out.append(template_calls(calls, [c.id or call_id(made + k + 1) for k, c in enumerate(calls)]))
        made += len(calls)
    return out


# The tool environment's reply: the id is the one the model wrote (Mistral's formats) or call_id(n); templates
# without ids ignore it.
TOOL_REPLY = [{"role": "tool", "name": "multiply", "content": "408", "tool_call_id": "a1b2c3d4e"}]
SECOND_TOOL_REPLY = [{"role": "tool", "name": "multiply", "content": "409", "tool_call_id": "b2c3d4e5f"}]
USER_REPLY = [{"role": "user", "content": "And 408 plus 1?"}]
SECOND_USER_REPLY = [{"role": "user", "content": "Sure?"}]
MISTRAL_CALL = '[TOOL_CALLS] [{"name": "multiply", "arguments": {"a": 12, "b": 34}, "id": "a1b2c3d4e"}]'
TOOL_CALL = {"qwen2_5_instruct": '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>',
             "llama3_1_instruct": '{"name": "multiply", "parameters": {"a": 12, "b": 34}}',
             "mistral_7b_instruct_v0_3": MISTRAL_CALL, "mistral_small_3_1_instruct": MISTRAL_CALL,
             "llama3_2_instruct": '{"name": "multiply", "parameters": {"a": 12, "b": 34}}',
             "gemma3_pythonic": "[square(x=12)]"}
# Mistral's templates move the tools to the last user message, so with tools only tool replies extend a
# conversation (what the tool environment sends): a second call instead.
SECOND_CALL = dict.fromkeys(["mistral_7b_instruct_v0_3", "mistral_small_3_1_instruct"],
                            '[TOOL_CALLS] [{"name": "multiply", "arguments": {"a": 408, "b": 1}, "id": "b2c3d4e5f"}]')
# (template, with tools): the accepted ones. With tools: a tool call, the tool's reply, an answer, a user's reply,
# a last answer. Without: three answers, each but the last followed by a user's reply.
ACCEPTED = [("qwen2_5_instruct", True), ("qwen2_5_instruct", False), ("llama3_1_instruct", True),
            ("llama3_1_instruct", False), ("mistral_7b_instruct_v0_3", True), ("mistral_7b_instruct_v0_3", False),
            ("mistral_small_3_1_instruct", True), ("mistral_small_3_1_instruct", False), ("gemma2_it", False),
            ("gemma3_it", False), ("llama3_2_instruct", True), ("llama3_2_instruct", False),
            ("gemma3_pythonic", True), ("gemma3_pythonic", False), ("deepseek_v3_1", False)]


def case(name: str, with_tools: bool):
    if with_tools and name in SECOND_CALL:
        return [TOOL_CALL[name], SECOND_CALL[name], "409."], [TOOL_REPLY, SECOND_TOOL_REPLY], TOOLS
    if with_tools:
        tools = ONE_ARGUMENT_TOOLS if name == "gemma3_pythonic" else TOOLS
        return [TOOL_CALL[name], "12 times 34 is 408.", "409."], [TOOL_REPLY, USER_REPLY], tools
    return ["I will work it out.", "12 times 34 is 408.", "409."], [USER_REPLY, SECOND_USER_REPLY], None


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_template_names_its_source_and_the_comment_renders_to_nothing(name):
    text = (TEMPLATES / f"{name}.jinja").read_text()
    first, body = text.split("\n", 1)
    assert re.fullmatch(r"\{# source: https://github\.com/\S+/blob/[0-9a-f]{40}/\S+( \(\w+\))? #\}", first), first
    tokenizer = build(name)
    messages = conversation(QUESTION, ["I will work it out."], [USER_REPLY])
    with_comment = render(tokenizer, messages, None, add_generation_prompt=True)
    tokenizer.chat_template = body
    try:
        assert render(tokenizer, messages, None, add_generation_prompt=True) == with_comment
    finally:
        tokenizer.chat_template = text


@pytest.mark.parametrize("name,with_tools", ACCEPTED)
def test_check_extendable_accepts(name, with_tools):
    check_extendable(build(name), TOOLS if with_tools else None)


@pytest.mark.parametrize("name,with_tools", ACCEPTED)
def test_loop_sequence_is_the_tokenized_rendering_of_the_conversation(name, with_tools):
    """Token for token: the loop's ids are the tokenization of the template's rendering of the whole
    conversation, up to the last turn's end-of-turn token (what the template renders after it is TAIL). With
    tools, the call turns are rendered from the calls the family's parser reads in them, as the templates render
    OpenAI-style tool-call messages (Mistral's with the ids the model wrote)."""
    tokenizer = build(name)
    contents, replies, tools = case(name, with_tools)
    calls = calls_in(name, contents) if with_tools else [()] * len(contents)
    assert sum(map(bool, calls)) == (2 if with_tools and name in SECOND_CALL else int(with_tools))
    # Mistral v0.3 puts its separator space before a turn's text, not before its [TOOL_CALLS]
    texts = [c if calls[i] else SEPARATOR.get(name, "") + c for i, c in enumerate(contents)]
    ids, _ = rollout(tokenizer, QUESTION, texts, replies, tools, calls)
    full = render(tokenizer, conversation(QUESTION, contents, replies, calls), tools, add_generation_prompt=False)
    full_ids = ids_of(tokenizer, full)
    assert full_ids[:len(ids)] == ids
    assert decode(tokenizer, full_ids[len(ids):]) == TAIL[name]
    assert decode(tokenizer, ids) + TAIL[name] == full
    assert ids.count(tokenizer.eos_token_id) >= len(contents)


@pytest.mark.parametrize("name", ["qwen2_5_instruct", "llama3_1_instruct", "mistral_7b_instruct_v0_3", "gemma2_it",
                                  "gemma3_it"])
def test_turns_the_template_trims_are_kept_as_sampled(name):
    """Turns with surrounding spaces: the loop's sequence is the template's rendering with each turn's text as
    sampled in place of the template's rendering of it (Llama 3.1 and Gemma trim a turn, Qwen2.5 and this
    Mistral copy don't), and the continuation after a turn does not depend on its text. Re-rendering the
    conversation the loop records (turns decoded from their ids) reproduces the sequence only for Qwen2.5:
    Llama and Gemma trim the turns, Mistral adds its separator space to the one the model sampled."""
    tokenizer = build(name)
    separator = SEPARATOR.get(name, "")
    sampled = [separator + " I will work it out. ", separator + "\n12 times 34 is 408.\n", separator + " 409. "]
    replies = [USER_REPLY, SECOND_USER_REPLY]
    ids, recorded = rollout(tokenizer, QUESTION, sampled, replies)
    marks = [f"@@{i}@@" for i in range(len(sampled))]
    expected = render(tokenizer, conversation(QUESTION, marks, replies), None, add_generation_prompt=False)
    for mark, text in zip(marks, sampled):
        expected = expected.replace(separator + mark, text)
    assert decode(tokenizer, ids) + TAIL[name] == expected
    clean, _ = rollout(tokenizer, QUESTION, [separator + "I will work it out."], [USER_REPLY])
    turn = ids_of(tokenizer, sampled[0]) + [tokenizer.eos_token_id]
    after_padded = continuation_ids(tokenizer, QUESTION, turn, USER_REPLY)
    assert clean[-len(after_padded):] == after_padded
    rerendered = render(tokenizer, recorded, None, add_generation_prompt=False)
    assert (rerendered == decode(tokenizer, ids) + TAIL[name]) == (name == "qwen2_5_instruct")


def test_qwen2_5_tool_reply_is_a_tool_response_user_turn():
    tokenizer = build("qwen2_5_instruct")
    turn = ids_of(tokenizer, TOOL_CALL["qwen2_5_instruct"]) + [tokenizer.eos_token_id]
    ids = continuation_ids(tokenizer, QUESTION, turn, TOOL_REPLY, TOOLS)
    assert decode(tokenizer, ids) == ("\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n"
                                      "<|im_start|>assistant\n")
    assert "multiply" in decode(tokenizer, tokenize_prompt(tokenizer, QUESTION, TOOLS))


def test_llama3_1_tool_and_ipython_replies_are_ipython_turns():
    """Llama 3.1 renders a `tool` or an `ipython` message as an ipython turn, its string content as JSON (the
    template's `content is iterable` holds for strings too), and puts the tools in the first user turn."""
    tokenizer = build("llama3_1_instruct")
    turn = ids_of(tokenizer, TOOL_CALL["llama3_1_instruct"]) + [tokenizer.eos_token_id]
    as_tool = continuation_ids(tokenizer, QUESTION, turn, TOOL_REPLY, TOOLS)
    as_ipython = continuation_ids(tokenizer, QUESTION, turn, [{"role": "ipython", "content": "408"}], TOOLS)
    assert as_tool == as_ipython
    assert decode(tokenizer, as_tool) == ('<|start_header_id|>ipython<|end_header_id|>\n\n"408"<|eot_id|>'
                                          "<|start_header_id|>assistant<|end_header_id|>\n\n")
    prompt = decode(tokenizer, tokenize_prompt(tokenizer, QUESTION, TOOLS))
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n")
    assert '"name": "multiply"' in prompt.split("<|start_header_id|>user<|end_header_id|>")[1]


@pytest.mark.parametrize("with_tools", [True, False])
def test_qwen3_is_refused_it_adds_an_empty_think_block_to_the_last_turn_only(with_tools):
    """Qwen3's template renders the last assistant turn after the last user query with '<think>\\n\\n</think>\\n\\n'
    before it even when the model wrote no reasoning, and the same turn without it once a message follows: not
    prefix-stable for turns without <think>, with a tool reply as with a user reply."""
    with pytest.raises(ChatTemplateError, match="cannot be extended turn by turn") as refused:
        check_extendable(build("qwen3"), TOOLS if with_tools else None)
    message = str(refused.value)
    got = "\\n<tool_call>\\n{\"name" if with_tools else "<|im_end|>"  # the trial turn calls the first tool
    assert f"expected '<think>\\n\\n</think>\\n\\n I will work it out. ', got ' I will work it out. {got}" in message
    assert "Qwen3's adds an empty <think> block to the last assistant turn only" in message


def test_qwen3_turns_with_reasoning_extend_by_tool_replies_not_by_user_replies():
    """What does hold for Qwen3: a turn that opens with its <think> block renders as sampled while only tool
    replies follow it (the sequence is the tokenized rendering), but a user's reply drops its reasoning."""
    tokenizer = build("qwen3")
    first = "<think>\nI multiply.\n</think>\n\n" + TOOL_CALL["qwen2_5_instruct"]
    second = "<think>\nThe tool says 408.\n</think>\n\n12 times 34 is 408."
    ids, _ = rollout(tokenizer, QUESTION, [first, second], [TOOL_REPLY], TOOLS)
    full = render(tokenizer, conversation(QUESTION, [first, second], [TOOL_REPLY]), TOOLS, add_generation_prompt=False)
    assert ids_of(tokenizer, full) == ids + ids_of(tokenizer, "\n")
    turn = ids_of(tokenizer, first) + [tokenizer.eos_token_id]
    with pytest.raises(ChatTemplateError, match=r"expected '[^']*I multiply\.\\n</think>\\n\\n<tool_call>"):
        continuation_ids(tokenizer, QUESTION, turn, USER_REPLY, TOOLS)


def test_qwen3_refusal_names_the_shipped_template():
    with pytest.raises(ChatTemplateError, match=r"set chat_template='qwen3_multiturn' \(shipped with verl_hf"):
        check_extendable(build("qwen3"), TOOLS)


def qwen3_multiturn(**kwargs):
    """The Qwen3 test tokenizer with our shipped template (chat_template='qwen3_multiturn'), `kwargs` as defaults."""
    from verl_hf.agent.templates import put_chat_template

    tokenizer = build("qwen3")
    stock = tokenizer.chat_template
    put_chat_template(tokenizer, "qwen3_multiturn", kwargs)
    shipped = tokenizer.chat_template
    tokenizer.chat_template = stock  # build() caches the tokenizer: the stock template's tests keep theirs
    clone = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer, bos_token=None, eos_token="<|im_end|>",
                            pad_token="<|endoftext|>")
    clone.chat_template = shipped
    return clone


THINKING = {  # thinking on: each turn opens with its reasoning, as Qwen3 samples it
    True: ["<think>\nI multiply.\n</think>\n\n" + TOOL_CALL["qwen2_5_instruct"],
           "<think>\nThe tool says 408.\n</think>\n\n12 times 34 is 408.", "<think>\nOne more.\n</think>\n\n409."],
    False: [TOOL_CALL["qwen2_5_instruct"], "12 times 34 is 408.", "409."],  # off: after the prompt's empty block
}


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("with_tools", [True, False])
def test_qwen3_multiturn_extends_turn_by_turn_thinking_on_and_off(thinking, with_tools):
    """Three turns (with tools: a call, the tool's reply, an answer, a user's reply, an answer; without: user
    replies), thinking on and off: accepted at start-up, and the loop's ids are token for token the tokenization
    of the template's rendering of the whole conversation, each turn's thinking kept where it was sampled."""
    tokenizer = qwen3_multiturn(**({} if thinking else {"enable_thinking": False}))
    tools = TOOLS if with_tools else None
    check_extendable(tokenizer, tools)
    texts = THINKING[thinking] if with_tools else [t.replace(TOOL_CALL["qwen2_5_instruct"], "I will work it out.")
                                                   for t in THINKING[thinking]]
    replies = [TOOL_REPLY, USER_REPLY] if with_tools else [USER_REPLY, SECOND_USER_REPLY]
    ids, _ = rollout(tokenizer, QUESTION, texts, replies, tools)
    full = render(tokenizer, conversation(QUESTION, texts, replies), tools, add_generation_prompt=False)
    assert ids_of(tokenizer, full) == ids + ids_of(tokenizer, "\n")
    text = decode(tokenizer, ids)
    assert text.count("<think>") == 3 and text.count("<|im_start|>assistant") == 3
    if thinking:
        assert "I multiply." in text or "I will work it out." in text
        assert "<think>\n\n</think>" not in text  # no empty block is ever inserted
    else:
        assert text.count("<think>\n\n</think>\n\n") == 3  # the generation prompt's, before every turn


def test_qwen3_multiturn_renders_stock_qwen3_where_nothing_follows_the_turns():
    """Where the stock template renders a conversation as sampled (reasoning in the last turn, tools), ours
    renders it the same: the model sees the format it was trained on."""
    ours, stock = qwen3_multiturn(), build("qwen3")
    messages = conversation(QUESTION, [THINKING[True][0], THINKING[True][1]], [TOOL_REPLY])
    for generation_prompt in (False, True):
        assert (render(ours, messages, TOOLS, add_generation_prompt=generation_prompt)
                == render(stock, messages, TOOLS, add_generation_prompt=generation_prompt))
    off = qwen3_multiturn(enable_thinking=False)
    assert (off.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
            == stock.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True, enable_thinking=False))
    # a default, not a constant: a caller's own enable_thinking still wins
    assert off.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True, enable_thinking=True).endswith(
        "<|im_start|>assistant\n")


def test_chat_template_settings_are_checked_before_anything_loads(tmp_path):
    from verl_hf import VerlConfig

    def config(**fields):
        return VerlConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **fields)

    with pytest.raises(ValueError, match=r"chat_template='qwen4': neither a template shipped with verl_hf "
                                         r"\(qwen3_multiturn\) nor an existing \.jinja file"):
        config(chat_template="qwen4")
    with pytest.raises(ValueError, match=r"chat_template_kwargs: enable_thinking=\[1\]: only true/false"):
        config(chat_template="qwen3_multiturn", chat_template_kwargs={"enable_thinking": [1]})
    with pytest.raises(ValueError, match="chat_template_kwargs=.* is not valid JSON .*'{\"enable_thinking\": false}'"):
        config(chat_template_kwargs="{enable_thinking: false}")
    mine = tmp_path / "mine.jinja"
    mine.write_text("{{ messages[0].content }}")
    assert config(chat_template=str(mine), chat_template_kwargs='{"enable_thinking": false}').chat_template_kwargs == {
        "enable_thinking": False}


@pytest.mark.parametrize("name", ["mistral_7b_instruct_v0_3", "mistral_small_3_1_instruct"])
def test_mistral_tool_results_carry_the_call_ids_and_user_replies_with_tools_do_not_extend(name):
    """Mistral's templates render a tool result only with a 9-character `tool_call_id`: the tool environment
    gives the one the model wrote, or call_id(n) (what check_extendable tries); without one the template raises.
    A user's reply with tools does not extend the conversation (the tools move to the last user message)."""
    tokenizer = build(name)
    turn = ids_of(tokenizer, MISTRAL_CALL) + [tokenizer.eos_token_id]
    assert decode(tokenizer, continuation_ids(tokenizer, QUESTION, turn, TOOL_REPLY, TOOLS)) == (
        '[TOOL_RESULTS] {"content": 408, "call_id": "a1b2c3d4e"}[/TOOL_RESULTS]')
    with pytest.raises(ChatTemplateError, match="Tool call IDs should be alphanumeric|no attribute 'tool_call_id'"):
        continuation_ids(tokenizer, QUESTION, turn, [{"role": "tool", "name": "multiply", "content": "408"}], TOOLS)
    with pytest.raises(ChatTemplateError, match=r"expected 'AVAILABLE_TOOLS\] \[.*got 'INST\]"):
        continuation_ids(tokenizer, QUESTION, turn, USER_REPLY, TOOLS)


@pytest.mark.parametrize("name,parser", sorted(PARSER.items()))
def test_the_tool_call_parser_must_read_the_format_the_template_teaches(name, parser):
    """Each template with its parser passes; any other built-in parser is refused naming the one that fits (the
    model would write calls it never reads). Gemma's templates teach no format: nothing to check."""
    from verl_hf.agent.parsers import TOOL_CALL_PARSERS, check_parser_fits_template

    template = build(name).chat_template
    check_parser_fits_template(parser, template)
    for other in sorted(set(TOOL_CALL_PARSERS) - {parser}):
        with pytest.raises(ValueError, match=f"tool_call_parser='{other}' reads .* set tool_call_parser='{parser}'"):
            check_parser_fits_template(other, template)
    check_parser_fits_template("hermes", build("gemma3_it").chat_template)
    check_parser_fits_template(lambda text: [], template)  # a user's own parser: theirs to fit


@pytest.mark.parametrize("name", ["gemma2_it", "gemma3_it"])
def test_gemma_refuses_tools_and_renders_no_tool_turn(name):
    """Gemma's templates show no tools and raise on any role but alternating user/model: tools= is refused at
    start-up; without tools, user replies work (test_loop_sequence_...), a `tool` reply does not render."""
    tokenizer = build(name)
    with pytest.raises(ChatTemplateError, match=re.escape("the chat template ignores tools=: the model would never "
                                                          "see ['multiply']")):
        check_extendable(tokenizer, TOOLS)
    turn = ids_of(tokenizer, "I will work it out.") + [tokenizer.eos_token_id]
    assert decode(tokenizer, continuation_ids(tokenizer, QUESTION, turn, USER_REPLY)) == (
        "\n<start_of_turn>user\nAnd 408 plus 1?<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        continuation_ids(tokenizer, QUESTION, turn, TOOL_REPLY)


REFUSED = [  # (template, with tools, what the start-up refusal says)
    ("qwq_32b", True, r"with a turn that thinks first \(<think>...</think>\), the chat template cannot be extended "
                      r"turn by turn: .*expected '<think>\\nI multiply.\\n</think>\\n\\n I will wo', got ' I will work "
                      r"it out. \\n<tool_call>"),
    ("qwq_32b", False, r"with a turn that thinks first .*expected '<think>\\nI multiply.\\n</think>\\n\\n I will wo', "
                       r"got ' I will work it out. <\|im_end\|>"),
    ("deepseek_r1_distill_qwen", True, r"the chat template ignores tools=: the model would never see \['multiply'\]"),
    ("deepseek_v3_1", True, r"the chat template ignores tools=: the model would never see \['multiply'\]"),
    ("glm_4_5", True, r"the chat template does not end an assistant turn with the token the model ended it with"),
    ("glm_4_6", False, r"the chat template does not end an assistant turn with the token the model ended it with"),
    ("phi_4_mini", True, r"cannot be extended turn by turn: .*expected 'assistant\|>', got 'tool\|>408<\|end\|>"),
    ("phi_4_mini", False, r"cannot be extended turn by turn: .*expected 'assistant\|>', got 'user\|>408<\|end\|>"),
]


@pytest.mark.parametrize("name,with_tools,message", REFUSED, ids=[f"{n}-{'tools' if t else 'no_tools'}"
                                                                   for n, t, _ in REFUSED])
def test_templates_that_cannot_be_extended_are_refused_with_the_reason(name, with_tools, message):
    """QwQ drops an assistant turn's reasoning once another message follows it (the last turn keeps it: caught
    by the trial turn that thinks first); DeepSeek-R1-Distill's and V3.1's templates show no tools; GLM-4.5/4.6
    end a turn with no token of its own (the model samples the next role's token, which opens the reply);
    vLLM's Phi-4-mini template appends the assistant header whether or not a generation prompt is asked for."""
    with pytest.raises(ChatTemplateError, match=message):
        check_extendable(build(name), TOOLS if with_tools else None)


def test_deepseek_r1_keeps_each_turns_reasoning_as_sampled_where_its_template_drops_it():
    """DeepSeek-R1-Distill's template renders every assistant turn without its reasoning, the same whatever
    follows (so it extends turn by turn), and opens each turn with '<think>\\n' in the generation prompt: the
    training sequence is the prompt, each turn as sampled (reasoning kept, as the model saw it while sampling the
    next turn) and the template's continuation; the template's rendering of the conversation differs from it by
    exactly the reasoning."""
    tokenizer = build("deepseek_r1_distill_qwen")
    check_extendable(tokenizer)
    thoughts = ["I multiply.\n</think>", "One more.\n</think>"]  # '<think>\n' came with the prompt
    answers = ["\n\n12 times 34 is 408.", "\n\n409."]
    ids, recorded = rollout(tokenizer, QUESTION, [t + a for t, a in zip(thoughts, answers)], [USER_REPLY])
    assert decode(tokenizer, ids) == (
        "<｜begin▁of▁sentence｜><｜User｜>What is 12 times 34?<｜Assistant｜><think>\nI multiply.\n</think>\n\n12 times 34 "
        "is 408.<｜end▁of▁sentence｜><｜User｜>And 408 plus 1?<｜Assistant｜><think>\nOne more.\n</think>\n\n409."
        "<｜end▁of▁sentence｜>")
    rendered = render(tokenizer, recorded, None, add_generation_prompt=False)
    expected = decode(tokenizer, ids)
    for thought in thoughts:
        expected = expected.replace("<think>\n" + thought, "")
    assert rendered == expected


def test_gemma3_pythonic_renders_a_call_of_two_arguments_without_their_comma():
    """vLLM's Gemma 3 pythonic template renders `[multiply(a=12b=34)]` for a call of two arguments (its
    separator flag is set inside a for loop, where jinja's `set` does not outlive the iteration), which no Python
    parser reads. The loop's training sequence keeps the call as sampled: only what follows the turn's end comes
    from the template."""
    tokenizer = build("gemma3_pythonic")
    call = "[multiply(a=12, b=34)]"
    calls = calls_in("gemma3_pythonic", [call])
    assert calls[0][0]["function"] == {"name": "multiply", "arguments": {"a": 12, "b": 34}}
    shown = render(tokenizer, conversation(QUESTION, [call], [], calls), TOOLS, add_generation_prompt=False)
    assert "<start_of_turn>model\n[multiply(a=12b=34)]<end_of_turn>" in shown
    ids, _ = rollout(tokenizer, QUESTION, [call, "408."], [TOOL_REPLY], TOOLS, [calls[0], ()])
    assert decode(tokenizer, ids).endswith(
        "<start_of_turn>model\n[multiply(a=12, b=34)]<end_of_turn>\n<start_of_turn>user\n<tool_response>\n408"
        "</tool_response><end_of_turn>\n<start_of_turn>model\n408.<end_of_turn>")
