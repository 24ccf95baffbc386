"""Construction helpers of `VerlTrainer`: turning what users pass into roles, config and rewards.

Everything here runs before training and fails fast with the fix in the message.

See it work: tests/test_errors.py.
"""

from __future__ import annotations

import logging
import os
from dataclasses import fields

import torch
from transformers import AutoTokenizer, PreTrainedModel, TrainingArguments

from .algorithms import advantage_spec
from .config import TrainerInputs, VerlConfig, refuse_fields_that_cannot_apply
from .distributed import is_zero3
from .rewards import resolve_reward_funcs
from .rewards.combine import check_reward_weights
from .roles import Critic, ReferencePolicy, RewardModel
from .vision.setup import freeze_vision_tower, has_vision, model_class_for

logger = logging.getLogger(__name__)


# The private Trainer methods VerlTrainer overrides or calls, with the parameters it passes: a transformers
# release that renames one would otherwise skip our override silently (e.g. no NaN check before optimizer steps).
TRAINER_HOOKS = {
    "_prepare_for_training": ("max_steps", "train_dataloader", "resume_from_checkpoint"),
    "_get_grad_norm": ("model", "grad_norm"),
    "_save": ("output_dir", "state_dict"),
    "_save_checkpoint": ("model", "trial"),
    "_get_output_dir": ("trial",),
    "_save_optimizer_and_scheduler": ("output_dir",),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_load_from_checkpoint": ("resume_from_checkpoint", "model"),
    "_push_from_checkpoint": ("checkpoint_folder",),
}


def check_trainer_hooks(trainer_class=None) -> None:
    """Every private Trainer hook VerlTrainer relies on exists with the parameters it passes."""
    import inspect

    import transformers

    trainer_class = trainer_class or transformers.Trainer
    for name, expected in TRAINER_HOOKS.items():
        method = getattr(trainer_class, name, None)
        params = list(inspect.signature(method).parameters)[1:] if callable(method) else None
        if params is None or tuple(params[:len(expected)]) != expected:
            found = "is gone" if params is None else f"takes {tuple(params)}"
            raise RuntimeError(f"transformers {transformers.__version__}: Trainer.{name} {found}, but VerlTrainer "
                               f"overrides or calls it with {expected}; install the transformers range verl_hf "
                               f"supports (setup.cfg: transformers>=5.3,<5.21).")


def given_policy(model, actor):
    """The policy, given as `model=` or under the seed posts' name `actor=`: an id or path, or a model."""
    model = one_of_aliases("model", model, "actor", actor)
    if model is None:
        raise ValueError("VerlTrainer needs a policy: model='<id or path>' or a PreTrainedModel (or actor=...).")
    if not isinstance(model, (str, os.PathLike, torch.nn.Module)):
        raise TypeError(f"model must be an id, a path or a PreTrainedModel, got {type(model).__name__} {model!r}.")
    return str(model) if isinstance(model, os.PathLike) else model


def one_of_aliases(name, value, alias, alias_value):
    if value is not None and alias_value is not None:
        raise ValueError(f"pass either {name}= or {alias}= (they are the same thing), not both.")
    return value if value is not None else alias_value


def as_verl_config(args, model) -> VerlConfig:
    if args is None:
        name = policy_path(model) or "model"
        return VerlConfig(output_dir=f"{name.rstrip('/').split('/')[-1]}-verl")
    if isinstance(args, VerlConfig):
        return args
    if isinstance(args, TrainingArguments):
        logger.warning("VerlTrainer got TrainingArguments: converting to VerlConfig with the RL fields at their defaults.")
        values = {f.name: getattr(args, f.name) for f in fields(TrainingArguments) if f.init}
        return VerlConfig(**values)
    raise TypeError(f"args must be a VerlConfig (or TrainingArguments), got {type(args).__name__}.")


