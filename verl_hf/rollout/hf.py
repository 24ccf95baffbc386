"""Rollouts with `model.generate` from transformers, in one of two forms that share one `generate`:

- `HFSharedEngine(training_model, ...)`: samples from the training model's own weights; nothing to sync.
  Under ZeRO-3 the whole model is gathered once per `generate` call.
- `HFCopyEngine.of(training_model, ...)`: a plain model of the same architecture that the weight sync
  (verl_hf.sync) fills after each update. It generates without any ZeRO-3 hooks or PEFT adapters (LoRA
  arrives merged), and in its own dtype.

Prompts are left-padded so that every response starts at the same column.

See it work: tests/test_rollout_hf.py, tests/test_sync.py.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch

from ..distributed import is_sharded, whole_model
from ..routing import generation_routes, recorded_routes
from ..vision.positions import pixel_inputs, rope_index_owner
from .base import Rollout, RolloutEngine, SamplingConfig, empty_rollout, left_pad, mask_after_eos


NEUTRAL_PROCESSORS = dict(repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
                          min_length=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
# Fields that cannot be set to "off" explicitly; a model whose generation_config sets them gets a warning.
UNNEUTRALISABLE = ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_bos_token_id",
                   "forced_eos_token_id")


class HFEngine(RolloutEngine):
    """`generate` with transformers on `self.model`, the part both HF forms share."""

    returns_routes = True  # an MoE model's routers are recorded while it generates (verl_hf/routing.py)
    accepts_images = True  # pixel inputs go to generate beside the ids (verl_hf/vision/)

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

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def weight_names(self) -> list[str]:
        return [name for name, _ in self.model.named_parameters()]

    def get_weights(self, names: list[str]) -> dict[str, torch.Tensor]:
        params = dict(self.model.named_parameters())
        return {name: params[name].detach() for name in names}

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingConfig, pixels: list | None = None) -> Rollout:
        if not prompt_ids:  # a collective call (ZeRO-3) this process joins with nothing left to sample
            with whole_model(self.model):
                return empty_rollout(params.return_logprobs)
        device = next(self.model.parameters()).device
        ids, mask = left_pad(prompt_ids, self.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        n, repeat = params.num_return_sequences, 1
        recorder = _LogprobRecorder(params.temperature if params.do_sample else 1.0) if params.return_logprobs else None
        processors = [recorder] if recorder else []
        config = self._generation_config(params)
        if params.row_seeds is not None and params.do_sample:
            # Exact sampling as argmax(log-probs + Gumbel noise) from one generator per row, so that a row's
            # samples do not depend on the other rows; generate itself then decodes greedily.
            seeds = [hash((seed, j)) & (2**63 - 1) for seed in params.row_seeds for j in range(n)]
            processors.append(_SeededSampler(seeds, params.temperature, params.top_k, params.top_p, device))
            config = self._generation_config(dataclasses.replace(params, do_sample=False, num_return_sequences=1))
            ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
            n, repeat = 1, n
        if pixels and n > 1 and rope_index_owner(self.model) is None:
            # generate repeats pixel tensors for n samples only where it knows their layout (Qwen2-VL: by the
            # grids); for the others (Gemma-3: one tensor per image) each prompt becomes its n rows here
            config = self._generation_config(dataclasses.replace(params, num_return_sequences=1))
            ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
            n, repeat = 1, n
        # images: each prompt's pixels, repeated where its rows were (generate repeats them for n by the grids)
        images = pixel_inputs(self.model, ids, [p for p in pixels for _ in range(repeat)]) if pixels else {}
        was_training = self.model.training
        self.model.eval()
        try:
            routes = recorded_routes(self.model) if params.return_routes else contextlib.nullcontext()
            with whole_model(self.model), routes as forwards:
                out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                          logits_processor=processors or None, **images)
        finally:
            self.model.train(was_training)
        response = out[:, ids.shape[1] :]
        if response.shape[1] == 0:  # every prompt ended at once; keep one (masked) column
            response = torch.full((out.shape[0], 1), self.pad_token_id, dtype=torch.long, device=device)
        response, response_mask, truncated = mask_after_eos(response, self.eos_token_ids, self.pad_token_id)
        logprobs = recorder.finish(out[:, -1:], response.shape[1]) * response_mask if recorder else None
        rollout = Rollout(
            prompt_ids=ids.repeat_interleave(n, dim=0), prompt_mask=mask.repeat_interleave(n, dim=0),
            response_ids=response, response_mask=response_mask, truncated=truncated, logprobs=logprobs,
        )
        if forwards is not None:
            rollout.prompt_routes, rollout.response_routes = generation_routes(
                forwards, rollout.prompt_mask, response_mask)
        return rollout

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


class HFSharedEngine(HFEngine):
    """Samples from the training model itself (`model` is the policy being trained): never stale, nothing to
    sync, no extra memory."""

    def generates_from(self, model) -> bool:
        return model is self.model

    @property
    def calls_are_collective(self) -> bool:
        """On sharded weights every generate call gathers them together with the other processes (ZeRO-3; an
        FSDP2 policy is refused by Actor, whose forwards would not pair up)."""
        return is_sharded(self.model)

    def load_weights(self, named_tensors) -> None:
        """Nothing to copy: the engine's weights are the training weights."""

    @staticmethod
    def inference_copy(training_model, pad_token_id: int, eos_token_ids: list[int], dtype=None, device=None):
        """The former spelling of `HFCopyEngine.of` (when one class had both forms), kept for existing code."""
        return HFCopyEngine.of(training_model, pad_token_id, eos_token_ids, dtype=dtype, device=device)


