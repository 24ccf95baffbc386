"""Evaluation (responses per prompt, sampling, what counts as correct), the logged metrics' names, and what a saved
model holds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

from .applies import EVAL_SAMPLING, _help, raise_first_failed
from .machine import fsdp_version_wanted


@dataclass
class EvaluationFields:
    # ----- evaluation -----
    eval_num_generations: Annotated[int, EVAL_SAMPLING] = field(default=1, metadata=_help("Responses per eval prompt."))
    eval_do_sample: bool = field(default=False, metadata=_help("Sample at evaluation (default greedy)."))
    eval_correct_threshold: float = field(
        default=1.0,
        metadata=_help("eval accuracy = share of responses whose FIRST reward function scores at least this."),
    )

    # ----- logging -----
    trl_metric_names: bool = field(
        default=True,
        metadata=_help("Also log TRL's names for the metrics both report (reward, reward_std, rewards/<f>/mean, "
                       "completions/mean_length, entropy, clip_ratio/*, frac_reward_zero_std, ...; "
                       "verl_hf/metric_names.py), so dashboards made for TRL's GRPOTrainer read this run. False: ours "
                       "only."),
    )

    # ----- saving and publishing -----
    save_merged_model: bool = field(
        default=False,
        metadata=_help("PEFT runs: save_model / push_to_hub write the adapter merged into the base model (a plain "
                       "transformers model) instead of the adapter alone; checkpoints keep the adapter."),
    )


def check_evaluation(cfg) -> None:
    raise_first_failed(cfg, [
        ("eval_num_generations", cfg.eval_num_generations >= 1, "must be >= 1"),
        ("eval_correct_threshold", math.isfinite(cfg.eval_correct_threshold), "must be a finite number"),
    ])
    if cfg.save_merged_model and cfg.push_to_hub:
        raise ValueError("save_merged_model with push_to_hub=True: the Trainer would push checkpoint adapters "
                         "beside the merged weights. Set push_to_hub=False and publish with trainer.push_to_hub() "
                         "or PushToHubCallback (both write the merged model).")
    if cfg.save_merged_model and fsdp_version_wanted(cfg):
        raise ValueError("save_merged_model under FSDP2: the adapter's base weights are sharded; save the adapter "
                         "(save_merged_model=False) and merge it afterwards with peft's merge_and_unload().")
