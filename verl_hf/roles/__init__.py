"""Roles: HF models with the verbs of the algorithm. `VerlTrainer` is one control loop over them; a custom
loop (examples/custom_loop_ppo.py) is another, and both run the same code.

    actor.generate_sequences(...)   critic.compute_values(seqs)   reward_model.score(seqs)
    ref_policy.kl_divergence(seqs)  actor.get_logprobs(seqs)      actor.update(loss)
    teacher.get_logprobs(seqs)      served_teacher.score(seqs)
"""

from .actor import Actor, EngineWeightsChanged, sequence_logprobs
from .critic import Critic, sequence_values
from .reference import ReferencePolicy
from .reward import RewardModel
from .served_teacher import ServedTeacher
from .teacher import TeacherPolicy

__all__ = ["Actor", "EngineWeightsChanged", "Critic", "ReferencePolicy", "RewardModel", "ServedTeacher", "TeacherPolicy",
           "sequence_logprobs", "sequence_values"]
