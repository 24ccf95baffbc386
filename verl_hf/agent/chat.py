"""Token in, token out: the ids that follow a sampled assistant turn, taken from the chat template as a suffix.

The training sequence of a multi-turn sample is the prompt's ids, then for each turn the ids the model
sampled (kept as sampled, never re-tokenized) and the ids of the messages that answer it (tool results,
the environment's reply) with the next assistant header. Only those answering messages are tokenized: the
template renders the conversation with and without them, and the difference is the suffix. That needs a
template that renders every conversation as an extension of its prefixes, and renders the model's own turn
exactly as it was sampled; `check_extendable` tries one at start-up and says what breaks it.

See it work: tests/test_agent_tools.py.
"""

from __future__ import annotations

from .environment import call_id, template_calls
from .tools import ToolCall


class ChatTemplateError(ValueError):
    """The chat template cannot be extended turn by turn (or ignores the tools it is given)."""


def render(tokenizer, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def assistant_turn(tokenizer, turn_ids: list[int], tool_calls=()) -> dict:
    """The assistant message of a sampled turn (`turn_ids` without its end-of-turn token, decoded with the
    special tokens kept), with the `tool_calls` read from it where there are any."""
    return with_calls({"role": "assistant", "content": tokenizer.decode(turn_ids[:-1], skip_special_tokens=False)},
                      tool_calls)


def with_calls(turn: dict, tool_calls) -> dict:
    return {**turn, "tool_calls": list(tool_calls)} if tool_calls else turn


def continuation_ids(tokenizer, messages: list[dict], turn_ids: list[int], new_messages: list[dict],
                     tools: list[dict] | None = None, tool_calls=()) -> list[int]:
    """The ids of `continuation_text` (the arguments are its)."""
    text = continuation_text(tokenizer, messages, turn_ids, new_messages, tools, tool_calls)
    return tokenizer(text, add_special_tokens=False).input_ids


def continuation_text(tokenizer, messages: list[dict], turn_ids: list[int], new_messages: list[dict],
                      tools: list[dict] | None = None, tool_calls=()) -> str:
    """The text to append after `turn_ids` (the model's turn, ending with its end-of-turn token, whose `tool_calls`
    were read from it) answering `messages` (the conversation it was shown): the rest of the template's closing
    of that turn, the `new_messages`, and the next assistant header. How the template renders the turn itself
    does not matter (some trim it, some render the calls from `tool_calls`): only what comes after its
    end-of-turn token, and that the longer conversation renders as an extension of the shorter one
    (ChatTemplateError otherwise)."""
    end_of_turn = tokenizer.decode(turn_ids[-1:], skip_special_tokens=False)
    turn = assistant_turn(tokenizer, turn_ids, tool_calls)
    try:
        answered = render(tokenizer, [*messages, turn], tools, add_generation_prompt=False)
        following = render(tokenizer, [*messages, turn, *new_messages], tools, add_generation_prompt=True)
    except Exception as exc:  # jinja's own errors (roles that must alternate, a role it has no turn for)
        roles = [m.get("role") for m in new_messages]
        raise ChatTemplateError(f"the chat template cannot render the reply {roles} after an assistant turn "
                                f"({type(exc).__name__}: {exc}).") from exc
    if not following.startswith(answered):
        raise ChatTemplateError(_mismatch("the conversation before the new messages", answered, following))
    closing = answered.rfind(end_of_turn)
    if closing < len(render(tokenizer, messages, tools, add_generation_prompt=True)):
        raise ChatTemplateError(f"the chat template does not end an assistant turn with the token the model ended "
                                f"it with ({end_of_turn!r}, the tokenizer's eos_token): set tokenizer.eos_token to "
                                f"the template's end-of-turn token (e.g. '<|im_end|>' for ChatML templates).")
    return answered[closing + len(end_of_turn):] + following[len(answered):]


def _mismatch(what: str, expected_prefix: str, rendered: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(expected_prefix, rendered)) if a != b),
              min(len(expected_prefix), len(rendered)))
    start = max(at - 20, 0)  # a little of what they share, so the snippets start where a reader can place them
    return (f"the chat template cannot be extended turn by turn: its rendering does not start with {what} "
            f"(they differ at character {at}, after {expected_prefix[start:at]!r}: expected "
            f"{expected_prefix[at:at + 40]!r}, got {rendered[at:at + 40]!r}). Multi-turn training keeps the "
            f"sampled ids, so the template must render earlier turns the same whatever follows them (Qwen3's "
            f"adds an empty <think> block to the last assistant turn only, and drops earlier reasoning); set "
            f"chat_template to one that does (your .jinja file), or pass a tokenizer with such a template.")