def resolve_rewards(args: VerlConfig, reward_funcs, reward_model, environment=None, teacher=None):
    """(reward functions as (name, fn), their weights). An `environment=` run without any is rewarded by its
    environment's per-turn rewards alone: it gets `environment_return`, weight 0, as its metric; a distillation
    run without any (a teacher is given) learns from the teacher alone: `no_task_reward`, weight 0. The weights
    are counted before any reward model loads."""
    given = [*(args.reward_funcs or []), *(reward_funcs if isinstance(reward_funcs, (list, tuple))
                                          else [reward_funcs] if reward_funcs is not None else [])]
    models = ([reward_model] if reward_model is not None else []) + list(args.reward_model_path or [])
    if not given and not models and environment is not None:
        if args.reward_weights is not None:
            raise ValueError(f"reward_weights={args.reward_weights} weighs no reward function: with environment= "
                             f"alone its turn rewards are the reward (environment_return, weight 0, reports "
                             f"them). Drop reward_weights, or give reward_funcs to weigh.")
        from .agent import environment_return

        return resolve_reward_funcs([environment_return]), [0.0]
    if not given and not models and (teacher is not None or args.teacher_model_path):
        if args.reward_weights is not None:
            raise ValueError(f"reward_weights={args.reward_weights} weighs no reward function: a distillation run "
                             f"without reward_funcs learns from the teacher alone. Drop reward_weights, or give "
                             f"reward_funcs to weigh.")
        from .rewards.functions import no_task_reward

        return resolve_reward_funcs([no_task_reward]), [0.0]
    if not given and not models:
        raise ValueError("no reward: pass reward_funcs=[...] (callables or names such as 'gsm8k') or reward_model= "
                         "(or environment= whose step() returns rewards, or a teacher to distill from).")
    check_reward_weights(args.reward_weights, [s if isinstance(s, str) else getattr(s, "__name__", type(s).__name__)
                                               for s in given] + ["reward_model"] * len(models))
    check_offline_ids({f"reward_model_path[{i}]": p for i, p in enumerate(args.reward_model_path or [])})
    if args.gkd_lambda < 1.0 and any(w != 0 for w in args.reward_weights or [1.0]):
        raise ValueError(f"gkd_lambda={args.gkd_lambda} trains some rounds on the dataset's answers, where a task "
                         f"reward's policy gradient would credit answers the student did not sample: weigh every "
                         f"reward 0 (reward_weights={[0.0] * (len(given) + len(models))}; they are still logged) "
                         f"or set gkd_lambda=1.")
    if reward_model is not None:
        given.append(as_reward_model(reward_model))
    given += [load_score_model(path, args.reward_model_label_index) for path in args.reward_model_path or []]
    funcs = resolve_reward_funcs(given)
    return funcs, list(args.reward_weights or [1.0] * len(funcs))


def refuse_settings_without_effect(args: VerlConfig, tools, environment, teacher, lora=None,
                                   vision: bool = False) -> None:
    """The settings that take effect only with what VerlTrainer was given (tools=, environment=, teacher=, a
    LoRA policy's config `lora`, a vision-language policy's processor) are refused without it, before any
    model loads."""
    given = TrainerInputs(tools=bool(_tool_specs(args, tools)), environment=environment is not None,
                          teacher=teacher is not None, lora=lora is not None, vision=vision)
    refuse_fields_that_cannot_apply(args, given)
    if advantage_spec(args.adv_estimator).needs_turn_rewards and environment is None:
        raise ValueError(f"adv_estimator={args.adv_estimator!r} credits each turn with the environment's per-turn "
                         "rewards, which only an environment= gives (its step() returns Step(reward=...)); tools= "
                         "alone give none. Pass an environment= that rewards turns, or use adv_estimator='grpo'.")


def _tool_specs(args: VerlConfig, tools) -> list:
    return [*(args.tools or []), *([tools] if callable(tools) or isinstance(tools, str) else (tools or []))]


def is_multi_turn(args: VerlConfig, tools, environment) -> bool:
    """True when the run plays conversations: `tools=` (or `args.tools`) or `environment=` are given."""
    return bool(_tool_specs(args, tools)) or environment is not None


