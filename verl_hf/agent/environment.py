"""Environments: what answers the model between its turns. `tools=` builds one (`ToolEnvironment`); a user's
`environment=` factory makes one per sample, for games, simulators, user simulators and graders that keep
state across turns.

The protocol, each method sync or `async`:
- `reset(row) -> list[dict] | None`: the messages the conversation starts with (None: the row's prompt);
- `step(message) -> Step`: the model's turn as an assistant message {"role": "assistant", "content": ...};
  returns the messages that answer it, an optional reward for that turn, and whether the episode is over.

See it work: tests/test_agent_loop.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from .parsers import tool_call_parser
from .tools import Tool, ToolCall, ToolResult, answer


@dataclass(frozen=True)
class Step:
    """An environment's answer to one assistant turn. `reward`: for that turn (placed on its last token),
    None for none. `statuses`: what each tool call of the turn did (tools.STATUSES), for the metrics.
    `tool_calls`: the calls read from the turn, in the chat templates' form ({"id", "type": "function",
    "function": {"name", "arguments"}}); the conversation's assistant message carries them, as templates that
    render a call turn from its calls require (Mistral's and Gemma's pythonic one count only plain turns as
    alternating: an environment of your own that answers calls on them must set it, and give each `tool`
    message the `tool_call_id` of its call)."""

    messages: list[dict] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    statuses: tuple[str, ...] = ()
    tool_calls: tuple[dict, ...] = ()


class ToolEnvironment:
    """Holds: the tools, the parser, the per-call time limit, how many calls this sample has left, and how
    many it has made (for their ids).

    Each assistant turn's tool calls run concurrently and answer as `tool` messages, in order, each with the
    `tool_call_id` of its call: the id the model wrote (Mistral's formats), else `call_id(n)` for the sample's
    n-th call, which is what templates that need ids read and the others ignore. A turn
    without a tool call is the final answer (done). A turn that goes past `max_tool_calls` ends the episode:
    the calls beyond the limit are not run (their answers, in the reward functions' `messages`, say so)."""

    def __init__(self, tools: dict[str, Tool], parser="hermes", max_tool_calls: int = 8,
                 timeout_s: float | None = 60.0):
        self.tools, self.parse, self.timeout_s = tools, tool_call_parser(parser), timeout_s
        self.calls_left, self.calls_made = max_tool_calls, 0

    def reset(self, row: dict) -> None:
        return None

    async def step(self, message: dict) -> Step:
        try:
            calls = self.parse(message["content"])
        except Exception as exc:  # noqa: BLE001 - a parser's own failure on odd text: the model is told, the run lives
            calls = [ToolCall(None, error=f"the tool call could not be read ({type(exc).__name__}: {exc})")]
        if not calls:
            return Step(done=True)
        allowed, self.calls_left = calls[: max(self.calls_left, 0)], self.calls_left - len(calls)
        results = list(await asyncio.gather(*(answer(c, self.tools, self.timeout_s) for c in allowed)))
        if len(allowed) < len(calls):
            results += [ToolResult("Error: the limit of tool calls was reached; answer now.", "over_limit")] * (
                len(calls) - len(allowed))
        ids = [c.id or call_id(self.calls_made + k + 1) for k, c in enumerate(calls)]
        self.calls_made += len(calls)
        messages = [{"role": "tool", "name": c.name or "", "content": r.content, "tool_call_id": i}
                    for c, r, i in zip(calls, results, ids)]
        return Step(messages, done=self.calls_left < 0, statuses=tuple(r.status for r in results),
                    tool_calls=template_calls(calls, ids))


def template_calls(calls: list[ToolCall], ids: list[str]) -> tuple[dict, ...]:
    """The calls that parsed, as chat templates read an assistant message's `tool_calls` (arguments as a dict)."""
    return tuple({"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c, i in zip(calls, ids) if c.error is None)


def call_id(n: int) -> str:
    """The id of a sample's n-th tool call where the model wrote none: 9 alphanumeric characters, the form
    Mistral's templates require, and the same every run (the ids are tokens of the training sequence)."""
    return f"call{n:05d}"


def environment_return(completions, turn_rewards, **columns) -> list[float]:
    """Each episode's sum of the environment's per-turn rewards: the reward function of an `environment=` run
    that names none. Its weight is 0 (the turn rewards are in every estimator's return already), so it adds
    nothing to training; it is what evaluation's accuracy and `reward/environment_return` report."""
    return [float(sum(rewards)) for rewards in turn_rewards]


def _check_takes_no_arguments(factory) -> None:
    """The factory is called with no arguments (the row comes to reset()): say so before any model loads."""
    import inspect

    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C extension without a signature: found out at the first call
        return
    try:
        signature.bind()
    except TypeError as exc:
        name = getattr(factory, "__name__", type(factory).__name__)
        raise TypeError(f"environment={name}{signature} must be callable with no arguments ({exc}): it makes one "
                        f"environment per sample, and the dataset row reaches its reset(row).") from None


def environment_factory(environment, tools: dict[str, Tool], parser, max_tool_calls: int,
                        timeout_s: float | None) -> Callable[[], object]:
    """One factory for both front doors: `environment` (a class or zero-argument callable returning an object
    with reset/step) or, for `tools=`, a ToolEnvironment per sample."""
    if environment is not None:
        if not callable(environment) or (hasattr(environment, "step") and not isinstance(environment, type)):
            raise TypeError(f"environment= must be a factory (a class, or a function of no arguments returning an "
                            f"environment), called once per sample; got a {type(environment).__name__}. Pass the "
                            f"class, not an instance.")
        _check_takes_no_arguments(environment)
        return environment
    return lambda: ToolEnvironment(tools, parser, max_tool_calls, timeout_s)
