"""Tool calls parsed from the model's text.

A parser takes the text of one assistant turn and returns its `ToolCall`s in order; a call it cannot read
comes back with `error` set, so that the model is told what was wrong instead of the call vanishing. Built in:
"hermes", the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` format of Hermes, Qwen2.5 and Qwen3.
Any callable `text -> list[ToolCall]` may be given instead (`tool_call_parser=`).

See it work: tests/test_agent_tools.py.
"""

from __future__ import annotations

import json
import re
from typing import Callable

from .tools import ToolCall

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


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
        name = value.get("name") if isinstance(value, dict) else None
        arguments = value.get("arguments", {}) if isinstance(value, dict) else None
        if isinstance(arguments, str):  # some models emit the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            calls.append(ToolCall(name if isinstance(name, str) else None,
                                  error='expected {"name": "<tool>", "arguments": {...}}'))
            continue
        calls.append(ToolCall(name, arguments))
    return calls


TOOL_CALL_PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": parse_hermes}


def tool_call_parser(spec) -> Callable[[str], list[ToolCall]]:
    """A parser by name (TOOL_CALL_PARSERS) or the callable itself."""
    if callable(spec):
        return spec
    if spec not in TOOL_CALL_PARSERS:
        raise ValueError(f"tool_call_parser={spec!r}: unknown; built in: {sorted(TOOL_CALL_PARSERS)}, or pass a "
                         f"callable text -> list[ToolCall] (verl_hf.agent.ToolCall).")
    return TOOL_CALL_PARSERS[spec]
