"""Multi-turn and agentic rollouts: tools, environments and conversations, token in and token out.

tools.py        -- tools from plain callables (schemas from type hints and docstrings), calling them
parsers.py      -- tool calls parsed from the model's text ("hermes", "mistral", "llama3_json", "pythonic", or any
                   callable)
environment.py  -- the environment protocol (reset/step -> Step) and ToolEnvironment, what `tools=` builds
chat.py         -- the ids that answer a sampled turn, from the chat template as a suffix
loop.py         -- the rollout loop over any engine, and the RolloutBatch it makes

See it work: tests/test_agent_tools.py, tests/test_agent_loop.py, tests/test_agent_vllm.py.
"""

from .chat import ChatTemplateError, check_extendable, continuation_ids
from .environment import Step, ToolEnvironment, environment_factory, environment_return
from .loop import Conversation, MultiTurnRollout, to_batch
from .parsers import (TOOL_CALL_PARSERS, parse_hermes, parse_llama3_json, parse_mistral, parse_pythonic,
                      tool_call_parser)
from .tools import STATUSES, Tool, ToolCall, ToolResult, as_tools

__all__ = ["ChatTemplateError", "Conversation", "MultiTurnRollout", "STATUSES", "Step", "TOOL_CALL_PARSERS", "Tool",
           "ToolCall", "ToolEnvironment", "ToolResult", "as_tools", "check_extendable", "continuation_ids",
           "environment_factory", "environment_return", "parse_hermes", "parse_llama3_json", "parse_mistral",
           "parse_pythonic", "to_batch",
           "tool_call_parser"]
