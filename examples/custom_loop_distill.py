"""On-policy distillation as a loop of role calls: the student samples, a frozen teacher scores each sampled
token, and the student takes the policy-gradient step whose per-token advantage is -(log p_student - log
p_teacher) (in expectation over its own samples, the gradient of the per-token reverse KL(student || teacher)
at each sampled prefix).

No reward at all: the teacher's log-probs are the only signal. Here the teacher is the demo's warm start and the
student the same model with noise in every weight matrix (a student that drifted from its teacher); the loop
pulls it back. With your own models: `python examples/custom_loop_distill.py [steps] [student] [teacher]`.

See it work: tests/test_distill_training.py.
"""

import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_hf import Actor, RLHFDataset, TeacherPolicy
from verl_hf.algorithms import reinforce_loss
from verl_hf.algorithms.distill import reverse_kl_advantages
from verl_hf.demo import WARM_START_DIR
from verl_hf.demo.task import demo_splits
from verl_hf.vocabulary import shared_vocabulary


def drifted_student(path: str | None = None, noise: float = 1.5) -> str:
    """The warm start with Gaussian noise of `noise` times each weight matrix's spread (embeddings kept), saved to
    `path` (default a new temporary folder): a student that has drifted from its teacher (held-out accuracy
    from about 30% to about 4%)."""
    model = AutoModelForCausalLM.from_pretrained(WARM_START_DIR)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.add_(noise * p.std() * torch.randn(p.shape, generator=generator))
    path = path or tempfile.mkdtemp(prefix="drifted-student-")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(WARM_START_DIR).save_pretrained(path)
    return path


def main(steps: int = 20, student: str | None = None, teacher: str = str(WARM_START_DIR), seed: int = 0):
    torch.manual_seed(seed)
    actor = Actor.from_pretrained(student or drifted_student(), learning_rate=1e-4)
    teacher_role = TeacherPolicy.from_pretrained(teacher)
    # the teacher must score the student's ids: same tokenizer, padding rows left out (verl_hf/vocabulary.py)
    teacher_role.vocab_size = shared_vocabulary(actor.tokenizer, teacher_role.tokenizer, actor.model.config.vocab_size,
                                                teacher_role.model.config.vocab_size)
    prompts = RLHFDataset(demo_splits(seed=0)[0], actor.tokenizer, max_prompt_length=32)
    history = []
    for step, batch in zip(range(steps), prompts.dataloader(batch_size=32, seed=seed)):
        seqs = actor.generate_sequences(batch, max_new_tokens=12, num_return_sequences=4)   # 1. the student samples
        teacher_logprobs = teacher_role.get_logprobs(seqs)                                   # 2. the teacher scores
        logprobs, _ = actor.compute_logprobs(seqs)                                           # 3. the student's own
        advantages = reverse_kl_advantages(logprobs, teacher_logprobs, seqs.response_mask)   # 4. A = -(ls - lt)
        loss, _ = reinforce_loss(None, logprobs, advantages, seqs.response_mask)            # 5. policy gradient
        actor.update(loss)
        mask = seqs.response_mask.float()
        history.append((-(advantages * mask).sum() / mask.sum()).item())  # KL(student || teacher) per token
        print(f"step {step:3d}  KL(student || teacher) per token {history[-1]:.3f}")
    return history, actor


if __name__ == "__main__":
    main(*(int(a) if i == 0 else a for i, a in enumerate(sys.argv[1:4])))
