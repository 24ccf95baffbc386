"""TRL's `GRPOConfig` names (TRL 1.16) in `VerlConfig`: a TRL user's config carries over.

Each TRL name is one of three kinds, read at every door a config comes through (Python keyword arguments, YAML,
`verl-hf train` flags) by `translate_trl_names`, before anything else looks at the values:
- the same name with the same meaning in both (`num_generations`, `temperature`, `reward_weights`, ...): nothing
  to do, so not listed here;
- `RENAMED`: TRL's name for one of our fields, with TRL's meaning: the value goes to ours (converted where TRL's
  spelling differs, e.g. `vllm_enable_sleep_mode=True` is vLLM's sleep level 2, TRL's);
- `REFUSED`: a TRL setting we have no field for with its meaning; it is refused with why, and what to use.
Setting a TRL name and ours for the same thing is an error naming both. The tables are checked against TRL's own
dataclass where `trl` is installed (tests/test_trl_names.py), so a new TRL field is noticed.

See it work: tests/test_trl_names.py.
"""

from __future__ import annotations

from typing import Callable

TRL_VERSION = "1.16"

# TRL name -> (our field, TRL's value -> ours)
RENAMED: dict[str, tuple[str, Callable]] = {
    "max_completion_length": ("max_response_length", int),
    "beta": ("kl_coef", float),  # TRL: the k3 KL in the loss; ours the same by default (kl_kind, use_kl_in_reward)
    "num_iterations": ("ppo_epochs", int),
    "epsilon_high": ("clip_ratio_high", float),
    "num_generations_eval": ("eval_num_generations", int),
    "vllm_server_base_url": ("vllm_server_url", str),
    "vllm_tensor_parallel_size": ("rollout_tensor_parallel_size", int),
    "vllm_max_model_length": ("vllm_max_model_len", int),
    "vllm_enable_sleep_mode": ("vllm_sleep_level", lambda on: 2 if on else 0),  # TRL sleeps at vLLM's level 2
    # TRL caps the ratio at delta on both signs: with delta > 1 + epsilon_high that is our dual-clip at c = delta
    "delta": ("clip_ratio_c", float),
}

