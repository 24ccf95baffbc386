"""One training run for tests/test_resume.py: `python resume_run.py OUT KIND KILL_AT_STEP [CHECKPOINT]`.

With KILL_AT_STEP > 0 the process sends itself SIGKILL (kill -9: no cleanup, no final save) at the end of that
step; with CHECKPOINT it resumes from it. Writes OUT/logs.json: every training log entry."""

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import small_config  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from verl_hf import VerlTrainer  # noqa: E402
from verl_hf.demo import TOOLS_WARM_START_DIR, WARM_START_DIR  # noqa: E402
from verl_hf.demo.task import demo_splits  # noqa: E402
from verl_hf.demo.tools_task import tools_splits  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KINDS = {
    # PPO-Lagrangian: rounds of 4 optimizer steps (64 samples, 2 mini-batches x 2 epochs), a reward critic and a
    # cost critic, KL in the reward with an adaptive controller, the Lagrange multiplier.
    "ppo_lagrangian": dict(adv_estimator="gae", num_generations=1, generation_batch_size=64, ppo_epochs=2,
                           kl_coef=0.02, use_kl_in_reward=True, kl_controller="adaptive", critic_learning_rate=1e-3,
                           cost_funcs=[f"{REPO}/examples/safe_rlhf/task.py:forbidden_digit"], cost_limit=0.05),
    # GRPO with DAPO's dynamic sampling: rounds of 2 steps and a refill stream of prompts.
    "grpo_dynamic": dict(generation_batch_size=64, dynamic_sampling=True),
    # Multi-turn GRPO with the tool demo's model, task and tool: rounds of 4 steps of whole conversations.
    # Asynchronous GRPO (one step off-policy) with the vLLM server at $VERL_HF_TEST_SERVER.
    "async": dict(rollout_engine="vllm_server", vllm_server_url=os.environ.get("VERL_HF_TEST_SERVER"), max_staleness=1,
                  rollout_is="token"),
    "multi_turn": dict(per_device_train_batch_size=8, generation_batch_size=32, tools=["verl_hf.demo.tools_task:multiply"], max_turns=3,
                       max_turn_length=40, max_prompt_length=48, max_response_length=96),
}


class KillAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(out: str, kind: str, kill_at: int, checkpoint: str | None) -> None:
    if kind == "multi_turn":
        model, (train, _, _) = TOOLS_WARM_START_DIR, tools_splits(seed=0, num_train=1000, num_test=10, num_dev=10)
    else:
        model, (train, _, _) = WARM_START_DIR, demo_splits(seed=0, num_train=2000, num_test=10, num_dev=10)
        train = train.remove_columns("completion")
    args = small_config(Path(out), max_steps=8, save_strategy="steps", save_steps=3, **KINDS[kind])
    trainer = VerlTrainer(model=str(model), args=args, train_dataset=train, callbacks=[KillAt(kill_at)])
    trainer.train(resume_from_checkpoint=checkpoint)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    Path(out, "logs.json").write_text(json.dumps(logs))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