def make_multi_turn(args: VerlConfig, tools, environment, tokenizer, processor=None):
    """The MultiTurnRollout for `tools=` (and `args.tools`) or `environment=`, or None for single-turn
    rollouts (`processor`: a vision-language run's, so that environments may answer with images). Everything
    is checked here, before any model loads: the tools' schemas, the factory, the chat template (tool support,
    extendable turn by turn)."""
    specs = _tool_specs(args, tools)
    if not is_multi_turn(args, tools, environment):
        return None
    from .agent import MultiTurnRollout, as_tools, check_extendable, environment_factory, tool_call_parser
    from .agent.parsers import check_parser_fits_template

    if specs and environment is not None:
        raise ValueError("give tools= (or the config's tools) or environment=, not both: an environment that uses "
                         "tools calls them itself.")
    if args.routing_replay:
        raise ValueError("routing_replay does not support multi-turn rollouts yet (the environment's tokens have no "
                         "recorded routes); drop one of them.")
    if args.max_staleness:
        raise ValueError(f"max_staleness={args.max_staleness} cannot run with multi-turn rollouts (tools= or "
                         f"environment=): they are not produced ahead yet. Set max_staleness=0 for this setup.")
    tool_map = as_tools(specs)
    schemas = [t.schema for t in tool_map.values()] or None
    tool_call_parser(args.tool_call_parser)
    if schemas:
        check_parser_fits_template(args.tool_call_parser, getattr(tokenizer, "chat_template", None))
    check_extendable(tokenizer, schemas)
    make_env = environment_factory(environment, tool_map, args.tool_call_parser, args.max_tool_calls,
                                   args.tool_timeout_s)
    return MultiTurnRollout(make_env, processor or tokenizer, schemas, args.max_turns, args.max_response_length,
                            args.env_timeout_s, turn_length=args.max_turn_length,
                            max_prompt_tokens=args.max_prompt_length)


def make_safety(placement, policy, args: VerlConfig):
    """Safe-RLHF's constraint when costs are configured (else None): cost functions and cost model resolved now,
    the cost critic (estimators with values, PPO) built like the reward critic, the cost model placed like
    reward models."""
    if not args.safe_rl:
        return None
    from .safety import SafetyConstraint, SafetySettings

    specs = list(args.cost_funcs or [])
    if args.cost_model_path:
        model = load_score_model(args.cost_model_path, args.cost_model_label_index)
        model.__name__ = "cost_model"
        specs.append(model)
    cost_funcs = resolve_reward_funcs(specs)
    place_reward_models(placement, cost_funcs)
    cost_critic = make_critic(cost_critic_start(args), policy, args, placement) \
        if advantage_spec(args.adv_estimator).needs_values else None
    return SafetyConstraint(cost_funcs, SafetySettings.of(args), cost_critic)


def reward_critic_start(critic, args: VerlConfig):
    """Where the (reward) critic starts: `critic=` (a Critic, a model or a path), else critic_model_path, else
    None (the policy's checkpoint)."""
    if critic is not None and args.critic_model_path:
        raise ValueError(f"critic= and critic_model_path={args.critic_model_path!r} both say where the critic starts; "
                         f"give one.")
    return critic if critic is not None else args.critic_model_path


def cost_critic_start(args: VerlConfig) -> str | None:
    """Where the cost critic starts: the cost model itself when it has one output (as Safe-RLHF does: it already
    judges costs), else the policy's checkpoint (None)."""
    from transformers import AutoConfig

    if args.cost_model_path and getattr(AutoConfig.from_pretrained(args.cost_model_path), "num_labels", 1) == 1:
        return args.cost_model_path
    return None


def load_score_model(path: str, label_index: int | None) -> RewardModel:
    """A reward or cost model; the configured label index applies to the models with several labels (a run
    may mix one-label and two-label models)."""
    from transformers import AutoConfig

    several = getattr(AutoConfig.from_pretrained(path), "num_labels", 1) > 1
    return RewardModel.from_pretrained(path, label_index=label_index if several else None)


