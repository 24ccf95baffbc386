"""One in-place weight update per sync in a colocated vLLM: open vLLM's layerwise reload once, load every bucket,
finalize once. Each function runs where vLLM's model is (`llm.collective_rpc(fn, args=...)`, given the worker).

Why not `reload_weights(weights_iterator=...)` per bucket, as before: in vLLM 0.32 to 0.34 each call opens and
finalizes the layerwise reload over every module of the model (model_executor/model_loader/reload/inplace.py,
layerwise.py), so a 7B model in 256 MB buckets took ~55 whole-model passes per sync, and each logged "Following
weights were not loaded from checkpoint" and a "Failed to load weights" per module outside its bucket. vLLM's
own weight-transfer engines (nccl_engine.py, ipc_engine.py) open once, `model.load_weights` each chunk and
finalize once; so do we, with the same functions: 0.32/0.33 `initialize_layerwise_reload` /
`finalize_layerwise_reload`, 0.34 `start_reload` / `finish_reload` (which also run vLLM's attention and module
hooks and set its `weight_update_active` flag).

Inside one update (the engine keeps to these):
- the model is not run between `begin_update` and `end_update` (modules not loaded yet sit on the meta device);
- each module is loaded once; a module whose weights arrive complete is processed in its bucket's call, copied
  back into its original storage (CUDA graphs stay valid);
- `end_update` runs even after a failed bucket: it puts the old tensors back into modules never loaded;
- no module stays partly loaded after its bucket (a padded vocabulary): vLLM would finish it at `end_update` from
  references to the bucket's tensors, which the sync frees or reuses (ZeRO-3 gathers) by then; `load_bucket`
  finishes it at once, as vLLM's finalize would.

See it work: tests/test_rollout_vllm.py (a model synced in 8+ buckets).
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch


def _worker_parts(worker):
    """(worker, model, vllm_config); in-process vLLM hands a WorkerWrapperBase that forwards to the Worker."""
    inner = getattr(worker, "worker", worker)
    return inner, inner.model_runner.get_model(), inner.vllm_config


def begin_update(worker) -> None:
    from vllm.config import set_current_vllm_config

    if os.environ.get("VLLM_RELOAD_MODE", "layerwise") == "direct":
        # 0.34's direct mode zeroes padded parameters whole and expects them sent again: a sync that leaves frozen
        # layers where they are (sync/plugin.py training_layers) would leave a padded embedding zeroed.
        raise RuntimeError("VLLM_RELOAD_MODE=direct: vLLM's direct reload expects every weight in every update, and a "
                           "sync sends only the layers that train; unset VLLM_RELOAD_MODE (layerwise, the default).")
    inner, model, vllm_config = _worker_parts(worker)
    _quiet_about_buffer_only_modules(model)
    loan = _lend_kv_cache(inner, model)
    try:
        with set_current_vllm_config(vllm_config):
            open_reload(model)
    except BaseException:
        loan.close()  # an update that fails to open returns the loan at once
        raise
    inner._verl_hf_update = loan  # returned by end_update


def open_reload(model: torch.nn.Module) -> None:
    """Open vLLM's layerwise reload over `model` (also the gloo transfer's worker side, vllm_transfer.py)."""
    from vllm.model_executor.model_loader import reload

    if hasattr(reload, "start_reload"):  # 0.34
        reload.start_reload(model)
    else:  # 0.32, 0.33
        reload.initialize_layerwise_reload(model)


def close_reload(model: torch.nn.Module, model_config, device) -> None:
    """Finalize vLLM's layerwise reload over `model` (`device`: where its weights live, as 0.34's finish takes)."""
    from vllm.model_executor.model_loader import reload

    if hasattr(reload, "finish_reload"):  # 0.34
        reload.finish_reload(model, model_config, torch.device(device))
    else:  # 0.32, 0.33
        reload.finalize_layerwise_reload(model, model_config)


def _lend_kv_cache(inner, model) -> contextlib.ExitStack:
    """0.34's worker lends an extensible KV cache's memory to a weight update (its reload_weights wraps the reload
    in `kv_cache_lent_for_weight_update`: on CUDA that cache is on by default without kv_cache_memory_bytes, and
    leaves too little free memory for the layerwise buffers otherwise); the same loan, held for the whole update.
    Nothing on 0.32/0.33."""
    stack = contextlib.ExitStack()
    try:
        from vllm.v1.worker.extensible_kv_cache import kv_cache_lent_for_weight_update
    except ImportError:
        return stack
    stack.enter_context(kv_cache_lent_for_weight_update(
        getattr(inner.model_runner, "extensible_kv_cache", None), model,
        reclaimable=getattr(inner, "_kv_cache_reclaimable", False), fail_if_short=True))
    return stack


def _mtp_check_off():
    """0.32/0.33 load each transfer chunk under this (MTP heads would check completeness per call); 0.34 dropped
    it (its start_reload sets weight_update_active instead)."""
    try:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check
    except ImportError:
        return contextlib.nullcontext()
    return disable_mtp_completeness_check()


def load_bucket(worker, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Load one bucket (HF checkpoint names) into the open update: `model.load_weights` only, no whole-model pass;
    then the modules it left partly loaded are finished at once (see process_partly_loaded)."""
    from vllm.config import set_current_vllm_config

    _, model, vllm_config = _worker_parts(worker)
    with set_current_vllm_config(vllm_config), _mtp_check_off():
        model.load_weights(iter(named_tensors))
        process_partly_loaded(model)


