"""Rollouts with `model.generate` from transformers: the engine that needs nothing beyond the training model.

It samples from the training model's own weights, so `load_weights` has nothing to copy.
Prompts are left-padded so that every response starts at the same column.

See it work: tests/test_rollout_hf.py.
"""

from __future__ import annotations

import contextlib

import torch

from .base import Rollout, SamplingConfig, left_pad, mask_after_eos


NEUTRAL_PROCESSORS = dict(repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
                          min_length=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
# Fields that cannot be set to "off" explicitly; a model whose generation_config sets them gets a warning.
UNNEUTRALISABLE = ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_bos_token_id",
                   "forced_eos_token_id")


class HFGenerateEngine:
    def __init__(self, model, pad_token_id: int, eos_token_ids: list[int]):
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        config = getattr(model, "generation_config", None)
        biased = [name for name in UNNEUTRALISABLE if getattr(config, name, None) not in (None, [], {})]
        if biased:
            import warnings

            warnings.warn(f"the model's generation_config sets {biased}: sampling will not follow softmax(logits / T) "
                          f"and the policy-gradient ratios will be off; clear them (model.generation_config.<name> = None).",
                          stacklevel=2)

    def load_weights(self, named_tensors) -> None:
        """Nothing to do: generation runs on the training model itself."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingConfig) -> Rollout:
        device = next(self.model.parameters()).device
        ids, mask = left_pad(prompt_ids, self.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        was_training = self.model.training
        self.model.eval()
        recorder = _LogprobRecorder(params.temperature if params.do_sample else 1.0) if params.return_logprobs else None
        try:
            with _whole_model(self.model):
                out = self.model.generate(
                    input_ids=ids, attention_mask=mask, generation_config=self._generation_config(params),
                    logits_processor=[recorder] if recorder else None,
                )
        finally:
            self.model.train(was_training)
        response = out[:, ids.shape[1] :]
        if response.shape[1] == 0:  # every prompt ended at once; keep one (masked) column
            response = torch.full((out.shape[0], 1), self.pad_token_id, dtype=torch.long, device=device)
        response, response_mask, truncated = mask_after_eos(response, self.eos_token_ids, self.pad_token_id)
        n = params.num_return_sequences
        logprobs = recorder.finish(out[:, -1:], response.shape[1]) * response_mask if recorder else None
        return Rollout(
            prompt_ids=ids.repeat_interleave(n, dim=0), prompt_mask=mask.repeat_interleave(n, dim=0),
            response_ids=response, response_mask=response_mask, truncated=truncated, logprobs=logprobs,
        )

    def _generation_config(self, params: SamplingConfig):
        from transformers import GenerationConfig

        sampling = {}
        if params.do_sample:
            sampling = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
        # transformers fills every field left unset from the model's own generation_config (e.g. a
        # repetition_penalty shipped with an instruct model). That would sample from a distribution other than
        # softmax(logits / T), which the log-probs and ratios assume: set the logit processors to neutral.
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens, do_sample=params.do_sample,
            num_return_sequences=params.num_return_sequences, pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_ids, use_cache=True, **NEUTRAL_PROCESSORS, **sampling,
        )


def _whole_model(model):
    """Under DeepSpeed ZeRO-3 gather every parameter once for the whole generate call; otherwise the
    partitioned layers would be gathered again for every generated token. Elsewhere a no-op."""
    params = list(model.parameters())
    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params)


class _LogprobRecorder:
    """A logits processor that keeps the log-prob of each sampled token, one step behind.

    transformers runs custom processors before its temperature/top-k/top-p warpers, so the temperature is
    applied here; the log-probs match `sequence_logprobs` (temperature only, no top-k/top-p renormalising).
    Only one (B, V) step is held at a time, never the whole (B, T, V) score history.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.previous: torch.Tensor | None = None
        self.chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1:])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        if self.previous is not None:
            self.chosen.append(self.previous.gather(-1, tokens).squeeze(-1))

    def finish(self, last_tokens: torch.Tensor, length: int) -> torch.Tensor:
        """(B, length) log-probs; steps after a row finished hold padding's log-prob and are masked by the caller."""
        self._take(last_tokens)
        logprobs = torch.stack(self.chosen, dim=1) if self.chosen else torch.zeros(last_tokens.shape[0], 0)
        if logprobs.shape[1] < length:
            logprobs = torch.nn.functional.pad(logprobs, (0, length - logprobs.shape[1]))
        return logprobs[:, :length]
