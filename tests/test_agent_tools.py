"""Tools, tool-call parsing, the tool environment's limits, and token-in/token-out continuations from the chat
template (verl_hf/agent/): unit tests on a real BPE tokenizer with a ChatML template."""

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from architectures import CHATML, CHATML_TOOLS, build_tokenizer  # noqa: E402

from verl_hf.agent import (ChatTemplateError, Step, ToolCall, ToolEnvironment, as_tools, check_extendable,  # noqa: E402
                           continuation_ids, environment_factory, parse_hermes, parse_llama3_json,
                           parse_mistral, parse_pythonic)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def fails(x: str) -> str:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ValueError("no luck")


def hangs(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "woke"


async def async_add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    await asyncio.sleep(0)
    return a + b


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tokenizer()
    tok.chat_template = CHATML_TOOLS
    return tok


def test_a_tool_schema_comes_from_type_hints_and_docstring():
    tools = as_tools([multiply, async_add])
    assert list(tools) == ["multiply", "async_add"]
    assert tools["multiply"].schema["function"]["parameters"]["properties"]["a"] == {
        "type": "integer", "description": "The first factor."}


def test_bad_tools_are_refused_by_name():
    def untyped(x):
        """Doc.

        Args:
            x: x.
        """

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="tool 'untyped': .*type hint"):
        as_tools([untyped])
    with pytest.raises(ValueError, match="tool 'undocumented': .*docstring"):
        as_tools([undocumented])
    with pytest.raises(ValueError, match="two tools are named 'multiply'"):
        as_tools([multiply, multiply])
    with pytest.raises(TypeError, match="is a int, not a callable"):
        as_tools([3])
    with pytest.raises(ValueError, match="tool 'no_such_module_zz:f': cannot import module"):
        as_tools(["no_such_module_zz:f"])
    assert list(as_tools(["test_agent_tools:multiply"])) == ["multiply"]  # the config form


def test_hermes_calls_and_what_is_wrong_with_the_others():
    text = ('<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call> then '
            '<tool_call>{"name": "multiply", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call>'
            '<tool_call>{not json}</tool_call><tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "x"')
    calls = parse_hermes(text)
    assert calls[0] == ToolCall("multiply", {"a": 2, "b": 3}) and calls[1] == ToolCall("multiply", {"a": 1, "b": 1})
    assert "not valid JSON" in calls[2].error and "expected" in calls[3].error and "not closed" in calls[4].error
    assert parse_hermes("no calls here") == []


def test_mistral_calls_in_both_formats_ids_kept_and_what_is_wrong_with_the_others():
    """The JSON-list format (v0.3 to Small 3.1) with and without the model's ids, the name[ARGS] format with and
    without [CALL_ID]; text before [TOOL_CALLS] is content; each broken call says what is wrong."""
    listed = ('Let me. [TOOL_CALLS] [{"name": "multiply", "arguments": {"a": 2, "b": 3}, "id": "a1b2c3d4e"}, '
              '{"name": "multiply", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}]')
    assert parse_mistral(listed) == [ToolCall("multiply", {"a": 2, "b": 3}, id="a1b2c3d4e"),
                                     ToolCall("multiply", {"a": 1, "b": 1})]
    named = '[TOOL_CALLS]multiply[ARGS]{"a": 2, "b": 3}[TOOL_CALLS]multiply[CALL_ID]x9y8z7w6v[ARGS]{"a": 4, "b": 5}'
    assert parse_mistral(named) == [ToolCall("multiply", {"a": 2, "b": 3}),
                                    ToolCall("multiply", {"a": 4, "b": 5}, id="x9y8z7w6v")]
    broken = [parse_mistral(t)[0].error for t in ("[TOOL_CALLS] [{not json}]", "[TOOL_CALLS] [1]",
                                                    "[TOOL_CALLS]multiply[ARGS]{bad", "[TOOL_CALLS]multiply[ARGS][1]",
                                                    "[TOOL_CALLS]", "[TOOL_CALLS]no args here")]
    assert "not valid JSON after [TOOL_CALLS]" in broken[0] and "got int" in broken[1]
    assert "after [ARGS] are not valid JSON" in broken[2] and "must be a JSON object" in broken[3]
    assert all("expected [TOOL_CALLS]<tool>[ARGS]" in e for e in broken[4:])
    bad_ids = [parse_mistral(t)[0].error for t in ('[TOOL_CALLS] [{"name": "multiply", "arguments": {}, "id": "abc"}]',
                                                   "[TOOL_CALLS]multiply[CALL_ID]call_1[ARGS]{}")]
    assert all("the call's id must be 9 letters or digits" in e for e in bad_ids)  # the templates could not render it
    assert parse_mistral("The answer is 6.") == [] and parse_mistral("<tool_call>{}</tool_call>") == []


