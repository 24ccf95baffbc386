"""A TRL GRPO script that runs on verl_hf with its import line changed.

It has the shape of TRL's GRPO quick start: a dataset with a `prompt` column, reward functions written to TRL's
contract, `GRPOConfig`, `GRPOTrainer`, `train()`. The one line marked `# TRL:` is the change; the lines marked
`# offline:` stand in for the Hub (these machines have no network: the model and the data ship with verl_hf).

Both of TRL's dataset formats: `conversational` (prompts are chat messages, so reward functions get each
completion as a message list) and `standard` (prompts are text, and completions strings). The reward functions
use what TRL gives them beside the completions: the dataset's `answer` column, `trainer_state`, `log_metric`
(a scalar in the logs) and `log_extra` (a column of the completion samples).

Run it: `python examples/from_trl/grpo_quickstart.py [conversational|standard] [max_steps]` (CPU, seconds).
See it work: tests/test_examples.py.
"""

import re
import sys

from datasets import Dataset

from verl_hf import VerlConfig as GRPOConfig, VerlTrainer as GRPOTrainer  # TRL: from trl import GRPOConfig, GRPOTrainer
from verl_hf.demo import TOOLS_WARM_START_DIR  # offline: a tiny chat model in place of a Hub id
from verl_hf.demo.tools_task import make_multiplication_dataset  # offline: a dataset in place of load_dataset


def make_dataset(dataset_format: str) -> Dataset:
    rows = make_multiplication_dataset(64, seed=0)  # prompt: [one user message], answer: the product as text
    if dataset_format == "standard":
        rows = rows.map(lambda row: {"prompt": row["prompt"][0]["content"]})
    return rows.select_columns(["prompt", "answer"])


def reward_len(completions, **kwargs):
    """Standard format: each completion is a string. Prefers answers of about 20 characters."""
    return [-abs(20 - len(completion)) / 20 for completion in completions]


def format_reward(completions, **kwargs):
    """Conversational format: each completion is [{"role": "assistant", "content": ...}]."""
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.search(r"\d", content) else 0.0 for content in contents]


def correct_product(completions, answer, trainer_state, log_metric, log_extra, **kwargs):
    """1.0 for a completion that contains the product, weighted up as training goes on (trainer_state)."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    correct = [float(expected in text) for text, expected in zip(texts, answer)]
    log_metric("correct_frac", sum(correct) / len(correct))
    log_extra("expected", list(answer))
    weight = 0.5 + 0.5 * trainer_state.global_step / max(trainer_state.max_steps, 1)
    return [weight * c for c in correct]


def main(dataset_format: str = "conversational", max_steps: int = 2, output_dir: str = "from-trl-output"):
    train_dataset = make_dataset(dataset_format)
    shape_reward = format_reward if dataset_format == "conversational" else reward_len
    training_args = GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=8, num_generations=4, max_completion_length=24,
        learning_rate=1e-6, beta=0.0, max_steps=max_steps, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=str(TOOLS_WARM_START_DIR),
        reward_funcs=[correct_product, shape_reward],
        args=training_args,
        train_dataset=train_dataset,
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["conversational"]), *(int(a) for a in sys.argv[2:3]))
