"""Roles: HF models with the verbs of the algorithm. `VerlTrainer` is one control loop over them; a custom
loop (examples/custom_loop_ppo.py) is another, and both run the same code.

    actor.generate_sequences(...)   critic.compute_values(seqs)   reward_model.score(seqs)
    ref_policy.kl_divergence(seqs)  actor.get_logprobs(seqs)      actor.update(loss)
"""

from .actor import Actor, EngineWeightsChanged, sequence_logprobs
from .critic import Critic, sequence_values
from .reference import ReferencePolicy
from .reward import RewardModel

__all__ = ["Actor", "EngineWeightsChanged", "Critic", "ReferencePolicy", "RewardModel", "sequence_logprobs", "sequence_values"]