def test_llama3_json_calls_one_or_several_and_an_answer_calls_nothing():
    one = '<|python_tag|>{"name": "multiply", "parameters": {"a": 2, "b": 3}}'
    assert parse_llama3_json(one) == [ToolCall("multiply", {"a": 2, "b": 3})]
    two = ' {"name": "multiply", "parameters": {"a": 2, "b": 3}}; {"name": "multiply", "arguments": {"a": 1, "b": 1}}'
    assert parse_llama3_json(two) == [ToolCall("multiply", {"a": 2, "b": 3}), ToolCall("multiply", {"a": 1, "b": 1})]
    assert parse_llama3_json("12 times 34 is 408.") == []
    assert "not valid JSON" in parse_llama3_json('{"name": "multiply"')[0].error
    assert "expected" in parse_llama3_json('{"name": "multiply", "parameters": 3}')[0].error


def test_pythonic_calls_are_read_as_literals_never_run():
    text = '[multiply(a=12, b=34), multiply(a=1, b=2)]'
    assert parse_pythonic(text) == [ToolCall("multiply", {"a": 12, "b": 34}), ToolCall("multiply", {"a": 1, "b": 2})]
    assert parse_pythonic("[multiply(a=(1, 2), b={'c': None})]") == [
        ToolCall("multiply", {"a": [1, 2], "b": {"c": None}})]
    for answer in ("12 times 34 is 408.", "[1, 2, 3]", "[the docs](https://example.com)", "[]"):
        assert parse_pythonic(answer) == []  # answers that open with "[" call nothing
    errors = [parse_pythonic(t)[0].error for t in ("[multiply(a=12", "[f(a=x)]", "[__import__('os')]",
                                                    "[f(**{'a': 1})]", "[f(a={1, 2})]", "[f(a={(1,): 2})]")]
    assert "not a Python list of calls" in errors[0] and "must be literals" in errors[1]
    assert "a tool's name and keyword arguments" in errors[2] and "not **arguments" in errors[3]
    assert "must be literals" in errors[4] and "must be literals" in errors[5]  # a set, a tuple key: not JSON


def test_a_parser_that_raises_is_a_malformed_call_the_model_reads():
    def fragile(text: str):
        raise RecursionError("maximum recursion depth exceeded")

    step = _step(ToolEnvironment(as_tools([multiply]), parser=fragile), "[[[[[[")
    assert step.statuses == ("malformed",) and not step.done
    assert "could not be read (RecursionError: maximum recursion depth exceeded)" in step.messages[0]["content"]


def test_each_result_names_its_call_the_models_id_or_the_samples_count_and_the_turn_carries_its_calls():
    """A call's result carries the id the model wrote, else call_id(n) for the sample's n-th call (counted
    across turns, malformed and unknown calls included, so ids never repeat); the Step hands the parsed calls,
    in the templates' form, for the conversation's assistant message."""
    env = ToolEnvironment(as_tools([multiply]), parser="mistral")
    first = _step(env, '[TOOL_CALLS] [{"name": "multiply", "arguments": {"a": 2, "b": 3}, "id": "a1b2c3d4e"}, '
                       '{"name": "multiply", "arguments": {"a": 1, "b": 1}}, {"bad": 1}]')
    assert [m["tool_call_id"] for m in first.messages] == ["a1b2c3d4e", "call00002", "call00003"]
    assert [m["content"] for m in first.messages[:2]] == ["6", "1"] and first.statuses[2] == "malformed"
    assert first.tool_calls == (
        {"id": "a1b2c3d4e", "type": "function", "function": {"name": "multiply", "arguments": {"a": 2, "b": 3}}},
        {"id": "call00002", "type": "function", "function": {"name": "multiply", "arguments": {"a": 1, "b": 1}}})
    second = _step(env, '[TOOL_CALLS]multiply[ARGS]{"a": 4, "b": 5}')
    assert [m["tool_call_id"] for m in second.messages] == ["call00004"] and second.messages[0]["content"] == "20"
    assert _step(env, "The answer is 20.") == Step(done=True)


def _step(env, text):
    return asyncio.run(env.step({"role": "assistant", "content": text}))


def _call(name, **arguments):
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_the_tool_environment_answers_every_call_and_counts_what_went_wrong():
    env = ToolEnvironment(as_tools([multiply, fails, hangs, async_add]), timeout_s=0.3)
    step = _step(env, _call("multiply", a=6, b=7) + _call("async_add", a=1, b=2) + _call("fails", x="?")
                 + _call("hangs", seconds=30) + _call("nope") + "<tool_call>{bad}</tool_call>")
    assert step.statuses == ("ok", "ok", "error", "timeout", "unknown_tool", "malformed") and not step.done
    contents = [m["content"] for m in step.messages]
    assert contents[:2] == ["42", "3"] and contents[2] == "Error: ValueError: no luck"
    assert "did not return within 0.3 s" in contents[3] and "no tool named 'nope'" in contents[4]
    assert "could not be parsed" in contents[5] and all(m["role"] == "tool" for m in step.messages)
    assert _step(env, "The answer is 42.") == Step(done=True)  # no call: the final answer


