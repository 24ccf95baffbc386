"""`RLCheckpoint`: the RL state a checkpoint carries beside the Trainer's own, saved and loaded by name.

The Trainer saves weights, optimizer, scheduler, RNG and data position. This object adds, in the same
folder:
- `rl_checkpoint.json`: the format version (a newer layout than this version reads is refused with the fix;
  the first layout, without this file, is converted as it loads);
- `critic/`, and with Safe-RLHF `safety.json` and `cost_critic/` (the constraint saves its own);
- `kl_controller.json`: the KL controller;
- `reference.safetensors`: a KL reference that SyncRefModelCallback moved;
- `rl_round_<rank>.pt` per process: the named per-process state (round in progress, refill stream, seeds,
  unlogged metrics, KL meter), so a run killed inside a round resumes exactly.
Per-process files are loaded by all processes or by none (a mix would enter different collectives).

See it work: tests/test_resume.py, tests/test_checkpoint.py.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace

import torch

from .algorithms import LossNorm
from .settings import Settings

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 1: the layout before the version file (flat round files, converted when read)
VERSION_FILE = "rl_checkpoint.json"
CRITIC_DIR = "critic"
KL_CTRL_FILE = "kl_controller.json"
ROUND_FILE = "rl_round_{}.pt"
REFERENCE_FILE = "reference.safetensors"


@dataclass(frozen=True)
class CheckpointSettings(Settings):
    """Where this process sits (its files are its own) and, for checkpoints of format version 1, the loss
    normaliser's settings."""
    process_index: int
    world_size: int
    should_save: bool
    device: torch.device
    loss_agg_mode: str
    max_response_length: int


