"""One training run for tests/test_checkpoint_files.py: `python save_fault_run.py OUT FAULT [resume]`.

It saves a checkpoint after every step (3 steps). From the second save on, FAULT strikes:
- `kill_at_write_<k>`: SIGKILL (kill -9) at the k-th `torch.save` of that save (optimizer, scheduler, RL
  round file, RNG state, in the Trainer's order);
- `kill_before_rename`: SIGKILL once every file and the completion marker are written, before the rename;
- `file_size_limit`: the process may not write files past 64 kB (RLIMIT_FSIZE), so the write fails (EFBIG);
- `none`: no fault.
With `resume`, it resumes with resume_from_checkpoint=True. Prints RESUMED_FROM=<path> when it resumes."""

import os
import resource
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import small_config  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from verl_hf import VerlTrainer, saving  # noqa: E402
from verl_hf.demo import WARM_START_DIR  # noqa: E402
from verl_hf.demo.task import demo_splits  # noqa: E402


class Armed(TrainerCallback):
    """Turns FAULT on once the first checkpoint is in place (at the end of step 2, before its save)."""

    def __init__(self, fault: str):
        self.fault = fault

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != 2 or self.fault == "none":
            return
        if self.fault.startswith("kill_at_write_"):
            target, calls, original = int(self.fault.rsplit("_", 1)[1]), [0], torch.save

            def save(*a, **kw):
                calls[0] += 1
                if calls[0] == target:
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(*a, **kw)

            torch.save = save
        elif self.fault == "kill_before_rename":
            saving.publish = lambda staged, final: os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault == "file_size_limit":
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def main(out: str, fault: str, resume: bool) -> None:
    train, _, _ = demo_splits(seed=0, num_train=200, num_test=10, num_dev=10)
    args = small_config(Path(out), max_steps=3, save_strategy="steps", save_steps=1, per_device_train_batch_size=8)
    trainer = VerlTrainer(model=str(WARM_START_DIR), args=args, train_dataset=train.remove_columns("completion"),
                          callbacks=[Armed(fault)])
    if resume:
        print("RESUMED_FROM=" + str(saving.resolve_resume(True, args.output_dir)), flush=True)
    trainer.train(resume_from_checkpoint=True if resume else None)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "resume")
