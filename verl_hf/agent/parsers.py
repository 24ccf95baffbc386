"""Tool calls parsed from the model's text.

A parser takes the text of one assistant turn and returns its `ToolCall`s in order; a call it cannot read
comes back with `error` set, so that the model is told what was wrong instead of the call vanishing. Built in:
"hermes", the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` format of Hermes, Qwen2.5 and Qwen3.
"mistral", Mistral's `[TOOL_CALLS]` formats (their call ids kept); "llama3_json", Llama 3.x's JSON calls;
"pythonic", a Python list of calls (Gemma 3 and Llama 3.2 with vLLM's pythonic templates).
Any callable `text -> list[ToolCall]` may be given instead (`tool_call_parser=`).

See it work: tests/test_agent_tools.py.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Callable

from .tools import ToolCall

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"
_PYTHONIC = re.compile(r"\[\s*[A-Za-z_]\w*\s*\(")
_MISTRAL_NAMED = re.compile(r"(?P<name>[^\[\]{}\s]+)(\[CALL_ID\](?P<id>\S+?))?\[ARGS\](?P<arguments>.*)", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    """Every `<tool_call>...</tool_call>` block of `text`; an unclosed block, JSON that does not parse, or an
    object without a string "name" and an object "arguments" is a ToolCall with `error`."""
    calls = []
    for body, closing in _HERMES.findall(text):
        if not closing:
            calls.append(ToolCall(None, error="<tool_call> was not closed by </tool_call>"))
            continue
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(None, error=f"not valid JSON: {exc}"))
            continue
        calls.append(_from_object(value, "arguments"))
    return calls


def parse_mistral(text: str) -> list[ToolCall]:
    """The calls after `[TOOL_CALLS]`, in either of Mistral's formats: a JSON list (or object) of
    {"name", "arguments", "id"} (v0.3 to Small 3.1: the "id" the model wrote is kept, for its result's
    `tool_call_id`), or `[TOOL_CALLS]name[ARGS]{json}` per call, with `[CALL_ID]id` before `[ARGS]` in the
    formats that have it (Mistral Small 3.2, Magistral, Devstral, Ministral 3). Text before the first
    `[TOOL_CALLS]` is the turn's content."""
    at = text.find(_MISTRAL)
    if at < 0:
        return []
    calls = []
    for block in text[at + len(_MISTRAL):].split(_MISTRAL):
        body = block.strip()
        calls += _mistral_json(body) if body.startswith(("[", "{")) else [_mistral_named(body)]
    return calls


def _mistral_json(body: str) -> list[ToolCall]:
    try:
        value, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        return [ToolCall(None, error=f"not valid JSON after [TOOL_CALLS]: {exc}")]
    return [_mistral_id_checked(_from_object(item, "arguments"))
            for item in (value if isinstance(value, list) else [value])]


def _mistral_named(body: str) -> ToolCall:
    match = _MISTRAL_NAMED.fullmatch(body)
    if match is None:
        return ToolCall(None, error="expected [TOOL_CALLS]<tool>[ARGS]{...} or [TOOL_CALLS][{\"name\": \"<tool>\", "
                                    "\"arguments\": {...}}]")
    try:
        arguments = json.loads(match["arguments"])
    except json.JSONDecodeError as exc:
        return ToolCall(match["name"], error=f"the arguments after [ARGS] are not valid JSON: {exc}")
    if not isinstance(arguments, dict):
        return ToolCall(match["name"], error="the arguments after [ARGS] must be a JSON object")
    return _mistral_id_checked(ToolCall(match["name"], arguments, id=match["id"]))


def _mistral_id_checked(call: ToolCall) -> ToolCall:
    """A call whose id Mistral's templates cannot render (9 letters or digits) is malformed: the model is told."""
    if call.id is None or re.fullmatch(r"[A-Za-z0-9]{9}", call.id):
        return call
    return ToolCall(call.name, error=f"the call's id must be 9 letters or digits, got {call.id!r}")


def parse_llama3_json(text: str) -> list[ToolCall]:
    """Llama 3.x's JSON tool calls: a turn that is a JSON object {"name", "parameters"} (after an optional
    `<|python_tag|>`), or several separated by ";". A turn that does not open with "{" calls nothing (it is
    the answer); one that does but does not parse is a malformed call."""
    body = text.strip().removeprefix("<|python_tag|>").strip()
    calls, decoder, at = [], json.JSONDecoder(), 0
    while body.startswith("{", at):
        try:
            value, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError as exc:
            return [*calls, ToolCall(None, error=f"not valid JSON: {exc}")]
        calls.append(_from_object(value, "parameters"))
        at = len(body) - len(body[at:].lstrip().removeprefix(";").lstrip())
    return calls


