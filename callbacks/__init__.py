"""verl_hf's `TrainerCallback`s, importable as `verl_hf.callbacks` (setup.cfg maps this folder there).

progress.py     RLProgressCallback: progress bar and a table of the RL metrics
samples.py      CompletionSamplesCallback: prompts, completions, rewards, advantages to files and trackers
plots.py        RewardCurvePlotCallback: reward / KL / length / lambda curves as a PNG, refreshed live
clock.py        TrainingClockCallback: held-out accuracy against training seconds (evaluation excluded)
guards.py       KLGuardCallback (stop or roll back on KL blow-up or entropy collapse),
                RewardTargetStoppingCallback
checkpoints.py  BestRewardCheckpointCallback: keep the best checkpoint by an eval metric
reference.py    SyncRefModelCallback: move the KL reference towards the policy
hub.py          PushToHubCallback: publish the actor at intervals

Callbacks that need the trainer itself define `bind(trainer)`; VerlTrainer calls it.

See it work: tests/test_callbacks.py.
"""

from .checkpoints import BestRewardCheckpointCallback
from .clock import TrainingClockCallback
from .guards import KLGuardCallback, RewardTargetStoppingCallback
from .hub import PushToHubCallback
from .plots import RewardCurvePlotCallback
from .progress import RLProgressCallback
from .reference import SyncRefModelCallback
from .samples import CompletionSamplesCallback

__all__ = ["BestRewardCheckpointCallback", "CompletionSamplesCallback", "KLGuardCallback", "PushToHubCallback",
           "RLProgressCallback", "RewardCurvePlotCallback", "RewardTargetStoppingCallback", "SyncRefModelCallback",
           "TrainingClockCallback"]