class HFCopyEngine(HFEngine):
    """Samples from its own plain model, which the weight sync fills (`receives_weights`), in its own dtype
    and on its own device. `HFCopyEngine(model, ...)` takes a ready model; `HFCopyEngine.of(policy, ...)`
    builds one of the policy's architecture."""

    receives_weights = True

    @classmethod
    def of(cls, training_model, pad_token_id: int, eos_token_ids: list[int], dtype=None, device=None,
           attn_implementation: str | None = None) -> "HFCopyEngine":
        """An engine with its own plain copy of `training_model`'s architecture (PEFT and DeepSpeed wrappers
        ignored), in `dtype` (default: the training weights' dtype) and with `attn_implementation` (default: the
        policy's). Its weights are zeros until the first sync."""
        base = training_model.get_base_model() if hasattr(training_model, "get_base_model") else training_model
        first = next(base.parameters())
        dtype = dtype or first.dtype
        from transformers.initialization import no_init_weights

        config = copy.deepcopy(base.config)  # its own: the attention choice must not change the policy's
        if attn_implementation is not None:
            config._attn_implementation = attn_implementation
        # The class constructor, not from_config: under an active ZeRO-3 config transformers would partition it.
        # No random init (the sync overwrites every weight) and no draw from the global RNG, so a run samples
        # the same with or without a copy.
        with no_init_weights(), torch.random.fork_rng(devices=[]):
            model = type(base)(config)
        model.tie_weights()  # init_weights, which ties them, was skipped
        model.to(device=device or first.device, dtype=dtype)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()  # touch the memory now: later syncs must not be charged for first-touch page faults
        model.generation_config = base.generation_config
        model.eval().requires_grad_(False)
        return cls(model, pad_token_id, eos_token_ids)

    @torch.no_grad()
    def load_weights(self, named_tensors) -> None:
        """Copy (name, tensor) pairs into the engine's own model."""
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"the HF engine has no weight {name!r}; its names look like {list(params)[:3]}.")
            if params[name].shape != tensor.shape:
                raise ValueError(f"the HF engine's {name!r} has shape {tuple(params[name].shape)}, the training "
                                 f"weight {tuple(tensor.shape)}: the engine is another architecture or size.")
            params[name].copy_(tensor)


HFGenerateEngine = HFSharedEngine  # the name before the two forms were split


class _SeededSampler:
    """Turns greedy decoding into sampling from softmax(filtered logits / T), one torch.Generator per row:
    argmax(log p + Gumbel noise) is an exact sample (the Gumbel-max trick). top-k/top-p use transformers' own
    warpers."""

    def __init__(self, seeds: list[int], temperature: float, top_k: int, top_p: float, device):
        from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.temperature = temperature
        self.warpers = ([TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.temperature
        for warper in self.warpers:
            logits = warper(input_ids, logits)
        vocab = logits.shape[-1]
        uniform = torch.stack([torch.rand(vocab, generator=g, device=logits.device) for g in self.generators])
        gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20)))
        return torch.log_softmax(logits, dim=-1) + gumbel


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
