"""LoRA adapters in a vLLM engine, loaded from tensors in memory (vllm_lora='adapter'): the functions that run in
vLLM's worker, and the request that names an adapter version.

vLLM reads adapters from a folder (`LoRARequest.lora_path`); an RL sync has them in memory, so the worker builds
the adapter from the tensors with vLLM's own reader (`LoRAModel.from_lora_tensors`, after `PEFTHelper`'s
validation, as `from_local_checkpoint` does after reading the files) and adds it to its LoRA manager under a new
id: vLLM does not update a loaded adapter while requests use it (vLLM #20149; 0.32's `load_inplace` replaces it
under them), so each sync is a new version and the engine frees the old ones. A request then names the version;
vLLM finds it loaded. Its `lora_path` names no folder (IN_MEMORY): if vLLM ever dropped the version, loading it
again fails loudly (no such folder, or `read_adapter`'s error) instead of sampling from the base model.

Deviation from vLLM's public API: the worker's `model_runner.lora_manager._adapter_manager` is internal (vLLM
0.32); verl patches the same manager. Checked by tests/test_architectures.py on every vLLM we install.

See it work: tests/test_architectures.py (LoRA through colocated vLLM), tests/test_sync_adapter.py.
"""

from __future__ import annotations

import torch

IN_MEMORY = "/verl_hf/adapter-loaded-from-memory"  # not a folder: vLLM must never read an adapter from it


def adapter_name(version: int) -> str:
    return f"verl_hf_v{version}"


def latest_version(engine) -> int:
    """The adapter version an adapter-serving `engine` samples with; an error before the first (it would sample
    from the base model alone: the silent fallback of verl #3821 and ms-swift #9855)."""
    if not engine.adapter_version:
        raise RuntimeError(f"this {type(engine).__name__} serves a LoRA adapter (vllm_lora='adapter') and none is "
                           f"loaded yet: it would sample from the base model. Sync the weights first "
                           f"(Actor.sync_weights()).")
    return engine.adapter_version


