"""`PushToHubCallback`: publish the actor to the Hub every `every_n_steps` optimizer steps.

Each push is VerlTrainer.push_to_hub: the weights (or the PEFT adapter, or the merged model with
save_merged_model), the tokenizer, verl_config.json and a generated model card, in one commit named after
the step. The repository is `hub_model_id` from the training arguments.

See it work: tests/test_publish.py.
"""

from __future__ import annotations

from transformers import TrainerCallback


class PushToHubCallback(TrainerCallback):
    def __init__(self, every_n_steps: int = 100, blocking: bool = True):
        if every_n_steps < 1:
            raise ValueError(f"PushToHubCallback every_n_steps={every_n_steps} must be >= 1.")
        self.every_n_steps, self.blocking, self.trainer, self.pushed_steps = every_n_steps, blocking, None, []

    def bind(self, trainer) -> None:
        if not trainer.args.hub_model_id:
            raise ValueError("PushToHubCallback needs hub_model_id (e.g. 'your-name/my-grpo-model') in the training "
                             "arguments.")
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every_n_steps == 0:
            self.trainer.push_to_hub(commit_message=f"verl_hf: step {state.global_step}", blocking=self.blocking)
            self.pushed_steps.append(state.global_step)
