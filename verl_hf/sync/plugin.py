"""`WeightSync`: the training model's current weights into the rollout engine, in bounded memory.

names (names.py) -> gather in buckets (gather.py) -> push in the engine's dtype (push.py). Configured from
`VerlConfig` (`sync_bucket_mb`, `sync_verify`); every sync returns its metrics: seconds, bytes, GB/s and the
measured peak extra memory. Under ZeRO-3 every rank takes part in each bucket's all-gather (a collective);
only ranks that own an engine push, and with one shared engine every rank learns (one all-reduce) whether
the push succeeded before anyone samples.

See it work: tests/test_sync.py, tests/test_distributed.py, benchmarks/sync.py.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING

import torch

from ..distributed import compute_device, full_tensor, process_rank
from .adapter import adapted_modules, adapter_tensors, check_only_the_adapter_trains
from .gather import bucket_tensors, engine_names, gathered, plan_buckets, training_layers, unit_tensors, weight_units
from .memory import PeakMemory
from .names import check_names
from .push import mismatched_weights, push_bucket

if TYPE_CHECKING:
    from ..rollout.base import RolloutEngine


def _shared_failure(failure: Exception | None, owner_rank: int) -> Exception | None:
    """Every process learns whether the owner's push failed: one small all-reduce, which also waits for it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return failure
    flag = torch.tensor([1.0 if failure is not None else 0.0])
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag)
    if failure is None and flag.item() > 0:
        return RuntimeError(f"process {owner_rank} failed to push the weights into the shared rollout engine; its "
                            f"log has the cause.")
    return failure