class RLCheckpoint:
    """Holds: references to the stateful parts of a run: `per_process` (name -> object with state_dict /
    load_state_dict, one file per rank), the critic, the constraint, the KL controller and the reference."""

    def __init__(self, settings: CheckpointSettings, *, per_process: dict, critic=None, constraint=None,
                 kl_controller=None, ref_policy=None, reduce_sum=lambda t: t):
        self.settings, self.per_process, self.critic, self.constraint = settings, per_process, critic, constraint
        self.kl_controller, self.ref_policy, self.reduce_sum = kl_controller, ref_policy, reduce_sum

    def save(self, output_dir: str) -> None:
        os.makedirs(output_dir, exist_ok=True)  # the main process may not have created it yet
        main = self.settings.should_save
        state = {name: part.state_dict() for name, part in self.per_process.items()}
        torch.save({"format_version": FORMAT_VERSION, "world_size": self.settings.world_size, "parts": state},
                   os.path.join(output_dir, ROUND_FILE.format(self.settings.process_index)))
        if main:
            with open(os.path.join(output_dir, VERSION_FILE), "w") as f:
                json.dump({"format_version": FORMAT_VERSION}, f)
            with open(os.path.join(output_dir, KL_CTRL_FILE), "w") as f:
                json.dump({"controller": self.kl_controller.state_dict()}, f)  # its pending KL: per process
        if main and self.ref_policy is not None and self.ref_policy.moved:
            from safetensors.torch import save_model

            save_model(self.ref_policy.model, os.path.join(output_dir, REFERENCE_FILE))
        if self.critic is not None:
            self.critic.save_checkpoint(os.path.join(output_dir, CRITIC_DIR), main_process=main)
        self.constraint.save(output_dir, main)

    def load(self, checkpoint: str, with_round: bool = True) -> None:
        """Everything saved in `checkpoint`; `with_round=False` (a rollback) keeps the per-process state out."""
        check_version(checkpoint)
        if with_round:
            self.load_per_process(checkpoint)
        if self.ref_policy is not None and os.path.exists(os.path.join(checkpoint, REFERENCE_FILE)):
            from safetensors.torch import load_model

            load_model(self.ref_policy.model, os.path.join(checkpoint, REFERENCE_FILE))
            self.ref_policy.moved = True
        if os.path.exists(os.path.join(checkpoint, KL_CTRL_FILE)):
            with open(os.path.join(checkpoint, KL_CTRL_FILE)) as f:
                saved = json.load(f)
            self.kl_controller.load_state_dict(saved["controller"])
            if "pending" in saved and "kl_meter" in self.per_process:  # the oldest layout kept it here
                self.per_process["kl_meter"].load_state_dict({"pending": saved["pending"]})
        self.constraint.load(checkpoint)
        if self.critic is not None:
            critic_dir = os.path.join(checkpoint, CRITIC_DIR)
            if not os.path.isdir(critic_dir):
                raise FileNotFoundError(f"{checkpoint} has no {CRITIC_DIR}/ folder: it was not saved by a PPO run.")
            self.critic.load_checkpoint(critic_dir)

    def load_per_process(self, checkpoint: str) -> bool:
        """Every process continues its saved state, or (no file: a checkpoint from before round files) all start
        a fresh round together. Returns whether the state was loaded."""
        path = os.path.join(checkpoint, ROUND_FILE.format(self.settings.process_index))
        saved = self._read_round_file(path) if os.path.exists(path) else None
        if saved is not None and saved["world_size"] != self.settings.world_size:
            raise ValueError(f"{checkpoint} was saved by {saved['world_size']} processes and holds their rollout "
                             f"rounds; resume it with {saved['world_size']} processes (or delete its rl_round_*.pt "
                             f"files to start a fresh round).")
        everyone = torch.tensor([0.0 if saved is None else 1.0], device=self.settings.device)
        if self.settings.world_size > 1:
            everyone = self.reduce_sum(everyone)
        if everyone.item() < self.settings.world_size:
            return False
        for name, part in self.per_process.items():
            if name in saved["parts"]:  # a part newer than the checkpoint starts fresh
                part.load_state_dict(saved["parts"][name])
        return True

    def _read_round_file(self, path: str) -> dict:
        saved = torch.load(path, weights_only=False)  # our own file: it holds RolloutBatch objects
        if "parts" not in saved:
            logger.warning(f"{path}: a round saved in format version 1 resumes with this version's math; the "
                           f"defaults changed to verl 0.9.1's (CHANGELOG: singleton groups, seq-mean counts, sapo, "
                           f"geo_mean), so set their options to continue it exactly as it started.")
            return {"world_size": saved["world_size"], "parts": self._first_layout_parts(saved)}
        if saved.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:  # a node that saw no version file
            raise ValueError(f"{path} is in RL format version {saved['format_version']}, newer than this verl_hf "
                             f"reads ({FORMAT_VERSION}); resume it with the verl_hf version that wrote it.")
        return saved

    def _first_layout_parts(self, saved: dict) -> dict:
        """Format version 1 kept flat keys, and each micro-batch its step's normaliser as two loose numbers
        (`step_num_tokens`, `step_num_seqs`, every row counted): they become the LossNorm the run trained with."""
        s, converted = self.settings, {}

        def upgraded(mb):  # ppo_epochs repeats the same objects: each is converted once, and stays shared
            if id(mb) not in converted:
                loose = mb.__dict__
                norm = LossNorm(s.loss_agg_mode, num_tokens=loose.get("step_num_tokens"),
                                num_seqs=loose.get("step_num_seqs"), constant=s.max_response_length,
                                count_empty_rows=True)
                converted[id(mb)] = replace(mb, loss_norm=norm)
            return converted[id(mb)]

        last = saved.get("last_round")
        return {"round": {"micro_batches": [upgraded(mb) for mb in saved.get("round") or []],
                          "micro_step": saved["micro_step"], "size": saved.get("round_size"),
                          "last_round": replace(last) if last is not None else None},
                "refill": {"order": saved.get("refill_order") or []},
                "seeds": {"calls": saved.get("rollout_calls") or {}},
                "metrics": {"values": saved.get("metrics") or {}},
                "kl_meter": {"pending": saved.get("kl_seen")}}


def check_version(checkpoint: str) -> int:
    """The checkpoint's RL format version (1 when it has no version file); a newer one is refused."""
    path = os.path.join(checkpoint, VERSION_FILE)
    if not os.path.exists(path):
        return 1
    with open(path) as f:
        version = json.load(f).get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"{checkpoint} holds RL state in format version {version!r}, newer than this verl_hf "
                         f"reads ({FORMAT_VERSION}); resume it with the verl_hf version that wrote it (or upgrade).")
    return version
