"""The weight-sync plugin: training weights (any wrapping, ZeRO-3 shards, LoRA) into the rollout engine.

Three layers, one file each: names.py (name mapping), gather.py (bucketed gathering, LoRA merge),
push.py (cast and hand over); plugin.py ties them together with metrics and verification.
"""

from .gather import plan_buckets, weight_units
from .memory import PeakMemory
from .names import engine_name
from .plugin import WeightSync

__all__ = ["PeakMemory", "WeightSync", "engine_name", "plan_buckets", "weight_units"]