# TRL name -> why it is refused and what to use instead
REFUSED: dict[str, str] = {
    "model_init_kwargs": "the model is loaded before the config (VerlTrainer(model=...) or the CLI's model_name_or_path "
                         "and torch_dtype); pass a loaded model to set loading options",
    "trust_remote_code": "models are loaded by the script or the CLI, not from the config; load it with "
                         "trust_remote_code yourself and pass the model",
    "router_aux_loss_coef": "the MoE router's auxiliary loss is never added here (TRL's None takes the model "
                            "config's coefficient, on for MoE models); MoE runs use routing replay "
                            "(routing_replay=True) instead; 0.0 is accepted",
    "disable_dropout": "dropout is always off in the policy's forwards (log-probs must be deterministic); nothing to set",
    "cast_lm_head_to_fp32": "the LM head multiplies in the model's dtype and the log-softmax runs in fp32 (as TRL "
                            "without the cast); casting the head's weights to fp32 is not implemented",
    "ds3_gather_for_generation": "the HF engine under ZeRO-3 always generates with gathered weights; for large models "
                                 "use rollout_engine='vllm'",
    "shuffle_dataset": "the train set is always shuffled (seeded by `seed`), as TRL's default",
    "pad_to_multiple_of": "micro-batches are cut to their own lengths already; nothing to set",
    "min_p": "not supported by the rollout engines' shared sampling settings (temperature, top_p, top_k)",
    "generation_kwargs": "sampling is set by temperature, top_p and top_k, the same for every engine; other "
                         "generation arguments would apply to one engine only",
    "repetition_penalty": "a penalty makes sampling differ from the policy the loss assumes; not supported",
    "cache_implementation": "the HF engine's cache is chosen by transformers; for speed use rollout_engine='vllm'",
    "vllm_model_impl": "vLLM's own model implementation is always used",
    "vllm_structured_outputs_regex": "structured outputs would sample from another distribution than the policy's",
    "vllm_server_timeout": "ours is per request, not a wait for the server to start: set vllm_server_timeout_s",
    "vllm_group_port": "the weight-transfer port is chosen free at each connection; nothing to set",

    "sapo_temperature_neg": "set policy_loss='sapo' and policy_loss_kwargs={'tau_neg': ...} (SAPO's temperatures)",
    "sapo_temperature_pos": "set policy_loss='sapo' and policy_loss_kwargs={'tau_pos': ...} (SAPO's temperatures)",
    "vespo_k_pos": "the VESPO loss is not implemented",
    "vespo_lambda_pos": "the VESPO loss is not implemented",
    "vespo_k_neg": "the VESPO loss is not implemented",
    "vespo_lambda_neg": "the VESPO loss is not implemented",
    "importance_sampling_level": "sequence-level ratios are GSPO's loss: set policy_loss='gspo'",
    "multi_objective_aggregation": "rewards are summed with reward_weights before the advantage, TRL's "
                                   "'sum_then_normalize'; the other order is not implemented",
    "scale_rewards": "set norm_adv_by_std_in_grpo (True: TRL's 'group', False: 'none'); 'batch' is not implemented",
    "loss_type": "set loss_agg_mode ('token-mean' is TRL's 'dapo' and 'bnpo', 'seq-mean-token-mean' its 'grpo', "
                 "'seq-mean-token-sum-norm' its 'dr_grpo') and policy_loss ('cispo', 'sapo' are ours too; our "
                 "PPO clip adds a dual-clip at clip_ratio_c=3.0, TRL's delta)",
    "mask_truncated_completions": "truncated responses are scored like others; DAPO's overlong_buffer_len shapes them",
    "sync_ref_model": "the reference policy stays fixed; not implemented",
    "ref_model_mixup_alpha": "the reference policy stays fixed; not implemented",
    "ref_model_sync_steps": "the reference policy stays fixed; not implemented",
    "top_entropy_quantile": "training on the highest-entropy tokens only is not implemented",
    "use_adaptive_entropy": "the entropy coefficient is fixed (entropy_coef)",
    "entropy_coef_min": "the entropy coefficient is fixed (entropy_coef)",
    "entropy_coef_max": "the entropy coefficient is fixed (entropy_coef)",
    "entropy_coef_delta": "the entropy coefficient is fixed (entropy_coef)",
    "entropy_target": "the entropy coefficient is fixed (entropy_coef)",
    "max_tool_calling_iterations": "set max_turns (turns per conversation) and max_tool_calls",
    "vllm_importance_sampling_correction": "set rollout_is='token' or 'sequence' (off by default here)",
    "vllm_importance_sampling_mode": "set rollout_is and rollout_is_mode",
    "vllm_importance_sampling_clip_max": "set rollout_is_threshold",
    "vllm_importance_sampling_clip_min": "set rollout_is_threshold_low",
    "vllm_importance_sampling_cap": "set rollout_is_threshold",
    "off_policy_mask_threshold": "masking negative-advantage sequences by their KL to the sampler is not implemented "
                                 "(rollout_is_mode='mask' masks by the importance ratio, whatever the advantage's "
                                 "sign)",
    "use_bias_correction_kl": "the KL in the loss is k3 without TRL's correction by the importance ratio (verl's); "
                              "False is accepted",
    "log_completions": "add callbacks.CompletionSamplesCallback (rows of every logging step, to files and trackers)",
    "log_multimodal": "CompletionSamplesCallback writes the prompt's text; images are not logged",
    "num_completions_to_print": "CompletionSamplesCallback(num_samples=N) writes N rows per logging step",
    "log_unique_prompts": "CompletionSamplesCallback writes the round's first rows",
    "log_completions_hub_repo": "CompletionSamplesCallback writes to output_dir/completions; push that folder yourself",
    "use_transformers_continuous_batching": "the HF engine batches with generate; for throughput use "
                                            "rollout_engine='vllm'",
    "transformers_continuous_batching_config": "the HF engine batches with generate; for throughput use "
                                               "rollout_engine='vllm'",
    "use_transformers_paged": "the HF engine batches with generate; for throughput use rollout_engine='vllm'",
}
# Values of refused names that are what we always do: accepted (the same effect), e.g. shuffle_dataset=True.
ALWAYS: dict[str, tuple] = {
    "disable_dropout": (True,), "cast_lm_head_to_fp32": (False,), "ds3_gather_for_generation": (True,),
    "shuffle_dataset": (True,), "vllm_model_impl": ("vllm",), "multi_objective_aggregation": ("sum_then_normalize",),
    "mask_truncated_completions": (False,), "sync_ref_model": (False,), "top_entropy_quantile": (1.0,),
    "use_adaptive_entropy": (False,), "log_completions": (False,), "use_transformers_continuous_batching": (False,),
    "use_transformers_paged": (False,), "importance_sampling_level": ("token",), "min_p": (None, 0.0),
    "repetition_penalty": (1.0,), "vllm_importance_sampling_correction": (False,),
    "router_aux_loss_coef": (0.0,), "pad_to_multiple_of": (None, "auto"), "use_bias_correction_kl": (False,),
}
# Translated by the functions below, with others (use_vllm + vllm_mode, host + port, epsilon + epsilon_high).
TRANSLATED = ("use_vllm", "vllm_mode", "vllm_server_host", "vllm_server_port", "epsilon", "steps_per_generation")
# Names TRL and we share with the same meaning: nothing to translate (the coverage check reads this).
SHARED = ("learning_rate", "remove_unused_columns", "num_generations", "temperature", "top_p", "top_k",
          "chat_template_kwargs", "reward_weights", "vllm_gpu_memory_utilization")
