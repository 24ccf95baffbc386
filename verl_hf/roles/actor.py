"""`Actor`: the policy being trained, with the algorithm's verbs.

- `generate_sequences(...)` samples responses through the rollout engine and returns a `GenerationOutput`
  (`RolloutBatch`): prompt and response ids, masks, sampling log-probs, decoded completions.
- `get_logprobs(sequences)` scores responses without gradients; `compute_logprobs(sequences)` with them.
- `update(loss)` / `backward(loss)` + `step()` for custom loops (VerlTrainer steps its own optimizer).

Log-probs use logits divided by the sampling temperature, so they describe the distribution the responses
were drawn from; they come from the LM head in chunks (`logits_chunk_size`, see roles/scoring.py), never
from the whole (B, T, V) logits.

See it work: tests/test_roles.py, examples/custom_loop_ppo.py.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import TrainerCallback

from ..batch import RolloutBatch, row_columns
from ..distributed import is_fsdp2, is_sharded
from ..rollout import HFSharedEngine, RolloutEngine, SamplingConfig, eos_token_ids
from ..routing import RoutingReplay
from ..vision.inputs import cut_at_placeholders
from ..vision.prompts import ImagePrompts
from ..vision.setup import is_processor
from .base import TrainableRole, score_in_chunks
from .scoring import scored_responses, sequence_logprobs


class Actor(TrainableRole):
    from transformers import AutoModelForCausalLM as auto_class

    def __init__(self, model, tokenizer=None, engine: RolloutEngine | None = None, temperature: float = 1.0,
                 learning_rate: float = 1e-5, max_grad_norm: float | None = 1.0, weight_sync=None,
                 logits_chunk_size: int | None = None, routing_replay: bool = False, image_column: str = "images"):
        """`tokenizer`: the policy's tokenizer, or for a vision-language policy its processor (`AutoProcessor`):
        then the rows' images (`image_column`) go into the prompts and to the engine (verl_hf/vision/).
        `logits_chunk_size`: tokens per LM-head chunk for log-probs (None: about 64 MiB of logits; 0: the
        full-logits path). `engine`: the rollout engine (default: `HFSharedEngine`, HF generate on `model` itself). An engine
        with its own weights (`engine.receives_weights`) is refreshed by `weight_sync` before the first generation
        and after every `step()` (default `WeightSync()`; from process 0 alone for an engine `shared_by_processes`).
        `routing_replay` (MoE policies): the engine records each token's experts and every training forward over
        those responses routes them the same way (verl_hf/routing.py)."""
        processor = tokenizer if is_processor(tokenizer) else None
        tokenizer = processor.tokenizer if processor is not None else tokenizer
        super().__init__(model, tokenizer, learning_rate=learning_rate, max_grad_norm=max_grad_norm)
        self.images = ImagePrompts(processor, image_column) if processor is not None else None
        if tokenizer is None:
            raise ValueError("Actor needs a tokenizer: Actor(model, tokenizer=...) or Actor.from_pretrained(path).")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.temperature, self.logits_chunk_size = temperature, logits_chunk_size
        self.eos_token_ids = eos_token_ids(model, tokenizer)  # what ends a response (GKD's dataset answers too)
        self.engine = engine or HFSharedEngine(model, tokenizer.pad_token_id, self.eos_token_ids)
        if not isinstance(self.engine, RolloutEngine):
            raise TypeError(f"engine={type(self.engine).__name__} is not a verl_hf.rollout.RolloutEngine: subclass it "
                            f"(only generate is required; the base class declares the rest with safe defaults).")
        self.weight_sync = None
        if self.engine.receives_weights:
            from ..sync import WeightSync

            self.weight_sync = weight_sync or WeightSync.for_engine(self.engine)
        elif self.engine.generates_from(model) and is_fsdp2(model):
            # FSDP2 gathers each layer in every forward, and ranks stop generating after different numbers of
            # tokens: their forwards, hence their gathers, would not pair up (a hang), and it would be slow.
            raise ValueError("HF generate on the FSDP2-sharded policy itself is not supported: sample from a copy fed "
                             "by the weight sync, engine=HFCopyEngine.of(model, pad_token_id, eos_token_ids) "
                             "(VerlConfig: rollout_hf_weights='copy'), or from vLLM.")
        elif not self.engine.generates_from(model) and is_sharded(model):
            raise ValueError(f"the rollout engine {type(self.engine).__name__} cannot receive weights, and the policy "
                             f"is sharded (DeepSpeed ZeRO-3 or FSDP2): it would sample from stale weights. Use an "
                             f"engine with load_weights (receives_weights=True), or HFSharedEngine on a ZeRO-3 "
                             f"policy itself.")
        self._engine_stale = self.weight_sync is not None
        # False under asynchronous training: its producer samples from the weights the engine has (asynchronous.py)
        self.sync_on_sample = True
        self.routing = self._routing_replay(model) if routing_replay else None

    # ---------------------------------------------------------------- sampling
    def generate_sequences(self, prompts=None, *, prompt_ids=None, input_ids=None, attention_mask=None,
                           max_new_tokens: int | None = None, num_return_sequences: int = 1, temperature: float | None = None,
                           top_k: int = 0, top_p: float = 1.0, do_sample: bool = True, seed: int | None = None,
                           return_logprobs: bool = True, rows: list[dict] | None = None,
                           row_seeds: list[int] | None = None, return_routes: bool | None = None) -> RolloutBatch:
        """Sample `num_return_sequences` responses per prompt (rows of one prompt are adjacent).

        Prompts come as one of: a batch from `RLHFDataset.dataloader` (its dataset rows travel along for the
        reward functions), a list of strings, `prompt_ids` (lists of token ids), or padded `input_ids` with
        `attention_mask`. Sampling uses the actor's temperature unless `temperature` is given. `max_new_tokens`
        defaults to the batch's `max_response_length` (RLHFDataset), else 128. `row_seeds` (one per prompt)
        make each prompt's samples independent of the rest of the batch. `return_routes` (default: with
        routing replay) records the MoE experts of every token, for replay.
        """
        ids, rows = self._prompt_ids(prompts, prompt_ids, input_ids, attention_mask, rows)
        if return_routes and not self.engine.returns_routes:
            raise ValueError(f"return_routes=True, but {type(self.engine).__name__} does not record MoE routes.")
        if max_new_tokens is None:
            max_new_tokens = (prompts.get("max_response_length") if isinstance(prompts, dict) else None) or 128
        params = self.sampling_config(max_new_tokens, num_return_sequences, temperature, top_k, top_p, do_sample,
                                      seed, return_logprobs, row_seeds, return_routes)
        pixels = self._pixels(rows)
        out = self.fresh_engine().generate(ids, params, **({"pixels": pixels} if pixels else {}))
        if self.images is not None:
            out = cut_at_placeholders(out, self.images.placeholder_ids, self.tokenizer.pad_token_id)
        n = num_return_sequences
        rows = rows or [{} for _ in ids]
        return RolloutBatch(
            prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, response_ids=out.response_ids,
            response_mask=out.response_mask, truncated=out.truncated, rollout_logprobs=out.logprobs,
            rollout_versions=out.versions, prompt_routes=out.prompt_routes, response_routes=out.response_routes,
            group_ids=torch.arange(len(ids), device=out.response_ids.device).repeat_interleave(n),
            prompts=[row.get("prompt", self.tokenizer.decode(p)) for row, p in zip(rows, ids) for _ in range(n)],
            completions=self.tokenizer.batch_decode(out.response_ids, skip_special_tokens=True),
            columns=row_columns(rows, n), adapter_versions=_per_row(out.adapter_version, len(out.response_ids)),
            pixels=[p for p in pixels for _ in range(n)] if pixels else [],
        )

    def _pixels(self, rows: list[dict] | None, tools: list[dict] | None = None) -> list | None:
        """The rows' pixel inputs (verl_hf/vision/; `tools`: the schemas their prompts were rendered with), or None
        where no row has an image."""
        if self.images is None or not rows or not any(row.get(self.images.column) for row in rows):
            return None
        if not self.engine.accepts_images:
            raise ValueError(f"the prompts have images but the rollout engine {type(self.engine).__name__} does not "
                             f"take them (accepts_images=False); use rollout_engine='hf'.")
        return self.images.pixels(rows, tools)

    def sampling_config(self, max_new_tokens: int, num_return_sequences: int = 1, temperature: float | None = None,
                        top_k: int = 0, top_p: float = 1.0, do_sample: bool = True, seed: int | None = None,
                        return_logprobs: bool = True, row_seeds=None, return_routes: bool | None = None) -> SamplingConfig:
        """The engine's sampling parameters (the actor's temperature unless `temperature` is given)."""
        return SamplingConfig(
            max_new_tokens=max_new_tokens, num_return_sequences=num_return_sequences, do_sample=do_sample,
            temperature=self.temperature if temperature is None else temperature, top_p=top_p, top_k=top_k,
            seed=seed, return_logprobs=return_logprobs, row_seeds=tuple(row_seeds) if row_seeds is not None else None,
            return_routes=self.routing is not None if return_routes is None else return_routes)

    def fresh_engine(self) -> RolloutEngine:
        """The rollout engine, its weights synced first if the policy changed since the last sync."""
        if self._engine_stale and self.sync_on_sample:
            self.sync_weights()
        return self.engine

    def generate_conversations(self, rollout, rows: list[dict], **sampling) -> tuple[RolloutBatch, dict]:
        """Multi-turn rollouts (verl_hf/agent/loop.py): `num_return_sequences` conversations per dataset row
        (`prompt` as chat messages, `prompt_ids`), played through `rollout`'s environments. `sampling`: the
        arguments of `sampling_config` (`max_new_tokens` caps each turn). Returns (batch, the rollout's
        metrics: turns, tool calls, stop reasons). A vision-language actor's rows bring their images (`rollout`
        given the processor too, environments and tools may answer with more)."""
        from ..agent.loop import to_batch

        params = self.sampling_config(**sampling)
        engine = self.fresh_engine()
        conversations = rollout.run(engine, rows, params, self._pixels(rows, rollout.tools_schema))
        batch = to_batch(conversations, rows, params.num_return_sequences, self.tokenizer)
        # no sync runs during a round (partial rollouts are refused with an adapter): every turn had this version
        batch.adapter_versions = _per_row(getattr(engine, "adapter_version", 0) or None, len(batch))
        return batch, rollout.metrics(conversations)

    def sync_weights(self) -> dict[str, float]:
        """Push the current weights into an engine that keeps its own copy; returns the sync metrics."""
        if self.weight_sync is None:
            return {}
        metrics = self.weight_sync.sync(self.model, self.engine)
        self._engine_stale = False
        return metrics

    @property
    def engine_is_stale(self) -> bool:
        """True while an engine with its own weights has not received the latest ones."""
        return self._engine_stale

    def mark_weights_changed(self) -> None:
        """The weights were updated outside `step()` (e.g. by the Trainer's optimizer): sync before sampling."""
        self._engine_stale = self.weight_sync is not None

    def step(self) -> float | None:
        norm = super().step()
        self.mark_weights_changed()
        return norm

    def _prompt_ids(self, prompts, prompt_ids, input_ids, attention_mask, rows):
        if isinstance(prompts, dict):  # a batch from RLHFDataset.dataloader
            return prompts["prompt_ids"], rows or prompts.get("rows")
        if prompts is not None:
            if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
                raise TypeError("prompts must be a list of strings or an RLHFDataset batch; for token ids use prompt_ids=.")
            return [self.tokenizer(p).input_ids for p in prompts], rows or [{"prompt": p} for p in prompts]
        if prompt_ids is not None:
            return [list(map(int, p)) for p in prompt_ids], rows
        if input_ids is not None:
            mask = attention_mask if attention_mask is not None else (input_ids != self.tokenizer.pad_token_id)
            return [ids[m.bool()].tolist() for ids, m in zip(input_ids, mask)], rows
        raise ValueError("generate_sequences needs prompts, prompt_ids= or input_ids=.")

    # ---------------------------------------------------------------- scoring
    def get_logprobs(self, sequences: RolloutBatch, micro_batch_size: int | None = None, model=None) -> torch.Tensor:
        """Log-probs (B, Lr) of the responses under the current weights, without gradients, in micro-batches."""
        return score_in_chunks(model or self.model, sequences, micro_batch_size,
                               lambda m, mb: self._logprobs(m, mb)[0])

    def compute_logprobs(self, sequences: RolloutBatch, model=None, with_entropy: bool = False,
                         entropy_grad: bool = False):
        """(log-probs (B, Lr), entropies or None) with gradients, for the policy update; `model` may be the
        accelerate/DeepSpeed-wrapped module."""
        model = model or self.model
        model.train()
        return self._logprobs(model, sequences.to(self.device), with_entropy, entropy_grad)

    def compute_logprobs_and_divergence(self, sequences: RolloutBatch, divergence, model=None,
                                       with_entropy: bool = False, entropy_grad: bool = False):
        """As `compute_logprobs`, plus `divergence` (B, Lr) computed in the same forward from the response
        positions' hidden states through the head (GKD: `TeacherPolicy.divergence_against`), with gradients."""
        model = model or self.model
        model.train()
        with self.replaying(sequences):
            return scored_responses(model, sequences.to(self.device), self.temperature, with_entropy, entropy_grad,
                                    self.logits_chunk_size, divergence=divergence)

    def _logprobs(self, model, batch, with_entropy: bool = False, entropy_grad: bool = False):
        with self.replaying(batch):
            return sequence_logprobs(model, batch, self.temperature, with_entropy, entropy_grad, self.logits_chunk_size)

    # ---------------------------------------------------------------- MoE routing replay
    def replaying(self, batch: RolloutBatch):
        """A context inside which forwards over `batch` route its tokens as the engine did (nothing without
        routing replay or routes). Wrap the backward too when gradient checkpointing is on."""
        if self.routing is None:
            return contextlib.nullcontext()
        return self.routing.replaying(batch.prompt_routes, batch.response_routes)

    def routing_metrics(self) -> dict[str, float]:
        """`moe/replay_agreement` since the last call: how often the live router chose the replayed experts."""
        return self.routing.take_metrics() if self.routing is not None else {}

    def _routing_replay(self, model) -> RoutingReplay:
        if not self.engine.returns_routes:
            raise ValueError(f"routing_replay needs an engine that records each token's experts; "
                             f"{type(self.engine).__name__} does not (the HF engine does; colocated vLLM on a GPU "
                             f"does with vLLM's enable_return_routed_experts). Set routing_replay=False.")
        return RoutingReplay(model)


class EngineWeightsChanged(TrainerCallback):
    """Every optimizer step changes the weights: the actor's engine copy (if any) is stale until the next sync,
    also for generation that does not go through training_step (evaluation, a user's callback)."""

    def __init__(self, actor: Actor):
        self.actor = actor

    def on_step_end(self, args, state, control, **kwargs):
        self.actor.mark_weights_changed()


def _per_row(adapter_version: int | None, rows: int) -> torch.Tensor | None:
    """(rows,) the adapter version that sampled them (an engine that serves a LoRA adapter), else None."""
    return None if adapter_version is None else torch.full((rows,), adapter_version, dtype=torch.long)
