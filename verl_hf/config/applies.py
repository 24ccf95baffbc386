"""The one rule for settings that take effect only in some setups, and the helpers every stage's checks share.

A conditional field says its condition where it is declared, in its type:

    vllm_kv_cache_mb: Annotated[int | None, COLOCATED_VLLM] = field(default=None, metadata=_help("..."))

and `refuse_fields_that_cannot_apply` refuses any such field set away from its default where its condition
does not hold: nothing a user sets is silently ignored. The condition rides in `typing.Annotated` because
HfArgumentParser hands a field's metadata to argparse (which would reject an unknown key) and reads types
with `get_type_hints` without extras (so argparse sees the plain type).

A condition that depends on what `VerlTrainer` was given (tools=, environment=, teacher=) is unknown while the config
is built: it is checked there first with `given=None` (skipped), and again when the trainer starts.

See it work: tests/test_config.py.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing
from dataclasses import dataclass
from typing import Callable

from ..algorithms import advantage_spec


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class TrainerInputs:
    """What VerlTrainer was given beside the config that decides whether some fields take effect."""
    tools: bool = False
    environment: bool = False
    teacher: bool = False
    lora: bool = False  # the policy trains a LoRA adapter (peft_config=, or a PeftModel)
    vision: bool = False  # the policy is a vision-language model and processing_class its processor


@dataclass(frozen=True)
class Applies:
    """When a field takes effect. `when`: the setting a user makes, as they would write it; `holds(cfg, given)`:
    True or False, or None while the answer needs the trainer's inputs (`given` is None then); `shows`: the
    fields whose values the error quotes; `reason`: why, where the rule is not obvious (or `reason(cfg)`: why
    in this setup, "" when there is nothing to add)."""
    when: str
    holds: Callable[[object, TrainerInputs | None], bool | None]
    shows: tuple[str, ...] = ()
    reason: str | Callable[[object], str] = ""

    def because(self, reason: str | Callable[[object], str]) -> "Applies":
        return dataclasses.replace(self, reason=reason)

    def why(self, cfg) -> str:
        return self.reason(cfg) if callable(self.reason) else self.reason


def _engine(name: str) -> Applies:
    return Applies(f"rollout_engine={name!r}", lambda c, g: c.rollout_engine == name, shows=("rollout_engine",))


def _multi_turn(cfg, given: TrainerInputs | None) -> bool | None:
    if cfg.tools:
        return True
    return None if given is None else given.tools or given.environment


def _with_tools(cfg, given: TrainerInputs | None) -> bool | None:
    if cfg.tools:
        return True
    return None if given is None else given.tools


def _with_teacher(cfg, given: TrainerInputs | None) -> bool | None:
    if cfg.teacher_model_path:
        return True
    return None if given is None else given.teacher


def _vllm_with_lora(cfg, given: TrainerInputs | None) -> bool | None:
    if cfg.rollout_engine not in ("vllm", "vllm_server"):
        return False
    return None if given is None else given.lora


HF_ENGINE = _engine("hf")
COLOCATED_VLLM = _engine("vllm").because(lambda c: "with rollout_engine='vllm_server' the server is sized where "
                                          "it starts (`verl-hf vllm-serve --help`)" if c.rollout_engine == "vllm_server"
                                          else "")
VLLM_SERVER = _engine("vllm_server")
REWARD_MODELS = Applies("reward_model_path is set", lambda c, g: bool(c.reward_model_path), ("reward_model_path",))
COST_MODEL = Applies("cost_model_path is set", lambda c, g: bool(c.cost_model_path), ("cost_model_path",))
SAFE_RL = Applies("cost_funcs or cost_model_path is set (Safe-RLHF)", lambda c, g: c.safe_rl,
                  ("cost_funcs", "cost_model_path"))
OVERLONG = Applies("overlong_buffer_len > 0", lambda c, g: c.overlong_buffer_len > 0, ("overlong_buffer_len",))
DYNAMIC_SAMPLING = Applies("dynamic_sampling=True", lambda c, g: c.dynamic_sampling, ("dynamic_sampling",))
KL_ON = Applies("kl_coef > 0 (e.g. 0.01)", lambda c, g: c.kl_coef > 0, ("kl_coef",))
KL_CONTROLLED = Applies("kl_controller='adaptive' or 'pid'", lambda c, g: c.kl_controller in ("adaptive", "pid"),
                        ("kl_controller",))
KL_ADAPTIVE = Applies("kl_controller='adaptive'", lambda c, g: c.kl_controller == "adaptive", ("kl_controller",))
KL_PID = Applies("kl_controller='pid'", lambda c, g: c.kl_controller == "pid", ("kl_controller",))
ROLLOUT_IS = Applies("rollout_is='token' or 'sequence'", lambda c, g: c.rollout_is is not None, ("rollout_is",))
ROLLOUT_IS_MASK = Applies("rollout_is is set with rollout_is_mode='mask'",
                          lambda c, g: c.rollout_is is not None and c.rollout_is_mode == "mask",
                          ("rollout_is", "rollout_is_mode"))
CRITIC = Applies("adv_estimator='gae' (PPO, which trains a critic)",
                 lambda c, g: advantage_spec(c.adv_estimator).needs_values, ("adv_estimator",))
USES_LAM = Applies("adv_estimator is one that takes lam (gae)",
                   lambda c, g: "lam" in inspect.signature(advantage_spec(c.adv_estimator).fn).parameters,
                   ("adv_estimator",))
EVAL_SAMPLING = Applies("eval_do_sample=True", lambda c, g: c.eval_do_sample, ("eval_do_sample",)).because(
    "greedy evaluation would repeat one answer")
UNSHARDED = Applies("the run is one process or DDP (not DeepSpeed or FSDP)", lambda c, g: not c.training_is_sharded)
MULTI_TURN = Applies("rollouts are multi-turn: tools=[...] or environment=... given to VerlTrainer (or tools in "
                     "the config)", _multi_turn, ("tools",))
TEACHER = Applies("a teacher is given: teacher_model_path, or teacher= on VerlTrainer (on-policy distillation)",
                  _with_teacher, ("teacher_model_path",))
VLLM_WITH_LORA = Applies("rollout_engine='vllm' or 'vllm_server' samples for a LoRA policy (peft_config=... on "
                         "VerlTrainer, or a PeftModel)", _vllm_with_lora, ("rollout_engine",))
VISION = Applies("the policy is a vision-language model and processing_class its processor (AutoProcessor)",
                 lambda c, g: None if g is None else g.vision)
WITH_TOOLS = Applies("tools are given: tools=[...] on VerlTrainer or tools in the config", _with_tools,
                     ("tools",)).because("an environment= enforces its own limits")


@functools.cache
def conditional_fields(config_class: type) -> dict[str, Applies]:
    """Field name -> its condition, for every field of `config_class` declared with one."""
    hints = typing.get_type_hints(config_class, include_extras=True)
    return {name: arg for name, hint in hints.items() if typing.get_origin(hint) is typing.Annotated
            for arg in hint.__metadata__ if isinstance(arg, Applies)}


def refuse_fields_that_cannot_apply(cfg, given: TrainerInputs | None = None) -> None:
    """Every conditional field set away from its default takes effect in this setup, or the run stops here."""
    conditions = conditional_fields(type(cfg))
    for name, value, default in fields_set_away(cfg, conditions):
        applies = conditions[name]
        if applies.holds(cfg, given) is False:
            here = ", ".join(f"{f}={getattr(cfg, f)!r}" for f in applies.shows)
            here = f" (here {here})" if here else ""
            why = applies.why(cfg)
            why = f" Why: {why}." if why else ""
            raise ValueError(f"{name}={value!r} takes effect only when {applies.when}, which this setup does not "
                             f"have{here}: set that, or leave {name} at its default ({default!r}).{why}")


def fields_set_away(cfg, names) -> list[tuple[str, object, object]]:
    """(name, value, default) of each field among `names` whose value is not its default."""
    out = []
    for f in dataclasses.fields(cfg):
        if f.name in names:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if getattr(cfg, f.name) != default:
                out.append((f.name, getattr(cfg, f.name), default))
    return out


def one_of(name: str, value: str, valid) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r} is unknown; valid: {', '.join(sorted(valid))}.")


def raise_first_failed(cfg, checks: list[tuple[str, bool, str]]) -> None:
    """checks: (field name, holds, what the value must be); the first that does not hold raises."""
    for name, ok, fix in checks:
        if not ok:
            raise ValueError(f"{name}={getattr(cfg, name)!r} {fix}.")


JSON_EXAMPLES = {"data_key_map": '{"prompt": "question"}', "chat_template_kwargs": '{"enable_thinking": false}'}


def parse_json_dict(name: str, text: str) -> dict:
    example = JSON_EXAMPLES.get(name, '{"key": "value"}')
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{name}={text!r} is not valid JSON ({err}); write it as '{example}'.") from err
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object such as '{example}', got {text!r}.")
    return value