def _template_that_works(tokenizer) -> str:
    """The shipped template (agent/templates.py) for the family whose stock template was refused, or ""."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if "<|im_start|>" in template and "<think>" in template:
        return (" For Qwen3-family models set chat_template='qwen3_multiturn' (shipped with verl_hf: every turn "
                "rendered as sampled, thinking kept; chat_template_kwargs={'enable_thinking': False} turns thinking "
                "off).")
    return ""


def check_extendable(tokenizer, tools: list[dict] | None = None) -> None:
    """Refuse, before any training, a tokenizer without a chat template, a template that ignores `tools`,
    or one that cannot be extended by suffix (tried on a short conversation: with tools a tool reply to a
    turn that called the first tool, without them a user reply, whose turn text has the spaces some templates
    trim; again with a turn that thinks first where the template knows </think>), naming the shipped template
    that works where there is one."""
    try:
        _check_extendable(tokenizer, tools)
    except ChatTemplateError as exc:
        offer = _template_that_works(tokenizer)
        if not offer:
            raise
        raise ChatTemplateError(f"{exc}{offer}") from exc.__cause__


def _check_keeps_thinking(tokenizer, messages: list[dict], reply: list[dict], tools, calls) -> None:
    """A template that knows thinking blocks is tried again with a turn that thinks first: templates that drop
    earlier turns' reasoning (QwQ's, DeepSeek-R1's) would otherwise pass with the plain turn and fail on every
    real one."""
    if "</think>" not in tokenizer.chat_template:
        return
    turn = tokenizer("<think>\nI multiply.\n</think>\n\n I will work it out. ",
                     add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    try:
        continuation_ids(tokenizer, messages, turn, reply, tools, calls)
    except ChatTemplateError as exc:
        raise ChatTemplateError(f"with a turn that thinks first (<think>...</think>), {exc}") from exc.__cause__


def _check_extendable(tokenizer, tools: list[dict] | None) -> None:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ChatTemplateError("multi-turn rollouts need a tokenizer with a chat template (tokenizer.chat_template "
                                "is None).")
    if tokenizer.eos_token_id is None:
        raise ChatTemplateError("multi-turn rollouts need the tokenizer's eos_token (the end of an assistant turn).")
    messages = [{"role": "user", "content": "What is 12 times 34?"}]
    reply = [{"role": "tool", "content": "408", "tool_call_id": call_id(1)} if tools else
             {"role": "user", "content": "408"}]
    turn = tokenizer(" I will work it out. ", add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    calls = template_calls([ToolCall(tools[0]["function"]["name"], {})], [call_id(1)]) if tools else ()
    try:
        if tools:
            shown = render(tokenizer, messages, tools, add_generation_prompt=True)
            missing = [t["function"]["name"] for t in tools if t["function"]["name"] not in shown]
            if missing:
                raise ChatTemplateError(f"the chat template ignores tools=: the model would never see {missing}. "
                                        f"Use a tokenizer whose template renders `tools` (Qwen2.5, Llama 3.1, "
                                        f"Hermes, ...).")
        continuation_ids(tokenizer, messages, turn, reply, tools, calls)
        _check_keeps_thinking(tokenizer, messages, reply, tools, calls)
    except Exception as exc:
        cause = exc.__cause__ if isinstance(exc, ChatTemplateError) else exc
        if isinstance(exc, ChatTemplateError) and cause is None:  # our own finding, already says what and why
            raise
        # jinja's own errors (e.g. roles that must alternate, tool messages without the ids some templates want)
        raise ChatTemplateError(f"the chat template cannot render a multi-turn conversation ({type(cause).__name__}: "
                                f"{cause}); tried a user message, an assistant turn and a {reply[0]['role']!r} "
                                f"reply.") from cause