def parse_pythonic(text: str) -> list[ToolCall]:
    """A turn that is a Python list of calls, `[name(arg=value, ...), ...]` with literal values (the format
    vLLM's Gemma 3 and Llama 3.2 "pythonic" templates teach: tools in the prompt, results as user turns). A turn
    that does not open with `[name(` calls nothing (it is the answer); one that does but is not such a list is a
    malformed call. Values are read with ast.literal_eval (nothing the model writes is run) and must be JSON's
    kinds (tuples become lists)."""
    body = text.strip()
    if not _PYTHONIC.match(body):  # an answer that opens with "[" (a list, a link) calls nothing
        return []
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError as exc:
        return [ToolCall(None, error=f"not a Python list of calls: {exc.msg}")]
    if not isinstance(tree, ast.List) or not tree.elts:
        return [ToolCall(None, error="expected [tool(arg=value, ...), ...]")]
    return [_pythonic_call(node) for node in tree.elts]


def _pythonic_call(node) -> ToolCall:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return ToolCall(None, error="expected tool(arg=value, ...): a tool's name and keyword arguments")
    if any(k.arg is None for k in node.keywords):
        return ToolCall(node.func.id, error="expected tool(arg=value, ...), not **arguments")
    try:
        arguments = {k.arg: _json_value(ast.literal_eval(k.value)) for k in node.keywords}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ToolCall(node.func.id, error="argument values must be literals (numbers, strings, lists, dicts)")
    return ToolCall(node.func.id, arguments)


def _json_value(value):
    """`value` with tuples as lists; anything JSON cannot hold (sets, bytes, complex numbers, keys that are not
    strings) is a ValueError."""
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("keys must be strings")
        return {k: _json_value(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _from_object(value, arguments_key: str) -> ToolCall:
    """The call a decoded JSON value describes: {"name": str, arguments_key: {...}} ("arguments" is read
    too, and arguments given as a JSON string), with its "id" if it has one; else a ToolCall with `error`."""
    if not isinstance(value, dict):
        return ToolCall(None, error=f'expected {{"name": "<tool>", "{arguments_key}": {{...}}}}, got '
                                    f'{type(value).__name__}')
    name = value.get("name")
    arguments = value.get(arguments_key, value.get("arguments", {}))
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return ToolCall(name if isinstance(name, str) else None,
                        error=f'expected {{"name": "<tool>", "{arguments_key}": {{...}}}}')
    call_id = value.get("id")
    return ToolCall(name, arguments, id=call_id if isinstance(call_id, str) else None)


TOOL_CALL_PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {
    "hermes": parse_hermes, "mistral": parse_mistral, "llama3_json": parse_llama3_json, "pythonic": parse_pythonic}
# What a chat template that teaches each format says (in its text), to catch a parser that does not fit it.
_TEMPLATE_MARKS = {"hermes": "<tool_call>", "mistral": _MISTRAL, "llama3_json": '"parameters"',
                   "pythonic": "[func_name1("}
_FORMATS = {"hermes": "<tool_call>{json}</tool_call>", "mistral": "[TOOL_CALLS] calls",
            "llama3_json": '{"name", "parameters"} JSON turns', "pythonic": "[tool(arg=value)] lists"}


def tool_call_parser(spec) -> Callable[[str], list[ToolCall]]:
    """A parser by name (TOOL_CALL_PARSERS) or the callable itself."""
    if callable(spec):
        return spec
    if spec not in TOOL_CALL_PARSERS:
        raise ValueError(f"tool_call_parser={spec!r}: unknown; built in: {sorted(TOOL_CALL_PARSERS)}, or pass a "
                         f"callable text -> list[ToolCall] (verl_hf.agent.ToolCall).")
    return TOOL_CALL_PARSERS[spec]


def check_parser_fits_template(spec, template) -> None:
    """Refuse a built-in parser whose format the chat template does not teach while it teaches another's (the
    model would write calls the parser never reads: every turn would end the sample as an answer)."""
    if callable(spec) or not isinstance(template, str) or _TEMPLATE_MARKS[spec] in template:
        return
    fits = [name for name, mark in _TEMPLATE_MARKS.items() if mark in template]
    if fits:
        raise ValueError(f"tool_call_parser={spec!r} reads {_FORMATS[spec]}, but the chat template teaches the "
                         f"model {_FORMATS[fits[0]]} (it says {_TEMPLATE_MARKS[fits[0]]!r}): set "
                         f"tool_call_parser={fits[0]!r}.")