def adapter_request(version: int):
    """The LoRARequest that samples with adapter `version` (loaded by `add_adapter_in_worker`)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=adapter_name(version), lora_int_id=version, lora_path=IN_MEMORY)


def _manager(worker):
    manager = getattr(worker.model_runner, "lora_manager", None)
    if manager is None:
        raise RuntimeError("this vLLM engine was started without LoRA (enable_lora); it cannot take an adapter.")
    return manager


def add_adapter_in_worker(worker, version: int, tensors: dict[str, torch.Tensor], config: dict) -> list[int]:
    """(runs in the vLLM worker) Add the adapter in `tensors` (PEFT names) with `config` (adapter_config.json
    fields) as id `version`; returns the ids loaded afterwards."""
    manager = _manager(worker)
    if not manager._adapter_manager.add_adapter(_lora_model(manager, version, tensors, config)):
        raise RuntimeError(f"vLLM already holds an adapter with id {version}: the new version would not be served.")
    return sorted(manager.list_adapters())


def _lora_model(manager, lora_id: int, tensors: dict[str, torch.Tensor], config: dict):
    """vLLM's LoRAModel of these tensors, validated as vLLM validates an adapter folder, modules checked."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    # vLLM folds the scaling into lora_B in place (LoRALayerWeights.optimize): in-process the tensors handed over
    # may be the training parameters themselves (measured: every sync doubled lora_B), so vLLM gets its own copy.
    tensors = {name: tensor.detach().clone() for name, tensor in tensors.items()}
    helper = PEFTHelper.from_dict(dict(config))
    helper.validate_legal(manager.lora_config)  # what vLLM checks when it reads an adapter folder
    model = manager._adapter_manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    lora = LoRAModel.from_lora_tensors(lora_id, tensors, helper, device="cpu", dtype=manager.lora_config.lora_dtype,
                                       model_vocab_size=manager.vocab_size,
                                       weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
                                       skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    unserved = _unserved(manager, lora.loras)
    if unserved or len(lora.loras) * 2 != len(tensors):
        raise ValueError(f"vLLM's {type(model).__name__} has no LoRA layer for {unserved[:3] or sorted(tensors)[:3]} "
                         f"({len(lora.loras)} of {len(tensors) // 2} adapted modules matched): vLLM would leave the "
                         f"adapter out there and sample those layers from the base weights. Set vllm_lora='merge' "
                         f"(or target other modules).")
    return lora


def _unserved(manager, names) -> list[str]:
    """The adapted modules (vLLM's names) that match none of vLLM's LoRA layers by their full name, a packed
    layer (qkv_proj) standing for its parts (q_proj, ...): vLLM skips such weights without a word."""
    adapters = manager._adapter_manager
    layers = set(adapters.modules)
    packed_as = {part: packed for packed, parts in adapters.packed_modules_mapping.items() for part in parts}

    def served(name: str) -> bool:
        prefix, _, leaf = name.rpartition(".")
        return name in layers or f"{prefix}.{packed_as.get(leaf, leaf)}".lstrip(".") in layers

    return sorted(name for name in names if not served(name))


def remove_adapter_in_worker(worker, version: int) -> list[int]:
    """(runs in the vLLM worker) Free adapter `version`; returns the ids still loaded."""
    manager = _manager(worker)
    manager.remove_adapter(version)
    return sorted(manager.list_adapters())


def loaded_adapters_in_worker(worker) -> list[int]:
    """(runs in the vLLM worker) The adapter ids loaded now."""
    return sorted(_manager(worker).list_adapters())


# ---------------------------------------------------------------- a vLLM server (rollout_engine='vllm_server')
# The adapter reaches the server's workers by HTTP (/collective_rpc takes strings: safetensors bytes in base64),
# waits there under its name, and vLLM's own /v1/load_lora_adapter then loads it under the id its API assigns
# (the requests name the adapter, and only the API maps names to ids): our vLLM plugin makes vLLM's folder reader
# take a waiting adapter for IN_MEMORY (`read_adapter`). Transport-agnostic (NCCL servers too); an adapter is
# megabytes, so the text encoding's cost is small next to a merged sync's gigabytes.
def encode_adapter(tensors: dict[str, torch.Tensor]) -> str:
    import base64

    from safetensors.torch import save

    return base64.b64encode(save({n: t.contiguous() for n, t in tensors.items()})).decode("ascii")


def decode_adapter(payload: str) -> dict[str, torch.Tensor]:
    import base64

    from safetensors.torch import load

    return load(base64.b64decode(payload))


def wait_adapter_in_worker(worker, name: str, payload: str, config_json: str) -> str:
    """(runs in the server's workers: `verl_hf_wait_adapter`) Keep the adapter for vLLM to read under `name` until
    the trainer frees it."""
    import json

    _manager(worker).__dict__.setdefault("_verl_hf_waiting", {})[name] = (decode_adapter(payload), json.loads(config_json))
    return name


def free_adapter_in_worker(worker, name: str) -> list[int]:
    """(runs in the server's workers: `verl_hf_free_adapter`) Free the adapter `name`, loaded or still waiting
    (a load that failed); the ids left."""
    manager = _manager(worker)
    manager.__dict__.get("_verl_hf_waiting", {}).pop(name, None)
    lora_id = manager.__dict__.setdefault("_verl_hf_ids", {}).pop(name, None)
    if lora_id is not None:
        manager.remove_adapter(lora_id)
    return sorted(manager.list_adapters())


def read_adapter(manager, lora_request, read_folder):
    """vLLM's `WorkerLoRAManager._load_adapter`, which our plugin wraps: an IN_MEMORY request takes the adapter
    waiting under its name (`wait_adapter_in_worker`), any other reads its folder as before (`read_folder`)."""
    if lora_request.lora_path != IN_MEMORY:
        return read_folder(manager, lora_request)
    waiting = manager.__dict__.get("_verl_hf_waiting", {})
    if lora_request.lora_name not in waiting:
        raise RuntimeError(f"vLLM was asked for the in-memory adapter {lora_request.lora_name!r}, which never arrived "
                           f"or was freed; the trainer sends each version before it names it.")
    # kept until the trainer frees the version (free_adapter_in_worker): vLLM may evict a loaded adapter from its
    # slots and read it again while requests still name it
    tensors, config = waiting[lora_request.lora_name]
    manager.__dict__.setdefault("_verl_hf_ids", {})[lora_request.lora_name] = lora_request.lora_int_id
    return _lora_model(manager, lora_request.lora_int_id, tensors, config)


def install_in_worker_manager() -> None:
    """(our vLLM plugin, every vLLM process) vLLM's adapter reader takes waiting in-memory adapters too."""
    import functools

    from vllm.lora.worker_manager import WorkerLoRAManager

    read_folder = WorkerLoRAManager._load_adapter
    if getattr(read_folder, "verl_hf", False):
        return
    wrapped = functools.wraps(read_folder)(lambda self, request: read_adapter(self, request, read_folder))
    wrapped.verl_hf = True
    WorkerLoRAManager._load_adapter = wrapped