def as_reward_model(reward_model) -> RewardModel:
    if isinstance(reward_model, RewardModel):
        return reward_model
    if isinstance(reward_model, str):
        return RewardModel.from_pretrained(reward_model)
    path = getattr(reward_model.config, "_name_or_path", None)
    if not path:
        raise ValueError("reward_model has no path to load its tokenizer from; pass "
                         "reward_model=RewardModel(model, tokenizer=...).")
    return RewardModel(reward_model, tokenizer=AutoTokenizer.from_pretrained(path))


def check_model_paths(model, args: VerlConfig, ref_policy=None, critic=None, teacher=None) -> None:
    """Every model given as a local path exists, said before anything loads (transformers would read a missing
    folder as a Hub id and answer about repo-id syntax). A Hub id `org/name` is left to transformers."""
    for name, value in given_models(model, args, ref_policy, critic, teacher).items():
        if isinstance(value, (str, os.PathLike)) and _looks_local(str(value)) and not os.path.exists(value):
            hint = " (~ is not expanded here: give the full path)" if str(value).startswith("~") else ""
            raise FileNotFoundError(f"{name}={str(value)!r}: no such file or directory{hint} (a local path; a Hub "
                                    f"model is named 'org/name').")


def given_models(model, args: VerlConfig, ref_policy=None, critic=None, teacher=None) -> dict:
    """Every model of the run by the name it was given under: an id, a path, or a loaded model."""
    return {"model": model, "ref_policy": ref_policy, "critic": critic, "critic_model_path": args.critic_model_path,
            "cost_model_path": args.cost_model_path, "teacher": teacher, "teacher_model_path": args.teacher_model_path,
            **{f"reward_model_path[{i}]": p for i, p in enumerate(args.reward_model_path or [])}}


def check_offline_ids(named: dict) -> None:
    """A Hub id that cannot load offline, in one line before transformers tries (its error is a long chained
    traceback). Called after the cheap checks, before the first model or tokenizer is read."""
    for name, value in named.items():
        if isinstance(value, str) and not os.path.exists(value) and _offline_and_not_cached(value):
            raise FileNotFoundError(f"{name}={value!r} is a Hub id, and HF_HUB_OFFLINE is set while it is not in the "
                                    f"local Hub cache: download it where the Hub is reachable (`hf download "
                                    f"{value}`), or give a local path.")


def _offline_and_not_cached(repo_id: str) -> bool:
    """Offline (HF_HUB_OFFLINE) with no config.json of `repo_id` in the local Hub cache: from_pretrained would fail
    after a long chained traceback."""
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.HF_HUB_OFFLINE:
        return False
    try:
        return not isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id either: transformers says so itself
        return False


def _looks_local(value: str) -> bool:
    return value.startswith(("/", ".", "~")) or value.count("/") > 1 or os.sep != "/" and os.sep in value


def check_vocabulary(tokenizer, model, train_dataset=None) -> None:
    """Every token id the run feeds the model has an embedding row (else the first step fails with IndexError):
    the pad, EOS and BOS ids, and the prompts' ids. A tokenizer larger than the embedding is fine as long as
    the extra ids never occur (some ship an unused added token)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is None or len(tokenizer) <= rows:
        return
    used = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("pad", "eos", "bos")}
    if train_dataset is not None and "prompt_ids" in train_dataset.column_names:
        used["largest prompt"] = max((max(ids) for ids in train_dataset["prompt_ids"] if ids), default=None)
    beyond = {name: i for name, i in used.items() if i is not None and i >= rows}
    if beyond:
        raise ValueError(f"token ids {beyond} are beyond the model's embedding ({rows} rows; the tokenizer has "
                         f"{len(tokenizer)} tokens): they have no embedding. Use the model's own tokenizer, or "
                         f"model.resize_token_embeddings(len(tokenizer)) before training.")


def load_tokenizer(tokenizer, model, args: VerlConfig):
    """The tokenizer given, or the model's; with `args.chat_template` / `chat_template_kwargs` put on it."""
    from .agent.templates import put_chat_template

    if tokenizer is None:
        path = policy_path(model)
        if not path:
            raise ValueError("pass processing_class=<tokenizer>: the model has no path to load one from.")
        tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token.")
        logger.warning(f"the tokenizer has no pad token; using its EOS token {tokenizer.eos_token!r} for padding.")
        tokenizer.pad_token = tokenizer.eos_token
    put_chat_template(tokenizer, args.chat_template, args.chat_template_kwargs)
    return tokenizer