# Names we share whose meaning differs in a case, said where the field is documented (README, Coming from TRL).
SAME_NAME_OTHER_MEANING = {
    "generation_batch_size": "completions per process here, for all processes together in TRL (equal in one process)",
    "entropy_coef": "the entropy bonus is aggregated by loss_agg_mode here, always as a token mean in TRL (equal "
                    "under loss_agg_mode='token-mean', the default)",
}
VLLM_MODES = ("colocate", "server")


def translate_trl_names(values: dict, where: str = "VerlConfig") -> dict:
    """`values` (field -> value) with TRL's names replaced by ours; ValueError for a refused name or for a TRL name
    beside ours for the same thing, naming both. `where` names the door (e.g. the YAML file) in the message."""
    out = dict(values)
    for name in [n for n in out if n in REFUSED]:
        if out[name] in ALWAYS.get(name, ()):
            out.pop(name)  # what we always do
            continue
        raise ValueError(f"{where}: {name}={out[name]!r} is TRL's GRPOConfig.{name}, which has no counterpart here: "
                         f"{REFUSED[name]}.")
    _translate_vllm(out, where)
    _translate_epsilon(out, where)
    _translate_steps_per_generation(out, where)
    for name in [n for n in out if n in RENAMED]:
        ours, convert = RENAMED[name]
        if out[name] is None:
            raise ValueError(f"{where}: {name}=None (TRL's GRPOConfig.{name}, our {ours}): give a value, or leave it "
                             f"out for our default.")
        _take(out, name, ours, convert(out[name]), where)
    return out


def _translate_steps_per_generation(values: dict, where: str) -> None:
    """TRL samples once per `steps_per_generation` micro-steps: our generation_batch_size (completions per process
    per round) is that many micro-batches."""
    if "steps_per_generation" not in values:
        return
    steps = values["steps_per_generation"]
    if steps is None:
        values.pop("steps_per_generation")  # TRL's default: one optimizer step per round, ours too
        return
    if "per_device_train_batch_size" not in values:  # it may come from elsewhere (a base file, a flag): not guessed
        raise ValueError(f"{where}: steps_per_generation={steps} (TRL's) needs per_device_train_batch_size beside it, "
                         f"or set ours: generation_batch_size = steps_per_generation x per_device_train_batch_size "
                         f"(completions per process per round).")
    per_device = values["per_device_train_batch_size"]
    _take(values, "steps_per_generation", "generation_batch_size", int(steps) * int(per_device), where)


def _take(values: dict, trl: str, ours: str, value, where: str) -> None:
    """Move TRL's `trl` to our `ours`; both given is an error naming both."""
    if ours in values:
        raise ValueError(f"{where}: {trl} (TRL's name) and {ours} (ours) set the same thing; keep one.")
    values.pop(trl)
    values[ours] = value


def _translate_epsilon(values: dict, where: str) -> None:
    """TRL's `epsilon` clips both sides unless `epsilon_high` is given (then it is the lower clip alone)."""
    if "epsilon" not in values:
        return
    epsilon = values["epsilon"]
    _take(values, "epsilon", "clip_ratio_low", epsilon, where)
    if "epsilon_high" not in values and "clip_ratio_high" not in values:
        values["clip_ratio_high"] = epsilon


def _translate_vllm(values: dict, where: str) -> None:
    """TRL's use_vllm + vllm_mode ('colocate' | 'server') is our rollout_engine ('vllm' | 'vllm_server'); its
    server host and port are our vllm_server_url."""
    host, port = values.pop("vllm_server_host", None), values.pop("vllm_server_port", None)
    if (host is not None or port is not None) and "vllm_server_base_url" not in values:
        values["vllm_server_base_url"] = f"http://{host or '0.0.0.0'}:{port or 8000}"
    if "use_vllm" not in values and "vllm_mode" not in values:
        return
    use, mode = values.pop("use_vllm", None), values.pop("vllm_mode", None) or "colocate"
    if mode not in VLLM_MODES:
        raise ValueError(f"{where}: vllm_mode={mode!r} must be one of {VLLM_MODES} (TRL's).")
    if not use:
        if mode != "colocate":  # TRL's default mode beside use_vllm=False is a config dump's: nothing asked
            raise ValueError(f"{where}: vllm_mode={mode!r} takes effect only with use_vllm=True.")
        engine = "hf"
    else:
        engine = "vllm" if mode == "colocate" else "vllm_server"
    if "rollout_engine" in values:
        raise ValueError(f"{where}: use_vllm/vllm_mode (TRL's names) and rollout_engine (ours) set the same thing; "
                         f"keep one.")
    values["rollout_engine"] = engine
