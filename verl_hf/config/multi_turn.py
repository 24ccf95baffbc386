"""Multi-turn rollouts (tools= / environment= on VerlTrainer, or `tools` here; verl_hf/agent/): turns, tool calls
and their time limits. Whether they take effect also depends on what VerlTrainer is given (applies.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from .applies import MULTI_TURN, WITH_TOOLS, _help, raise_first_failed


@dataclass
class MultiTurnFields:
    tools: list[str] | None = field(
        default=None,
        metadata=_help("Tools the model may call, as 'pkg.module:function' or 'path/file.py:function' (the config "
                       "form of VerlTrainer(tools=[...])): plain functions, sync or async, with type hints and a "
                       "docstring. Turns rollouts into conversations; max_response_length is then each sample's "
                       "total of model and tool tokens."),
    )
    max_turns: Annotated[int, MULTI_TURN] = field(default=5, metadata=_help("Multi-turn: the most assistant turns per sample."))
    max_turn_length: Annotated[int | None, MULTI_TURN] = field(
        default=None, metadata=_help("Multi-turn: the most tokens one assistant turn may sample (default: "
                                     "max_response_length)."))
    max_tool_calls: Annotated[int, WITH_TOOLS] = field(default=8, metadata=_help("Multi-turn with tools: the most tool calls per sample; "
                                                          "a turn that goes past it ends the sample."))
    tool_timeout_s: Annotated[float | None, WITH_TOOLS] = field(
        default=60.0, metadata=_help("Multi-turn with tools: seconds one tool call may take; past it the model "
                                     "reads a timeout error as the tool's answer. None: no limit."))
    tool_call_parser: Annotated[str, MULTI_TURN] = field(
        default="hermes", metadata=_help("Multi-turn with tools: how calls are read from the model's text: "
                                         "'hermes' (<tool_call>{json}</tool_call>: Hermes, Qwen2.5, Qwen3), 'mistral' "
                                         "([TOOL_CALLS] in its JSON-list and name[ARGS] formats, the ids the model "
                                         "writes kept for the results), 'llama3_json' (Llama 3.x's {\"name\", "
                                         "\"parameters\"} turns), 'pythonic' ([tool(arg=value)] lists: Gemma 3 "
                                         "and Llama 3.2 with vLLM's pythonic templates). Checked against the chat "
                                         "template's own format."))
    env_timeout_s: Annotated[float | None, MULTI_TURN] = field(
        default=300.0, metadata=_help("Multi-turn: seconds an environment may take to answer one turn (all its "
                                      "tool calls included); past it the run stops with the sample named."))


def resolve_multi_turn(cfg) -> None:
    if isinstance(cfg.tools, str):  # one tool, not its characters
        cfg.tools = [cfg.tools]


def check_multi_turn(cfg) -> None:
    raise_first_failed(cfg, [
        ("max_turns", cfg.max_turns >= 1, "must be >= 1"),
        ("max_turn_length", cfg.max_turn_length is None or 0 < cfg.max_turn_length <= cfg.max_response_length,
         "must be in [1, max_response_length] (None: max_response_length)"),
        ("max_tool_calls", cfg.max_tool_calls >= 0, "must be >= 0"),
        ("tool_timeout_s", cfg.tool_timeout_s is None or cfg.tool_timeout_s > 0, "must be > 0 (None: no limit)"),
        ("env_timeout_s", cfg.env_timeout_s is None or cfg.env_timeout_s > 0, "must be > 0 (None: no limit)"),
        ("tool_timeout_s", None in (cfg.tool_timeout_s, cfg.env_timeout_s) or cfg.tool_timeout_s < cfg.env_timeout_s,
         f"must be below env_timeout_s={cfg.env_timeout_s}: a tool call runs inside its environment's answer, so a "
         f"slow call would stop the run instead of telling the model it timed out"),
    ])