def load_policy(model, peft_config, args: VerlConfig, vision: bool = False):
    """The policy from an id/path or as passed, PEFT-wrapped if asked. Loaded from a path under bf16/fp16 mixed
    precision it gets fp32 master weights (transformers would keep a bf16 checkpoint's dtype, and AdamW steps on
    bf16 weights round small updates away), and eager attention where it is faster
    (rollout.factory.preferred_attention). `vision`: the run has images (a vision-language model's class, its
    vision tower frozen with freeze_vision_tower)."""
    if isinstance(model, str):
        from transformers import AutoConfig

        from .rollout.factory import preferred_attention

        kwargs, config = {}, AutoConfig.from_pretrained(model)
        attention = preferred_attention(args, config, training=True)
        if attention:
            kwargs["attn_implementation"] = attention
        if args.bf16 or args.fp16:
            kwargs["dtype"] = torch.float32
        model = load_checkpoint(model_class_for(config, vision), model, "model", **kwargs)
    if not isinstance(model, (PreTrainedModel, torch.nn.Module)):
        raise TypeError(f"model must be an id, a path or a PreTrainedModel, got {type(model).__name__}.")
    freeze = vision and args.freeze_vision_tower
    if freeze:
        freeze_vision_tower(model)
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
        if freeze:  # LoRA targets such as "all-linear" add adapters inside the tower too
            freeze_vision_tower(model)
    return model


def make_reference(placement, actor_model, ref_policy, args) -> ReferencePolicy:
    """The KL reference from whatever the user passed (a ReferencePolicy, a model, an id or path, or None: the
    starting policy), placed like the actor. Where no process holds the whole actor (ZeRO-3, FSDP2) our own
    reference is the starting policy loaded again and sharded (under FSDP2 also one given beside a LoRA actor);
    elsewhere, and for a LoRA actor without one, `ReferencePolicy.from_actor` (a frozen copy, or the base with
    the adapter disabled)."""
    if isinstance(ref_policy, ReferencePolicy):
        return ref_policy
    peft = hasattr(actor_model, "disable_adapter")
    sharded = placement.kind == "fsdp2" and (not peft or ref_policy is not None) or (
        placement.kind == "zero3" and not peft)
    if ref_policy is None and not sharded:
        return ReferencePolicy.from_actor(actor_model, args.temperature, args.logits_chunk_size)
    model = _reference_model(placement, actor_model, ref_policy, sharded)
    model, engine = placement.place_frozen(model) if sharded else (model.to(placement.device), None)
    role = ReferencePolicy(model, temperature=args.temperature, logits_chunk_size=args.logits_chunk_size)
    role.engine = engine  # under ZeRO-3: keeps DeepSpeed's hooks and buffers alive
    return role


def _reference_model(placement, actor_model, ref_policy, sharded: bool):
    """The reference's weights before placement: `ref_policy` loaded or as given; for a sharded run without one,
    the starting policy reloaded from its path (FSDP2: in the checkpoint's own dtype, frozen weights need no
    fp32 master copy; FSDP2's mixed precision computes in bf16)."""
    path = ref_policy if isinstance(ref_policy, str) else None
    if ref_policy is None:
        path = policy_path(actor_model)
        if path is None:
            raise ValueError(f"under {'ZeRO-3' if placement.kind == 'zero3' else 'FSDP2'} the KL reference is "
                             f"loaded from a path: pass ref_policy='<id or path>' (the policy has no path to reload "
                             f"its starting weights from).")
    if path is not None:
        from transformers import AutoConfig

        # a vision-language model the causal-LM class does not know loads as what it is (vision runs are unsharded)
        return load_checkpoint(model_class_for(AutoConfig.from_pretrained(path), vision=False), path, "ref_policy",
                               **({"dtype": "auto"} if placement.kind == "fsdp2" else {}))
    if sharded and placement.kind == "zero3" and not is_zero3(ref_policy):
        raise ValueError("under ZeRO-3 the KL reference is loaded from a path: pass ref_policy='<id or path>' "
                         "(a model given whole would be held whole by every process).")
    return ref_policy


