"""Rollout engines behind one interface (`RolloutEngine`): `make_engine(name, ...)` builds one by name."""

from .base import Rollout, RolloutEngine, SamplingConfig
from .hf import HFGenerateEngine

__all__ = ["HFGenerateEngine", "Rollout", "RolloutEngine", "SamplingConfig"]
