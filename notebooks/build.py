"""Writes the notebooks from the cells below (outputs are produced by running them: `make test` executes both).

    python notebooks/build.py
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

QUICKSTART = [
    ("md", """# verl_hf quick start: swap the Trainer, train with GRPO

A supervised fine-tuning script with `transformers.Trainer` becomes online RL by swapping two names:
`TrainingArguments` -> `VerlConfig` and `Trainer` -> `VerlTrainer`, and adding a reward. This notebook trains
the shipped tiny model (0.5M parameters, a character tokenizer) on two-digit addition, on CPU, in about a
minute."""),
    ("code", """import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")   # everything here is local: no downloads

from verl_hf import VerlConfig, VerlTrainer      # was: from transformers import Trainer, TrainingArguments
from verl_hf.demo import WARM_START_DIR
from verl_hf.demo.task import demo_splits

train, _, test = demo_splits(seed=0, num_train=2000, num_test=200)
train[0]"""),
    ("md", """The prompts are plain text; every other column (here `answer`) reaches the reward functions. The
built-in `gsm8k` reward reads the number after `#### ` and compares it with `answer`."""),
    ("code", """args = VerlConfig(
    output_dir="quickstart-output", use_cpu=True, report_to="none", seed=0,
    per_device_train_batch_size=128, num_generations=4,     # 32 prompts x 4 answers per step
    max_prompt_length=32, max_response_length=12,
    learning_rate=1e-4, lr_scheduler_type="constant", max_steps=60, logging_steps=10,
    reward_funcs=["gsm8k", "gsm8k_format"], reward_weights=[1.0, 0.1],
    per_device_eval_batch_size=200, disable_tqdm=True,
)
trainer = VerlTrainer(model=str(WARM_START_DIR), args=args, train_dataset=train, eval_dataset=test)
before = trainer.evaluate()["eval_accuracy"]
trainer.train()
after = trainer.evaluate()["eval_accuracy"]
print(f"held-out accuracy {before:.3f} -> {after:.3f}")"""),
    ("code", """import matplotlib.pyplot as plt

logs = [h for h in trainer.state.log_history if "reward/mean" in h]
plt.plot([h["step"] for h in logs], [h["reward/mean"] for h in logs], marker="o")
plt.xlabel("optimizer step"); plt.ylabel("mean training reward"); plt.title("GRPO on the demo task")
plt.show()"""),
    ("md", """Next: `verl_hf.callbacks` (completion samples, live curves, KL guard, best checkpoint, Hub pushes),
`rollout_engine="vllm"` for fast sampling, `accelerate launch` with DeepSpeed for several GPUs, and the
algorithm recipes in `examples/configs/`."""),
]

ANATOMY = [
    ("md", """# Anatomy of one RL step

One GRPO step by hand over verl_hf's roles, with every tensor shown: sample, score, group advantages,
log-probs, reference KL, the clipped policy loss, the update. `VerlTrainer.training_step` runs the same calls.
Four prompts, three answers each, on the shipped tiny model."""),
    ("code", """import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
torch.manual_seed(0)
torch.set_printoptions(precision=3, linewidth=120, sci_mode=False)

from verl_hf import Actor, ReferencePolicy
from verl_hf.algorithms import agg_loss, grpo_advantages, kl_penalty, place_outcome_rewards, ppo_clip_loss
from verl_hf.demo import WARM_START_DIR
from verl_hf.rewards import resolve_reward_funcs, score_completions

actor = Actor.from_pretrained(WARM_START_DIR, learning_rate=1e-4)
reference = ReferencePolicy.from_actor(actor.model)
prompts = ["What is 12 plus 30?\\n", "What is 45 plus 19?\\n", "What is 70 plus 21?\\n", "What is 33 plus 66?\\n"]
answers = ["42", "64", "91", "99"]"""),
    ("md", "## 1. Sample: three responses per prompt"),
    ("code", """seqs = actor.generate_sequences(prompts, max_new_tokens=12, num_return_sequences=3, seed=0)
print("prompt_ids", tuple(seqs.prompt_ids.shape), "(left-padded)\\n", seqs.prompt_ids[:3])
print("response_ids", tuple(seqs.response_ids.shape), "\\n", seqs.response_ids[:3])
print("response_mask\\n", seqs.response_mask[:3])
print("group_ids", seqs.group_ids)
for p, c in zip(seqs.prompts[:6], seqs.completions[:6]):
    print(repr(p), "->", repr(c))"""),
    ("md", "## 2. Score: reward functions on the decoded text"),
    ("code", """funcs = resolve_reward_funcs(["gsm8k", "gsm8k_format"])
result = score_completions(funcs, [1.0, 0.1], prompts=seqs.prompts, completions=seqs.completions,
                           completion_ids=[ids[m.bool()].tolist() for ids, m in zip(seqs.response_ids, seqs.response_mask)],
                           columns={"answer": [a for a in answers for _ in range(3)]})
print("per function (gsm8k, gsm8k_format)\\n", result.per_function)
print("rewards", result.rewards)"""),
    ("md", """## 3. Advantages: each response against its own group

GRPO: A = (r - mean of the group) / std of the group, the same for every token of a response."""),
    ("code", """mask = seqs.response_mask.float()
token_rewards = place_outcome_rewards(result.rewards, mask)       # the reward sits on the last token
advantages, _ = grpo_advantages(token_rewards, mask, seqs.group_ids)
print("token rewards\\n", token_rewards[:3])
print("advantages (first token of each response)", advantages[:, 0])"""),
    ("md", "## 4. Log-probs of the sampled tokens, and KL to the reference"),
    ("code", """old_logprobs = actor.get_logprobs(seqs)                   # behaviour policy, no graph
ref_logprobs = reference.get_logprobs(seqs)
kl = kl_penalty(old_logprobs, ref_logprobs, "k3") * mask
print("old log-probs (0 after each response's end)\\n", old_logprobs[:3] * mask[:3])
print("KL to the reference (k3), zero before any update:", kl.abs().max().item())"""),
    ("md", "## 5. The clipped policy loss and one update"),
    ("code", """logprobs, _ = actor.compute_logprobs(seqs)               # with a graph this time
loss, metrics = ppo_clip_loss(old_logprobs, logprobs, advantages, mask)
print("loss", loss.item(), metrics)
grad_norm = actor.update(loss)
print("gradient norm before clipping", grad_norm)
new_logprobs = actor.get_logprobs(seqs)
change = ((new_logprobs - old_logprobs) * mask).sum(1)   # log pi_new(y|x) - log pi_old(y|x) per response
print("change of each response's log-probability (rows: prompts):")
print(change.view(4, 3))
print("advantages per response:")
print(advantages[:, 0].view(4, 3))
moved = advantages[:, 0] != 0
print("every response with an advantage moved its way:", bool((change[moved] * advantages[moved, 0] > 0).all()))"""),
    ("md", """Responses with a positive advantage became more likely and those with a negative one less likely
(a group whose responses all scored the same has zero advantage and moves only a little): that is the whole
step. `VerlTrainer` adds batching across micro-steps, the loss normalisation
over the optimizer step, evaluation, logging and checkpoints."""),
]


def build(cells, path: Path) -> None:
    made = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    for number, cell in enumerate(made):
        cell["id"] = f"cell-{number}"  # stable ids: rebuilding changes nothing
    notebook = new_notebook(cells=made)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


if __name__ == "__main__":
    build(QUICKSTART, HERE / "01_quickstart.ipynb")
    build(ANATOMY, HERE / "02_anatomy_of_a_step.ipynb")
