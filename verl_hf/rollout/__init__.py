"""Rollout engines behind one contract (`RolloutEngine`, base.py); `make_rollout_engine` builds the one a
`VerlConfig` asks for."""

from .base import Rollout, RolloutEngine, SamplingConfig
from .factory import eos_token_ids, make_rollout_engine
from .hf import HFCopyEngine, HFGenerateEngine, HFSharedEngine

__all__ = ["HFCopyEngine", "HFGenerateEngine", "HFSharedEngine", "Rollout", "RolloutEngine", "SamplingConfig",
           "eos_token_ids", "make_rollout_engine"]