class WeightSync:
    """`owner_rank=None`: every process owns an engine (colocated engines) and receives full tensors;
    `owner_rank=r`: only process r does (e.g. one engine server): ZeRO-3 partitions are gathered to it alone,
    and the other processes only send their shards. `adapter_config` (an engine that `serves_adapters`; the
    fields of sync/adapter.py's `vllm_adapter_config`): the first sync pushes the base weights, unmerged, and
    every sync the LoRA adapter alone. After a first full push, a sync sends an engine that `keeps_weights` only
    the layers that train now or trained at the last sync (no optimizer step changes the others). Holds: whether
    the names were checked and the base pushed, the engine that last received every weight and the layers that
    trained then."""

    def __init__(self, bucket_mb: float = 256.0, verify: bool = False, owner_rank: int | None = None,
                 adapter_config: dict | None = None):
        if bucket_mb <= 0:
            raise ValueError(f"sync_bucket_mb must be > 0, got {bucket_mb}.")
        self.bucket_bytes, self.verify, self.owner_rank = int(bucket_mb * 2**20), verify, owner_rank
        self.adapter_config = adapter_config
        self._names_checked = self._base_pushed = False
        self._adapter_syncs = 0  # successful adapter pushes: the version a shared engine serves
        # The engine that received every weight and keeps them (a weak reference: an engine replaced in the Actor
        # is freed), and the layers that trained at the last sync.
        self._filled, self._trained = (lambda: None), frozenset()

    @property
    def owns_engine(self) -> bool:
        return self.owner_rank is None or self.owner_rank == process_rank()

    @classmethod
    def for_engine(cls, engine: RolloutEngine, **kwargs) -> "WeightSync":
        """An engine shared by all processes (`shared_by_processes`, e.g. one server) is fed by process 0 alone;
        the others only take part in the ZeRO-3 gathers. Otherwise every process feeds its own engine."""
        return cls(owner_rank=0 if engine.shared_by_processes else None, **kwargs)

    def sync(self, model: torch.nn.Module, engine: RolloutEngine) -> dict[str, float]:
        """Push every weight of `model` into `engine` (an adapter-serving engine: the base once, then the adapter);
        returns `sync/*` metrics."""
        units = weight_units(model)
        whole = self.adapter_config is None or not self._base_pushed
        if self.adapter_config is not None and whole:
            check_only_the_adapter_trains(model, units)
        # Skipping frozen layers needs an engine that kept the full push (vLLM's sleep level 2 drops its weights).
        changed, trained = training_layers(units, self._trained)
        if self._filled() is not engine or not engine.keeps_weights:
            changed = units
        buckets, self.bucket_bytes = plan_buckets(changed, self.bucket_bytes) if whole else ([], self.bucket_bytes)
        device = compute_device(model)
        started = time.perf_counter()
        with PeakMemory(device) as peak:
            pushed, failure = self._push_all(units, buckets, device, engine)
        if self.owner_rank is not None:
            # The others sample from the same engine next: not before it holds the new weights, and every
            # process learns whether it does.
            failure = _shared_failure(failure, self.owner_rank)
        if failure is not None:
            raise failure
        seconds = time.perf_counter() - started
        self._filled, self._trained = weakref.ref(engine), trained
        metrics = {"sync/seconds": seconds, "sync/gigabytes": pushed / 1e9, "sync/gb_per_s": pushed / 1e9 / max(seconds, 1e-9),
                   "sync/buckets": float(len(buckets)),
                   "sync/tensors": float(len(engine_names([u for bucket in buckets for u in bucket])))}
        if self.adapter_config is not None:
            self._base_pushed, self._adapter_syncs = True, self._adapter_syncs + 1
            if not self.owns_engine:  # one shared engine: its owner loaded this version (one per successful sync)
                engine.adapter_version = self._adapter_syncs
            # what this sync gathered of the base: every weight on the first sync, never after it
            metrics["sync/base_tensors"] = float(len(engine_names(units)) if whole else 0)
            metrics["sync/adapter_version"] = float(engine.adapter_version)
        if peak.extra_bytes is not None:
            metrics["sync/peak_extra_mb"] = peak.extra_bytes / 2**20
        if self.verify:  # every weight, also the frozen layers this sync left as they were; an adapter-serving
            # engine's base is checked when it is pushed (its weights are the unmerged base, not the merged model)
            self.check(model, engine, buckets if self.adapter_config is not None else None)
        return metrics

    def _push_all(self, units, buckets, device, engine) -> tuple[int, Exception | None]:
        """(bytes pushed, the exception that stopped the pushing). A failed push must not leave the other
        processes waiting in the next gather: the owner keeps joining every gather and reports at the end."""
        pushed, failure = 0, None
        if buckets:  # an adapter-only sync leaves the base and its cached KV alone: the new version has its own
            pushed, failure = self._push_buckets(units, buckets, device, engine)
        if self.adapter_config is not None:  # after finish_sync: vLLM drops its adapters when base weights change
            adapter_bytes, failure = self._push_adapter(units, engine, failure)
            pushed += adapter_bytes
        return pushed, failure

    def _push_buckets(self, units, buckets, device, engine) -> tuple[int, Exception | None]:
        """(bytes pushed, the first failure): the weights in buckets, between the engine's prepare_for_weights
        and finish_sync."""
        pushed, failure = 0, None
        try:
            if self.owns_engine:
                if not self._names_checked:
                    check_names(engine_names(units), set(engine.weight_names()))
                    self._names_checked = True
                engine.prepare_for_weights()
        except Exception as exc:  # noqa: BLE001 - raised by sync() after the collectives
            failure = exc
        merge_lora = self.adapter_config is None  # an engine that serves the adapter gets the base unmerged
        for bucket in buckets:
            with bucket_tensors(bucket, device, dst=self.owner_rank, merge_lora=merge_lora) as tensors:
                if self.owns_engine and failure is None:
                    try:
                        pushed += push_bucket(engine, tensors)
                    except Exception as exc:  # noqa: BLE001
                        failure = exc
        if self.owns_engine and failure is None:
            try:
                engine.finish_sync()
            except Exception as exc:  # noqa: BLE001
                failure = exc
        return pushed, failure

    def _push_adapter(self, units, engine, failure: Exception | None) -> tuple[int, Exception | None]:
        """(bytes pushed, the first failure): the LoRA adapter's tensors into the engine as a new version. Every
        process joins the gathers (ZeRO-3, FSDP2), also after a failure, as in `_push_all`."""
        with adapter_tensors(units, dst=self.owner_rank) as tensors:
            if not self.owns_engine or failure is not None:
                return 0, failure
            dtype = engine.dtype
            cast = {n: t.to(dtype) if dtype is not None and t.dtype != dtype else t for n, t in tensors.items()}
            config = {**self.adapter_config, "target_modules": adapted_modules(units)}  # as wrapped, not as written
            try:
                engine.load_adapter(cast, config)
            except Exception as exc:  # noqa: BLE001 - raised by sync() after the collectives
                return 0, exc
            return sum(t.numel() * t.element_size() for t in cast.values()), None

    def check(self, model: torch.nn.Module, engine: RolloutEngine, buckets=None) -> None:
        """Compare the engine's weights with the training weights gathered by DeepSpeed's own
        GatheredParameters or DTensor's `full_tensor()` (independent of the sync's gather), bitwise; raise on any
        difference."""
        if buckets is None:
            buckets, _ = plan_buckets(weight_units(model), self.bucket_bytes)
        bad = []
        for bucket in buckets:
            with gathered(bucket):
                # full_tensor() is a collective: every process gathers, the engine's owner compares
                pairs = [(name, full_tensor(t)) for unit in bucket for name, t in unit_tensors(unit)]
                if self.owns_engine:
                    bad += mismatched_weights(engine, pairs)
        if bad:
            raise RuntimeError(f"sync_verify: after the sync the engine's {bad[0]!r} differs from the training weight "
                               f"({len(bad)} weights differ). The rollout would sample from other weights than the "
                               f"ones being trained; please report this with your model and launcher settings.")
