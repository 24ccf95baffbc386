"""Numbers and switches given as text in Python: `VerlConfig(num_generations="8")` is refused by name before any
check compares it (YAML and the command line convert text through the field's type; Python keyword arguments
do not, and a comparison would fail with "'>=' not supported between 'str' and 'int'", or `bf16="false"` would
silently count as true).

See it work: tests/test_trl_names.py.
"""

from __future__ import annotations

import dataclasses
import functools
import typing

SCALARS = (bool, int, float)


@functools.cache
def scalar_fields(config_class) -> dict[str, tuple[type, bool]]:
    """Field name -> (bool, int or float; whether None is allowed), for the fields whose type is that scalar (or
    that scalar or None)."""
    hints = typing.get_type_hints(config_class)
    out = {}
    for field in dataclasses.fields(config_class):
        hint = hints.get(field.name)
        while typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        args = typing.get_args(hint)
        options = [a for a in args if a is not type(None)] if args else [hint]
        if len(options) == 1 and options[0] in SCALARS:
            out[field.name] = (options[0], type(None) in args)
    return out


def check_value_types(cfg) -> None:
    """ValueError for the first scalar field given as text, or as None where it takes none, naming it, its type
    and the value to pass instead."""
    for name, (kind, optional) in scalar_fields(type(cfg)).items():
        value = getattr(cfg, name)
        article = "an" if kind is int else "a"
        if isinstance(value, str):
            raise ValueError(f"{name}={value!r} is text, and {name} takes {article} {kind.__name__}: pass "
                             f"{name}={_as(kind, value)} (YAML and the command line convert text; Python does not).")
        if value is None and not optional:
            raise ValueError(f"{name}=None: {name} takes {article} {kind.__name__}; give one, or leave it out for the "
                             f"default.")


def _as(kind: type, text: str) -> str:
    """What the user probably meant, written as Python, or `<a bool/int/float>`."""
    try:
        if kind is bool:
            return {"true": "True", "false": "False", "1": "True", "0": "False"}[text.strip().lower()]
        return repr(kind(float(text)) if kind is int and float(text).is_integer() else kind(text))
    except (KeyError, ValueError):
        return f"<a {kind.__name__}>"
