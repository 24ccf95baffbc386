"""Tools for multi-turn rollouts: plain Python callables (sync or `async`), their schemas, and calling them.

A tool's JSON schema comes from its type hints and docstring through `transformers.utils.get_json_schema`,
the same schema `tokenizer.apply_chat_template(tools=...)` renders for the model, so a function that lacks
either is refused at start-up with its name. Calls run concurrently on the event loop the async rewards use
(sync tools each in a daemon thread), each within `timeout_s`; what a call returns, raises, or how it times
out becomes the text of the `tool` message the model reads next, and a status that is counted. A tool may
also return images (a PIL image, or a list of strings and PIL images): its message then holds image parts, which a
vision-language policy sees (verl_hf/vision/).

See it work: tests/test_agent_tools.py.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..loading import load_callable


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by `name`; `schema` is what the chat template shows it."""

    name: str
    func: Callable
    schema: dict


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from the model's text. `error`: why it could not be parsed (the model is told).
    `id`: the call's id where the model wrote one (Mistral's formats); its answer names it."""

    name: str | None
    arguments: dict | None = None
    error: str | None = None
    id: str | None = None


STATUSES = ("ok", "error", "timeout", "unknown_tool", "malformed", "over_limit")


@dataclass(frozen=True)
class ToolResult:
    """The content of the `tool` message answering one call, and what happened (one of STATUSES). `content`: its
    text, or for a tool that returned images the message's parts ({"type": "image", "image": <PIL image>} and
    {"type": "text", "text": ...}, in the order returned)."""

    content: str | list[dict]
    status: str


def as_tools(specs) -> dict[str, Tool]:
    """name -> Tool for callables or "pkg.module:fn" / "path/file.py:fn" strings. Refused with the tool's
    name: a spec of another type, a function without type hints or a docstring, two tools of one name."""
    from transformers.utils import get_json_schema

    tools: dict[str, Tool] = {}
    for spec in [specs] if callable(specs) or isinstance(specs, str) else list(specs or []):
        func = _resolve(spec)
        name = getattr(func, "__name__", type(func).__name__)
        try:
            schema = get_json_schema(func)
        except Exception as exc:  # DocstringParsingException, TypeHintParsingException: both say what is missing
            raise ValueError(f"tool {name!r}: {exc} A tool needs type hints on every argument and a docstring "
                             f"with an `Args:` section (Google style), which become the schema the model "
                             f"sees.") from exc
        if name in tools:
            raise ValueError(f"two tools are named {name!r}; the model calls tools by name, so each needs its own "
                             f"(rename one function, or wrap it).")
        tools[name] = Tool(name, func, schema)
    return tools


def _resolve(spec) -> Callable:
    if isinstance(spec, str):
        return load_callable(spec, "tool", lambda s: ValueError(
            f"tool {s!r}: give a callable, 'pkg.module:function' or 'path/to/file.py:function'."))[1]
    if not callable(spec):
        raise TypeError(f"tools: {spec!r} is a {type(spec).__name__}, not a callable; pass functions (or "
                        f"'pkg.module:function' strings).")
    return spec


async def call_anyhow(func: Callable, args: tuple = (), kwargs: dict | None = None, label: str = "call") -> Any:
    """Await an async function; run a sync one in a daemon thread of its own, so that many run at once and a
    hung one is abandoned at its time limit without holding up the loop or, at exit, the interpreter."""
    kwargs = kwargs or {}
    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):
        return await func(*args, **kwargs)
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result=None, error=None):
        if not future.done():  # cancelled at the time limit: nobody waits any more
            future.set_exception(error) if error is not None else future.set_result(result)

    def work():
        try:
            outcome = (func(*args, **kwargs), None)
        except Exception as exc:  # noqa: BLE001 - the caller reports it
            outcome = (None, exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit (a program's exit()) would stop the event loop
            outcome = (None, RuntimeError(f"{type(exc).__name__}: {exc}"))
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # abandoned at its time limit, and its loop has closed since: nobody waits
            pass

    threading.Thread(target=work, name=f"verl_hf-{label}", daemon=True).start()
    result = await future
    return await result if inspect.isawaitable(result) else result  # a sync wrapper that returns a coroutine


async def answer(call: ToolCall, tools: dict[str, Tool], timeout_s: float | None) -> ToolResult:
    """The ToolResult for one parsed call: its output, or what went wrong in words the model can act on."""
    if call.error is not None:
        return ToolResult(f"Error: the tool call could not be parsed ({call.error}).", "malformed")
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(f"Error: there is no tool named {call.name!r}; the tools are {sorted(tools)}.",
                          "unknown_tool")
    limit = asyncio.timeout(timeout_s)
    try:
        async with limit:
            output = await call_anyhow(tool.func, kwargs=call.arguments, label=f"tool-{tool.name}")
    except TimeoutError as exc:
        if limit.expired():
            return ToolResult(f"Error: {call.name} did not return within {timeout_s} s.", "timeout")
        return ToolResult(f"Error: TimeoutError: {exc}", "error")  # the tool's own, as it raised it
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the model reads what its call did (exit() included)
        return ToolResult(f"Error: {type(exc).__name__}: {exc}", "error")
    content = tool_content(output)
    empty = [part["image"].size for part in content if part["type"] == "image" and 0 in part["image"].size] \
        if isinstance(content, list) else []
    if empty:  # nothing to show (e.g. a crop of size 0 the model asked for)
        return ToolResult(f"Error: {call.name} returned an empty image ({empty[0][0]}x{empty[0][1]} pixels).", "error")
    return ToolResult(content, "ok")


def tool_content(output) -> str | list[dict]:
    """A tool's return value as its message's content: a string as it is; a PIL image, or a list or tuple holding
    some, as image and text parts in order (other items as JSON text); anything else as JSON text."""
    items = output if isinstance(output, (list, tuple)) else [output]
    if not any(is_image(item) for item in items):
        return output if isinstance(output, str) else json.dumps(output, default=str)
    return [{"type": "image", "image": item} if is_image(item) else
            {"type": "text", "text": item if isinstance(item, str) else json.dumps(item, default=str)}
            for item in items]


def is_image(value) -> bool:
    """True for a PIL image (PIL is imported only by code that made one)."""
    image_module = sys.modules.get("PIL.Image")
    return image_module is not None and isinstance(value, image_module.Image)
