"""Layer 3 of the weight sync: hand a gathered bucket to the rollout engine, in the engine's dtype.

The engine copies what it receives (into its own weights, or over a transport); the cast copies made here
live for one bucket only.

See it work: tests/test_sync.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..rollout.base import RolloutEngine


def push_bucket(engine: RolloutEngine, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
    """Load one bucket into `engine`; returns the bytes handed over."""
    dtype = engine.dtype  # None: the training dtype
    cast = [(n, t.to(dtype) if dtype is not None and t.dtype != dtype else t) for n, t in named_tensors]
    engine.load_weights(cast)
    return sum(t.numel() * t.element_size() for _, t in cast)


def mismatched_weights(engine: RolloutEngine, named_tensors: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Names whose engine weight differs (bitwise, after the same cast) from the training tensor."""
    dtype = engine.dtype
    current = engine.get_weights([n for n, _ in named_tensors])
    bad = []
    for name, tensor in named_tensors:
        expected = tensor.to(dtype) if dtype is not None else tensor
        if not torch.equal(current[name].to(expected.device), expected):
            bad.append(name)
    return bad
