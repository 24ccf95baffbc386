"""PPO (Ouyang et al. 2022) written as a loop of role calls: actor, critic, reference, reward.

The control flow is the paper's pseudo-code; devices, batching, padding and sampling live in the roles.
It trains the demo task (two-digit addition, the shipped tiny model) on CPU.

Run it: `python examples/custom_loop_ppo.py [steps]`. See it work: tests/test_custom_loops.py.
"""

import sys

import torch

from verl_hf import Actor, Critic, ReferencePolicy, RLHFDataset
from verl_hf.algorithms import gae_advantages, place_outcome_rewards, ppo_clip_loss, value_loss
from verl_hf.demo import WARM_START_DIR
from verl_hf.demo.task import demo_splits
from verl_hf.rewards import gsm8k_score


def score(seqs) -> torch.Tensor:
    """1.0 for the right `#### <sum>`, 0.1 for a well-formed wrong one."""
    return torch.tensor([gsm8k_score(c, a, format_score=0.1) for c, a in zip(seqs.completions, seqs.columns["answer"])])


# One mini-batch per rollout, 2 epochs: 60 steps lift greedy accuracy on 100 held-out problems by 24 (seed 0; Intel
# Xeon with AMX, 2 threads), where two mini-batches of 32 (4 smaller updates per rollout) gave 9.
def main(steps: int = 60, seed: int = 0, kl_coef: float = 0.02, ppo_epochs: int = 2, mini_batch: int = 64):
    torch.manual_seed(seed)
    actor = Actor.from_pretrained(WARM_START_DIR, learning_rate=1e-4)
    critic = Critic.from_pretrained(WARM_START_DIR, learning_rate=1e-3)
    ref_policy = ReferencePolicy.from_pretrained(WARM_START_DIR)
    prompts = RLHFDataset(demo_splits(seed=0)[0], actor.tokenizer, max_prompt_length=32)
    history = []
    for step, batch in zip(range(steps), prompts.dataloader(batch_size=64, seed=seed)):
        seqs = actor.generate_sequences(batch, max_new_tokens=12)             # 1. sample responses
        seqs.rewards = score(seqs)                                           # 2. reward
        seqs.old_logprobs = actor.get_logprobs(seqs)                         # 3. behaviour log-probs
        kl = ref_policy.kl_divergence(seqs, seqs.old_logprobs)               # 4. KL to the reference
        seqs.values = critic.compute_values(seqs)                            # 5. values
        token_rewards = place_outcome_rewards(seqs.rewards, seqs.response_mask) - kl_coef * kl
        seqs.advantages, seqs.returns = gae_advantages(                      # 6. GAE
            token_rewards, seqs.response_mask, seqs.values, gamma=1.0, lam=0.95)
        for _ in range(ppo_epochs):                                          # 7. PPO updates
            for mb in seqs.split(mini_batch):
                logprobs, _ = actor.compute_logprobs(mb)
                policy_loss, _ = ppo_clip_loss(mb.old_logprobs, logprobs, mb.advantages, mb.response_mask)
                actor.update(policy_loss)
                values = critic.forward_values(mb)
                critic_loss, _ = value_loss(values, mb.values, mb.returns, mb.response_mask, cliprange_value=0.5)
                critic.update(critic_loss)
        history.append(seqs.rewards.mean().item())
        print(f"step {step:3d}  reward {history[-1]:.3f}  kl {kl.sum().item() / seqs.response_mask.sum().item():.4f}")
    return history, actor


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
