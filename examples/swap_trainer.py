"""From supervised fine-tuning to RL by changing three names.

This is an ordinary `transformers.Trainer` script. The lines marked `# RL:` are the whole change:
`Trainer` -> `VerlTrainer`, `TrainingArguments` -> `VerlConfig`, and `reward_funcs=`. The model, the
dataset, the callbacks and every TrainingArguments field stay as they were; the RL fields keep their
defaults (8 responses per prompt, GRPO, PPO-clip loss).

Run it: `python examples/swap_trainer.py` (CPU, about a minute; uses the shipped tiny model).
See it work: tests/test_examples.py.
"""

import sys

from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from verl_hf import VerlConfig, VerlTrainer  # RL: was `from transformers import Trainer, TrainingArguments`
from verl_hf.demo import WARM_START_DIR
from verl_hf.demo.task import make_addition_dataset


def correct_sum(prompts, completions, completion_ids, answer, **columns):
    """1.0 when the completion ends with '#### <the right sum>', else 0.0."""
    return [float(c.strip() == f"#### {a}") for c, a in zip(completions, answer)]


class PrintLoss(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        print(f"step {state.global_step}: {({k: round(v, 3) for k, v in logs.items() if isinstance(v, float)})}")


def main(max_steps: int = 60, output_dir: str = "swap-trainer-output"):
    model = AutoModelForCausalLM.from_pretrained(WARM_START_DIR)
    tokenizer = AutoTokenizer.from_pretrained(WARM_START_DIR)
    train_dataset = make_addition_dataset(2000, seed=0)
    args = VerlConfig(  # RL: was TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=64, learning_rate=1e-4, max_steps=max_steps,
        logging_steps=20, save_strategy="no", report_to="none", use_cpu=True,
    )
    trainer = VerlTrainer(  # RL: was Trainer(
        model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer, callbacks=[PrintLoss()],
        reward_funcs=[correct_sum],  # RL: what to reward
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