def process_partly_loaded(model: torch.nn.Module) -> list[str]:
    """Finish now the modules the bucket left partly loaded, as vLLM's finalize would later ("Delayed processing",
    layerwise.py): a vocabulary padded to vLLM's multiple of 64 is never loaded in full (embeddings, lm_head).
    Finalize would replay them from the bucket's tensors, which the sync frees or reuses (ZeRO-3 gathers) once
    the bucket is loaded; a bucket holds whole units, so no later bucket brings them more. Attention layers and
    0.34's deferred expert placements stay for finalize, as vLLM wants. Returns the modules finished."""
    from vllm.model_executor.model_loader.reload import layerwise

    done = []
    for name, module in model.named_modules():  # a Python walk, no tensor work
        info = layerwise.LAYERWISE_INFO.get(module)
        if (info is None or not info.can_load() or not 0 < info.load_numel < info.load_numel_total
                or layerwise.is_deferred_attention_layer(module) or getattr(info, "defer_processing", False)):
            continue
        layerwise._layerwise_process(module, info)
        layerwise.LOADING_LAYERS.discard(module)
        done.append(name)
    return done


class _BufferOnlyWarnings(logging.Filter):
    """vLLM's finalize warns "<Class>: Failed to load weights" for every module that got nothing, including those
    holding buffers only (RotaryEmbedding's cos/sin cache): they are computed from the config, are in no
    checkpoint, and vLLM rightly puts them back as they were. Those warnings, once per sync, would read as an
    error; warnings about modules with parameters still show. Keyed by class name, for this process: a class
    seen buffer-only in a served model is quiet in every model of the process."""

    def __init__(self):
        super().__init__()
        self.classes: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args and record.args[0] in self.classes)


_FILTER = _BufferOnlyWarnings()


def _quiet_about_buffer_only_modules(model: torch.nn.Module) -> None:
    _FILTER.classes |= {type(m).__name__ for m in model.modules()
                        if next(m.parameters(recurse=False), None) is None
                        and next(m.buffers(recurse=False), None) is not None}
    vllm_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if _FILTER not in vllm_logger.filters:
        vllm_logger.addFilter(_FILTER)


def end_update(worker) -> None:
    """Finalize the update once, then what vLLM's own reload_weights does after it (reset LoRA state, encoder and
    multimodal caches)."""
    from vllm.config import set_current_vllm_config

    inner, model, vllm_config = _worker_parts(worker)
    loan = getattr(inner, "_verl_hf_update", None) or contextlib.ExitStack()
    device = vllm_config.load_config.device or vllm_config.device_config.device  # 0.34's reload/inplace.py rule
    with loan, set_current_vllm_config(vllm_config):
        close_reload(model, vllm_config.model_config, device)
    inner._verl_hf_update = None
    runner = inner.model_runner
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
        if hasattr(runner, reset):
            getattr(runner, reset)()
