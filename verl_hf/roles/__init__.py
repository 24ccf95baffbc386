"""Roles: HF models with the verbs of the algorithm. `VerlTrainer` is one control loop over them."""

from .actor import Actor, sequence_logprobs
from .reference import ReferencePolicy

__all__ = ["Actor", "ReferencePolicy", "sequence_logprobs"]
