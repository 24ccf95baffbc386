"""Evaluation of the policy: generate on held-out prompts (greedy unless `eval_do_sample`) and score them.

Reports `<prefix>_reward`, `<prefix>_reward/<function>`, `<prefix>_accuracy` (share of responses whose first
reward function scores at least `eval_correct_threshold`), `<prefix>_response_length`, and with Safe-RLHF
`<prefix>_cost` and `<prefix>_unsafe_rate`.

See it work: tests/test_trainer_e2e.py.
"""

from __future__ import annotations

import torch

from .metrics import accuracy_metric
from .round import RewardStage, generate, sampling_kwargs


def evaluate_rewards(actor, rewards: RewardStage, constraint, dataset, args, prefix: str,
                     multi_turn=None) -> dict[str, float]:
    """Each process scores every world_size-th prompt; shards are padded to the same number of generate
    calls (ZeRO-3 and NCCL collectives need every rank in step) and the padding is dropped again. With
    `multi_turn` each prompt is a whole conversation, as in training."""
    indices = list(range(args.process_index, len(dataset), args.world_size))
    per_rank, real = -(-len(dataset) // args.world_size), len(indices)
    indices += [indices[-1] if indices else 0] * (per_rank - real)
    scores, lengths, costs = [], [], []
    for start in range(0, len(indices), args.per_device_eval_batch_size):
        rows = [dataset[i] for i in indices[start : start + args.per_device_eval_batch_size]]
        batch, _ = generate(actor, rows, multi_turn, **sampling_kwargs(args, train=False))
        scores += rewards.run(batch).per_function.tolist()
        lengths += batch.response_mask.sum(dim=1).float().tolist()
        costs += constraint.eval_costs(batch)
    keep = real * args.eval_num_generations
    scores, lengths, costs = scores[:keep], lengths[:keep], costs[:keep]
    if args.world_size > 1:
        from accelerate.utils import gather_object

        scores, lengths, costs = gather_object(scores), gather_object(lengths), gather_object(costs)
    per_function = torch.tensor(scores, dtype=torch.float32).view(-1, len(rewards.funcs))
    metrics = reward_metrics(per_function, rewards, args.eval_correct_threshold, prefix)
    metrics[f"{prefix}_response_length"] = sum(lengths) / max(len(lengths), 1)
    return {**metrics, **per_function_metrics(per_function, rewards, prefix), **cost_metrics(costs, prefix)}


def reward_metrics(per_function: torch.Tensor, rewards: RewardStage, threshold: float, prefix: str) -> dict:
    """Weighted reward and accuracy (the share whose first function scores at least `threshold`)."""
    correct = (per_function[:, 0] >= threshold).long()
    total = torch.nansum(per_function * torch.tensor(rewards.weights), dim=1)
    return {f"{prefix}_reward": total.mean().item(),
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