def exits(code: int) -> str:
    """Exit, as a code interpreter's program may.

    Args:
        code: The exit status.
    """
    raise SystemExit(code)


async def exits_async(code: int) -> str:
    """Exit from a coroutine.

    Args:
        code: The exit status.
    """
    raise SystemExit(code)


def test_a_tool_that_exits_is_an_error_the_model_reads_and_the_loop_lives_on():
    """SystemExit (a program's exit()) from a sync or an async tool is the call's error, not the end of the
    event loop the rewards and tools share: later calls on it still run."""
    env = ToolEnvironment(as_tools([exits, exits_async, multiply]), timeout_s=5)
    start = time.perf_counter()
    step = _step(env, _call("exits", code=3) + _call("exits_async", code=4) + _call("multiply", a=2, b=3))
    assert step.statuses == ("error", "error", "ok") and time.perf_counter() - start < 2.0
    assert [m["content"] for m in step.messages] == ["Error: RuntimeError: SystemExit: 3", "Error: SystemExit: 4", "6"]
    assert _step(env, _call("multiply", a=4, b=5)).messages[0]["content"] == "20"


def test_calls_beyond_the_limit_are_not_run_and_end_the_episode():
    env = ToolEnvironment(as_tools([multiply]), max_tool_calls=2)
    first = _step(env, _call("multiply", a=1, b=1))
    assert first.statuses == ("ok",) and not first.done
    second = _step(env, _call("multiply", a=2, b=2) + _call("multiply", a=3, b=3))
    assert second.statuses == ("ok", "over_limit") and second.done


def test_sixteen_sleeping_calls_run_at_once():
    env = ToolEnvironment(as_tools([hangs]), max_tool_calls=16, timeout_s=5)
    start = time.perf_counter()
    step = _step(env, _call("hangs", seconds=0.5) * 16)
    assert step.statuses == ("ok",) * 16 and time.perf_counter() - start < 2.0  # one after another: 8 s


def test_an_environment_must_be_a_factory():
    with pytest.raises(TypeError, match="Pass the class, not an instance"):
        environment_factory(ToolEnvironment(as_tools([multiply])), {}, "hermes", 1, 1.0)
    with pytest.raises(TypeError, match="must be a factory"):
        environment_factory("env", {}, "hermes", 1, 1.0)
    with pytest.raises(TypeError, match=r"environment=<lambda>\(row\) must be callable with no arguments .*reset\(row\)"):
        environment_factory(lambda row: ToolEnvironment(as_tools([multiply])), {}, "hermes", 1, 1.0)

    class NeedsALevel:
        def __init__(self, level):
            self.level = level

    with pytest.raises(TypeError, match=r"environment=NeedsALevel\(level\) must be callable with no arguments"):
        environment_factory(NeedsALevel, {}, "hermes", 1, 1.0)
    assert isinstance(environment_factory(None, as_tools([multiply]), "hermes", 1, 1.0)(), ToolEnvironment)


def test_the_continuation_is_the_templates_suffix(tokenizer):
    """The ids after a sampled turn: the closing of that turn, the tool message, the next assistant header;
    prompt + turn + continuation is exactly the template's rendering of the longer conversation."""
    tools = [t.schema for t in as_tools([multiply]).values()]
    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    turn = tokenizer(_call("multiply", a=6, b=7), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    answer = [{"role": "tool", "content": "42"}]
    ids = continuation_ids(tokenizer, messages, turn, answer, tools)
    assert tokenizer.decode(ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": tokenizer.decode(turn[:-1])},
                                           *answer], tools=tools, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(tokenizer(prompt, add_special_tokens=False).input_ids + turn + ids) == whole


def test_templates_that_cannot_be_extended_are_refused(tokenizer):
    check_extendable(tokenizer, [t.schema for t in as_tools([multiply]).values()])
    plain = build_tokenizer()
    plain.chat_template = CHATML
    with pytest.raises(ChatTemplateError, match="ignores tools="):
        check_extendable(plain, [t.schema for t in as_tools([multiply]).values()])
    rewriting = build_tokenizer()  # drops every earlier assistant turn, as reasoning templates do
    rewriting.chat_template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}<|im_start|>"
                               "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(ChatTemplateError, match="cannot be extended turn by turn"):
        check_extendable(rewriting)
    none = build_tokenizer()
    none.chat_template = None
    with pytest.raises(ChatTemplateError, match="need a tokenizer with a chat template"):
        check_extendable(none)


def test_a_tool_abandoned_at_its_limit_ends_quietly_after_its_loop_closed():
    """The thread of a timed-out sync tool finishes later, when nobody waits and its event loop may be gone:
    it ends without an exception of its own."""
    import threading

    errors, hook = [], threading.excepthook
    threading.excepthook = lambda info: errors.append(info.exc_value)
    try:
        step = _step(ToolEnvironment(as_tools([hangs]), timeout_s=0.2), _call("hangs", seconds=0.6))
        time.sleep(1.0)
    finally:
        threading.excepthook = hook
    assert step.statuses == ("timeout",) and errors == []
