"""Loading a user's callable from a config string: "pkg.module:function" or "path/to/file.py:function".

Reward functions, cost functions and tools are named this way in YAML configs and on the command line; each
error says which kind of thing was being loaded, what was wrong, and what to write instead.

See it work: tests/test_rewards.py, tests/test_agent_tools.py.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from typing import Callable


def load_file_module(path: str, what: str):
    """Import a .py file by path under a unique, path-derived module name (two files both called rewards.py
    do not collide). `what` names the thing being loaded in errors, e.g. "reward function 'f.py:score'"."""
    if not os.path.isfile(path):
        raise ValueError(f"{what}: file {path!r} does not exist (cwd is {os.getcwd()!r}); give an absolute path "
                         f"or one relative to the working directory")
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:10]
    name = f"_verl_hf_user_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def load_callable(spec: str, kind: str, unknown: Callable[[str], Exception]) -> tuple[str, Callable]:
    """(attribute name, callable) for "pkg.module:function" or "path/to/file.py:function". `kind` ("reward
    function", "tool") is named in errors; `unknown(spec)` is the error for a string of neither form."""
    target, sep, attr = spec.rpartition(":")  # rpartition: a path may itself contain ':' (C:\...)
    if not sep or not target or not attr:
        raise unknown(spec)
    what = f"{kind} {spec!r}"
    if target.endswith(".py"):
        module = load_file_module(target, what)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise ValueError(f"{what}: cannot import module {target!r} ({exc}); check it is installed or on "
                             f"PYTHONPATH, or use 'path/to/file.py:{attr}'") from exc
    func = getattr(module, attr, None)
    if func is None or not callable(func):
        raise ValueError(f"{what}: {target!r} has no callable named {attr!r}; check the name after ':'")
    return attr, func
