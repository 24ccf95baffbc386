"""`Actor`: the policy being trained, with the algorithm's verbs (sample responses, score their log-probs).

It wraps an HF causal LM and a rollout engine. Log-probs are computed on logits divided by the sampling
temperature, so they describe the distribution the responses were drawn from.

See it work: tests/test_roles.py.
"""

from __future__ import annotations

import torch

from ..algorithms import entropy_from_logits, logprobs_from_logits
from ..batch import RolloutBatch
from ..rollout import SamplingConfig


def sequence_logprobs(model, batch: RolloutBatch, temperature: float = 1.0, with_entropy: bool = False,
                      entropy_grad: bool = False):
    """Log-probs (B, Lr) of the response tokens under `model`, and their entropies (B, Lr) or None.

    Entropies carry gradients only with `entropy_grad` (an entropy bonus); as a metric they cost no graph.

    Positions follow the attention mask (left padding shifts them), exactly as `generate` numbered them.
    Only the logits of response positions are computed (`logits_to_keep`), not the prompt's.
    """
    attention_mask = batch.attention_mask
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    response_len = batch.response_ids.shape[1]
    logits = model(
        input_ids=batch.input_ids, attention_mask=attention_mask, position_ids=position_ids,
        use_cache=False, logits_to_keep=response_len + 1,
    ).logits
    logits = logits[:, :-1].float() / temperature  # position t predicts token t+1
    logprobs = logprobs_from_logits(logits, batch.response_ids)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return logprobs, entropy


class Actor:
    def __init__(self, model, tokenizer, engine, temperature: float = 1.0):
        self.model, self.tokenizer, self.engine, self.temperature = model, tokenizer, engine, temperature

    def generate_sequences(self, prompt_ids: list[list[int]], params: SamplingConfig, rows: list[dict] | None = None):
        """Sample `params.num_return_sequences` responses per prompt; returns a RolloutBatch.

        `rows` (the dataset rows of the prompts) travel along, repeated per response, for the reward functions.
        """
        out = self.engine.generate(prompt_ids, params)
        n = params.num_return_sequences
        rows = rows or [{} for _ in prompt_ids]
        columns = {k: [row[k] for row in rows for _ in range(n)] for k in rows[0] if k not in ("prompt", "prompt_ids")}
        return RolloutBatch(
            prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, response_ids=out.response_ids,
            response_mask=out.response_mask, truncated=out.truncated, rollout_logprobs=out.logprobs,
            group_ids=torch.arange(len(prompt_ids)).repeat_interleave(n),
            prompts=[row.get("prompt") for row in rows for _ in range(n)],
            completions=self.tokenizer.batch_decode(out.response_ids, skip_special_tokens=True),
            columns=columns,
        )

    @torch.no_grad()
    def get_logprobs(self, batch: RolloutBatch, micro_batch_size: int, model=None) -> torch.Tensor:
        """Log-probs (B, Lr) of the responses under the current weights, without gradients, in micro-batches."""
        model = model or self.model
        was_training = model.training
        model.eval()
        try:
            parts = [sequence_logprobs(model, mb, self.temperature)[0] for mb in batch.split(micro_batch_size)]
        finally:
            model.train(was_training)
        return torch.cat(parts)