def load_checkpoint(model_class, path: str, name: str, **kwargs):
    """`model_class.from_pretrained(path)`, with a weights file that cannot be read (truncated by a copy or
    download that stopped) said with the file and the fix instead of the deserialiser's own words."""
    try:
        return model_class.from_pretrained(path, **kwargs)
    except Exception as e:  # safetensors raises its own SafetensorError (or OSError on some versions)
        if "deserializ" not in str(e).lower() and type(e).__name__ != "SafetensorError":
            raise
        raise ValueError(f"{name}={path!r}: its weights file cannot be read ({type(e).__name__}: {e}); it is "
                         f"truncated or damaged. Copy or download the checkpoint again.") from e


def policy_path(model) -> str | None:
    """Where a policy came from (id or path), for loading companions such as the critic or the tokenizer."""
    if isinstance(model, str):
        return model
    base = getattr(model, "get_base_model", lambda: model)()
    return getattr(getattr(base, "config", None), "_name_or_path", None) or None


def make_critic(critic, policy, args: VerlConfig, placement=None) -> Critic | None:
    """The PPO critic: given (role, model or path), or a value head on the policy's own checkpoint, placed by
    `placement` (Placement.place_critic; None: on args.device)."""
    if not advantage_spec(args.adv_estimator).needs_values:
        if critic is not None:
            raise ValueError(f"critic= is given but adv_estimator={args.adv_estimator!r} uses no values; set "
                             f"adv_estimator='gae' (PPO) or drop the critic.")
        return None
    if isinstance(critic, Critic):
        role = critic
    elif critic is None or isinstance(critic, str):
        path = critic or policy_path(policy)
        if not path:
            raise ValueError("PPO needs a critic: pass critic='<id or path>' (the policy has no path to start from).")
        role = Critic.from_pretrained(path)
    else:
        role = Critic(critic)
    role.learning_rate, role.max_grad_norm = args.critic_learning_rate, args.max_grad_norm
    if placement is None:
        role.model.to(args.device)
        return role
    return placement.place_critic(role)


def make_kl_ctrl(args: VerlConfig):
    """The KL coefficient controller that VerlConfig names (its value starts at kl_coef)."""
    from .algorithms import make_kl_controller

    if args.kl_controller == "fixed":
        return make_kl_controller("fixed", kl_coef=args.kl_coef)
    if args.kl_controller == "adaptive":
        return make_kl_controller("adaptive", init_kl_coef=args.kl_coef, target_kl=args.kl_target,
                                  horizon=args.kl_horizon)
    kp, ki, kd = args.kl_pid_gains
    return make_kl_controller("pid", init_kl_coef=args.kl_coef, target_kl=args.kl_target, kp=kp, ki=ki, kd=kd)



def check_fsdp_plugin(plugin, args: VerlConfig) -> None:
    """What the Trainer checks once FSDP is on, for the FSDP that VerlTrainer turned on itself (CPU machines)."""
    if plugin.activation_checkpointing and args.gradient_checkpointing:
        raise ValueError("gradient_checkpointing=True together with the FSDP config's activation checkpointing would "
                         "checkpoint every layer twice; keep one (fsdp_activation_checkpointing under FSDP).")
    if args.save_only_model and "SHARDED" in str(plugin.state_dict_type):
        raise ValueError("save_only_model with fsdp_state_dict_type SHARDED_STATE_DICT writes checkpoints without "
                         "the model's shards (they could not be resumed); use FULL_STATE_DICT or drop save_only_model.")


def place_reward_models(placement, reward_funcs) -> None:
    """Reward models live where the actor lives (Placement.place_frozen)."""
    for _, func in reward_funcs:
        if isinstance(func, RewardModel):
            func.model, engine = placement.place_frozen(func.model)
            if engine is not None:
                func.engine = engine
