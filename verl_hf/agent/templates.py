"""Chat templates the trainer can put on the tokenizer (`chat_template`, `chat_template_kwargs`): a template we
ship for a model family whose stock template cannot be extended turn by turn, or the user's own .jinja file,
with the keyword arguments the template reads (e.g. Qwen3's `enable_thinking`) set as its defaults, so every
rendering (prompts, multi-turn continuations, the saved tokenizer) uses the same ones.

Shipped (verl_hf/agent/templates/):
- "qwen3_multiturn": Qwen3's format with every assistant turn rendered as sampled, thinking included
  (the stock template drops earlier turns' thinking and adds an empty think block to the last turn only).

See it work: tests/test_chat_templates.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SHIPPED = {"qwen3_multiturn": "qwen3_multiturn.jinja"}
_FOLDER = Path(__file__).parent / "templates"


def template_text(spec: str) -> str:
    """The template named `spec` (SHIPPED) or read from the .jinja file at `spec`."""
    if spec in SHIPPED:
        return (_FOLDER / SHIPPED[spec]).read_text()
    path = Path(spec).expanduser()
    if path.suffix == ".jinja" and path.is_file():
        return path.read_text()
    raise ValueError(f"chat_template={spec!r}: neither a template shipped with verl_hf ({', '.join(sorted(SHIPPED))}) "
                     f"nor an existing .jinja file. Name one of those, or give the path of your template.")


def kwargs_problem(kwargs: dict) -> str:
    """Why `chat_template_kwargs` cannot be set as template defaults ("" when they can)."""
    for key, value in kwargs.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_]\w*", key):
            return f"key {key!r} is not a template variable name"
        if not isinstance(value, (bool, int, float, str)):
            return f"{key}={value!r}: only true/false, numbers and strings can be template defaults"
    return ""


def with_defaults(template: str, kwargs: dict) -> str:
    """`template` reading `kwargs` as defaults: a caller's own keyword arguments still win."""
    lines = [f"{{%- if {key} is not defined %}}{{%- set {key} = {_literal(value)} %}}{{%- endif %}}"
             for key, value in kwargs.items()]
    return "".join(lines) + template


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # numbers, and strings as JSON strings, which jinja reads alike


def put_chat_template(tokenizer, spec: str | None, kwargs: dict | None) -> None:
    """Set the tokenizer's chat template from `spec` (None: keep its own) with `kwargs` as defaults."""
    if spec is None and not kwargs:
        return
    template = template_text(spec) if spec is not None else getattr(tokenizer, "chat_template", None)
    if template is None:
        raise ValueError("chat_template_kwargs need a chat template: the tokenizer has none; set chat_template too.")
    if not isinstance(template, str):
        raise ValueError("chat_template_kwargs: the tokenizer has several named chat templates; set chat_template "
                         "to the one to train with.")
    tokenizer.chat_template = with_defaults(template, kwargs or {})
