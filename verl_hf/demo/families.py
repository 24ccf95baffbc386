"""The tool demo's model families: one task (tools_task.py), three formats.

- "llama": a tiny Llama with a ChatML template that lists the tools by signature, calls in Hermes format (the
  demo as it shipped first);
- "qwen3": a tiny Qwen3 with verl_hf's `qwen3_multiturn` template (Qwen3's own format: its tools system prompt,
  `<tool_call>` JSON, `<tool_response>` user turns), thinking on: every assistant turn opens with a short
  `<think>` block, kept in the history as sampled;
- "mistral": a tiny Mistral in Mistral's tool format (v0.3): `[AVAILABLE_TOOLS]` before the user's message,
  calls as `[TOOL_CALLS] [{"name", "arguments", "id"}]` with the id the model writes, results as
  `[TOOL_RESULTS] {"content", "call_id"}[/TOOL_RESULTS]`, answers after a space. Its template is our own in
  that format, listing the tools by signature as the Llama demo's does (a tiny model has no room for JSON
  schemas; Mistral's own template shows the whole schema).

See it work: tests/test_demo_tools.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


SIGNATURES = ("{% for t in tools %}{{ t['function']['name'] }}({{ t['function']['parameters']['properties'] | list | "
              "join(', ') }}){% if not loop.last %} {% endif %}{% endfor %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% set users = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}{% if tools and m == users[-1] %}[AVAILABLE_TOOLS] " + SIGNATURES +
    "[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m['content'] }}[/INST]"
    "{% elif m['role'] == 'assistant' and m.tool_calls is defined and m.tool_calls %}[TOOL_CALLS] ["
    "{% for c in m.tool_calls %}{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": "
    "{{ c['function']['arguments'] | tojson }}, \"id\": \"{{ c['id'] }}\"}{% if not loop.last %}, {% endif %}"
    "{% endfor %}]{{ eos_token }}"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}"
    "{% elif m['role'] == 'tool' %}[TOOL_RESULTS] {\"content\": {{ m['content'] }}, \"call_id\": "
    "\"{{ m['tool_call_id'] }}\"}[/TOOL_RESULTS]"
    "{% endif %}{% endfor %}"
)
MISTRAL_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                    "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")


@dataclass(frozen=True)
class Family:
    """A model family's architecture (`model_type`), tokens (the BPE's special tokens in id order, strings kept
    one token each but decoded as text, eos = the end of an assistant turn, pad, bos), tool-call parser and
    chat template ("" = the shipped qwen3_multiturn)."""

    name: str
    model_type: str
    specials: tuple[str, ...]
    single_tokens: tuple[str, ...]
    eos: str
    pad: str
    bos: str | None
    parser: str
    template: str
    vocab_size: int = 400
    max_positions: int = 256  # Qwen3's tools system prompt alone is about 200 tokens
    turn_length: int = 40  # the most tokens of one turn (Qwen3's think blocks make its turns longer)

    def chat_template(self) -> str:
        from ..agent.templates import template_text

        return self.template or template_text("qwen3_multiturn")

    def conversation(self, a: int, b: int, use_tool: bool) -> list[dict]:
        """A whole demo conversation in this family's format: with the tool (call, result, answer), or
        answered directly (one turn)."""
        from .tools_task import conversation

        if self.name == "llama":  # the demo's own (Hermes calls)
            return conversation(a, b, use_tool)
        question, answer = conversation(a, b, use_tool=False)
        said = answer["content"]
        if self.name == "qwen3":
            if not use_tool:
                return [question, {"role": "assistant", "content": f"<think>\nI know it.\n</think>\n\n{said}"}]
            call = json.dumps({"name": "multiply", "arguments": {"a": a, "b": b}})
            return [question, {"role": "assistant", "content": f"<think>\nI use the tool.\n</think>\n\n"
                                                               f"<tool_call>\n{call}\n</tool_call>"},
                    {"role": "tool", "name": "multiply", "content": str(a * b)},
                    {"role": "assistant", "content": f"<think>\nThe tool says {a * b}.\n</think>\n\n{said}"}]
        if not use_tool:  # mistral
            return [question, answer]
        # the call rendered from tool_calls, with the id a Mistral model writes
        call = {"id": "call00001", "type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
        return [question, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "multiply", "content": str(a * b), "tool_call_id": "call00001"}, answer]


def _families() -> dict[str, Family]:
    from .tiny import CHAT_SPECIAL_TOKENS, CHAT_TEMPLATE, TOOL_CALL_TOKENS

    return {
        "llama": Family("llama", "llama", tuple(CHAT_SPECIAL_TOKENS), tuple(TOOL_CALL_TOKENS), "<|im_end|>",
                        "<|endoftext|>", None, "hermes", CHAT_TEMPLATE),
        "qwen3": Family("qwen3", "qwen3", tuple(CHAT_SPECIAL_TOKENS),
                        (*TOOL_CALL_TOKENS, "<think>", "</think>", "<tool_response>", "</tool_response>"),
                        "<|im_end|>", "<|endoftext|>", None, "hermes", "", vocab_size=1000, max_positions=512,
                        turn_length=64),
        "mistral": Family("mistral", "mistral", MISTRAL_SPECIALS, (), "</s>", "<pad>", "<s>", "mistral",
                          MISTRAL_TEMPLATE),
    }


def family(name: str) -> Family:
    families = _families()
    if name not in families:
        raise ValueError(f"tool demo family {name!r}: choose one of {sorted(families)}.")
    return families[name]
