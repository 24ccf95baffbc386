"""Evaluation of the policy: generate on held-out prompts (greedy unless `eval_do_sample`) and score them.

Reports `<prefix>_reward`, `<prefix>_reward/<function>`, `<prefix>_accuracy` (share of responses whose first
reward function scores at least `eval_correct_threshold`), `<prefix>_response_length`, and with Safe-RLHF
`<prefix>_cost` and `<prefix>_unsafe_rate`, and with a distillation teacher `<prefix>_distill_kl`.

See it work: tests/test_trainer_e2e.py.
"""

from __future__ import annotations

import torch

from .data import prepare_prompts, prompt_options, reasoning_given
from .metrics import accuracy_metric
from .sample_and_score import RewardStage, SamplingSettings, generate, sampling_kwargs, with_turn_rewards


def as_eval_prompts(dataset, tokenizer, args, prefix: str, multi_turn=None, images=None):
    """The eval split as prompt rows (templated and tokenized once; already prepared ones as they are)."""
    if "prompt_ids" in dataset.column_names:
        return dataset
    return prepare_prompts(dataset, tokenizer, args.data_key_map, args.max_prompt_length, prefix,
                           given_columns=reasoning_given(args), images=images, **prompt_options(multi_turn))


def evaluate_rewards(actor, rewards: RewardStage, constraint, dataset, args, prefix: str,
                     multi_turn=None, teacher=None) -> dict[str, float]:
    """Each process scores every world_size-th prompt; shards are padded to the same number of generate
    calls (ZeRO-3 and NCCL collectives need every rank in step) and the padding is dropped again. With
    `multi_turn` each prompt is a whole conversation, as in training: `<prefix>_reward` then counts the
    environment's per-turn rewards too (`<prefix>_turn_reward`), and the rollout's metrics are reported
    (`<prefix>_turns/mean`, `<prefix>_tool_calls/mean`, ...; the padding rows of uneven shards included).
    With a `teacher` (a TeacherPolicy), `<prefix>_distill_kl` is the mean over the evaluated response tokens of
    the exact KL(student || teacher) of their next-token distributions."""
    logged = []  # (rows, what the reward functions passed to log_metric) per batch
    indices = list(range(args.process_index, len(dataset), args.world_size))
    per_rank, real = -(-len(dataset) // args.world_size), len(indices)
    indices += [indices[-1] if indices else 0] * (per_rank - real)
    scores, lengths, costs, turn_rewards, rollout, kl_sums = [], [], [], [], [], []
    for start in range(0, len(indices), args.per_device_eval_batch_size):
        rows = [dataset[i] for i in indices[start : start + args.per_device_eval_batch_size]]
        batch, rollout_metrics = generate(actor, rows, multi_turn, **sampling_kwargs(SamplingSettings.of(args), train=False))
        result = rewards.run(batch)
        scores += result.per_function.tolist()
        logged.append((len(batch), result.logged_metrics))
        lengths += batch.response_mask.sum(dim=1).float().tolist()
        costs += constraint.eval_costs(batch)
        turn_rewards += with_turn_rewards(torch.zeros(len(batch)), batch).tolist()
        rollout.append((len(batch), rollout_metrics))
        if teacher is not None:
            kl_sums += distill_kl(actor, teacher, batch)
    keep = real * args.eval_num_generations
    scores, lengths, costs, turn_rewards = scores[:keep], lengths[:keep], costs[:keep], turn_rewards[:keep]
    kl_sums = kl_sums[:keep]
    if args.world_size > 1:
        from accelerate.utils import gather_object

        scores, lengths, costs = gather_object(scores), gather_object(lengths), gather_object(costs)
        turn_rewards, rollout, kl_sums = gather_object(turn_rewards), gather_object(rollout), gather_object(kl_sums)
        logged = gather_object(logged)
    per_function = torch.tensor(scores, dtype=torch.float32).view(-1, len(rewards.funcs))
    metrics = reward_metrics(per_function, rewards, args.eval_correct_threshold, prefix, torch.tensor(turn_rewards))
    metrics[f"{prefix}_response_length"] = sum(lengths) / max(len(lengths), 1)
    if multi_turn is not None:
        metrics.update(rollout_means(rollout, prefix))
    metrics.update(logged_means(logged, prefix))
    if kl_sums:
        metrics[f"{prefix}_distill_kl"] = sum(kl for kl, _ in kl_sums) / max(sum(n for _, n in kl_sums), 1.0)
    return {**metrics, **per_function_metrics(per_function, rewards, prefix), **cost_metrics(costs, prefix)}


@torch.no_grad()
def distill_kl(actor, teacher, batch) -> list[tuple[float, float]]:
    """Per row of `batch`: (the sum over its response tokens of KL(student || teacher) over the ids both share,
    its token count). The whole distributions through both heads in chunks (GKD's divergence at beta = 1), at
    the training temperature."""
    was_training = actor.model.training
    try:
        _, _, kl = actor.compute_logprobs_and_divergence(batch, teacher.divergence_against(batch, 1.0))
    finally:
        actor.model.train(was_training)
    mask = batch.response_mask.to(kl.device).float()
    return list(zip((kl * mask).sum(dim=1).tolist(), mask.sum(dim=1).tolist()))


def rollout_means(rollout: list[tuple[int, dict]], prefix: str) -> dict[str, float]:
    """The multi-turn rollout's metrics over the whole evaluation: each batch's, weighted by its rows."""
    total = sum(count for count, _ in rollout)
    names = rollout[0][1] if rollout else {}
    return {f"{prefix}_{name}": sum(count * m[name] for count, m in rollout) / total for name in names}


def logged_means(logged: list[tuple[int, dict]], prefix: str) -> dict[str, float]:
    """What reward functions logged (`log_metric`) over the evaluation: each name's batch values weighted by the
    rows of the batches that logged it."""
    names = dict.fromkeys(name for _, m in logged for name in m)
    return {f"{prefix}_{name}": sum(n * m[name] for n, m in logged if name in m) / sum(n for n, m in logged if name in m)
            for name in names}


def reward_metrics(per_function: torch.Tensor, rewards: RewardStage, threshold: float, prefix: str,
                   turn_rewards: torch.Tensor | None = None) -> dict:
    """Weighted reward (plus each row's sum of per-turn `turn_rewards`, when any is non-zero) and accuracy
    (the share whose first function scores at least `threshold`)."""
    correct = (per_function[:, 0] >= threshold).long()
    total = torch.nansum(per_function * torch.tensor(rewards.weights), dim=1)
    turns = {}
    if turn_rewards is not None and turn_rewards.numel() and bool(turn_rewards.ne(0).any()):
        total, turns = total + turn_rewards, {f"{prefix}_turn_reward": turn_rewards.mean().item()}
    return {f"{prefix}_reward": total.mean().item(), **turns,
            f"{prefix}_accuracy": accuracy_metric().compute(predictions=correct.tolist(),
                                                             references=[1] * len(correct))["accuracy"]}


def per_function_metrics(per_function: torch.Tensor, rewards: RewardStage, prefix: str) -> dict:
    """Each reward function's mean over the rows it scored."""
    metrics = {}
    for j, (name, _) in enumerate(rewards.funcs):
        scored = per_function[:, j][~torch.isnan(per_function[:, j])]
        if scored.numel():
            metrics[f"{prefix}_reward/{name}"] = scored.mean().item()
    return metrics


def cost_metrics(costs: list[float], prefix: str) -> dict:
    if not costs:
        return {}
    return {f"{prefix}_cost": sum(costs) / len(costs), f"{prefix}_unsafe_rate": sum(c > 0 for c in costs) / len(costs)}
