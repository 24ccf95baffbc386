"""ReMax (Li et al. 2024) as a loop of role calls: REINFORCE whose baseline is the reward of the greedy answer.

Compared with PPO it needs no critic and one extra greedy generation per prompt. Trains the demo task on CPU.

Run it: `python examples/custom_loop_remax.py [steps]`. See it work: tests/test_custom_loops.py.
"""

import sys

import torch

from verl_hf import Actor, RLHFDataset
from verl_hf.algorithms import place_outcome_rewards, reinforce_loss, remax_advantages
from verl_hf.demo import WARM_START_DIR
from verl_hf.demo.task import demo_splits
from verl_hf.rewards import gsm8k_score


def score(seqs) -> torch.Tensor:
    """1.0 for the right `#### <sum>`, 0.1 for a well-formed wrong one."""
    return torch.tensor([gsm8k_score(c, a, format_score=0.1) for c, a in zip(seqs.completions, seqs.columns["answer"])])


def main(steps: int = 60, seed: int = 0):
    torch.manual_seed(seed)
    # Sampling at 0.7 (log-probs use the same temperature): at 1.0 the samples score far below the greedy
    # baseline, most advantages are negative and the shared format tokens get pushed down (measured).
    actor = Actor.from_pretrained(WARM_START_DIR, learning_rate=1e-4, temperature=0.7)
    prompts = RLHFDataset(demo_splits(seed=0)[0], actor.tokenizer, max_prompt_length=32)
    history = []
    for step, batch in zip(range(steps), prompts.dataloader(batch_size=64, seed=seed)):
        seqs = actor.generate_sequences(batch, max_new_tokens=12)                        # 1. sample
        greedy = actor.generate_sequences(batch, max_new_tokens=12, do_sample=False)     # 2. greedy baseline
        seqs.rewards, baseline = score(seqs), score(greedy)                              # 3. rewards
        seqs.advantages, _ = remax_advantages(                                           # 4. A = R - R_greedy
            place_outcome_rewards(seqs.rewards, seqs.response_mask), seqs.response_mask, baseline)
        logprobs, _ = actor.compute_logprobs(seqs)                                       # 5. REINFORCE update
        loss, _ = reinforce_loss(None, logprobs, seqs.advantages, seqs.response_mask)
        actor.update(loss)
        history.append(seqs.rewards.mean().item())
        print(f"step {step:3d}  reward {history[-1]:.3f}  greedy {baseline.mean().item():.3f}")
    return history, actor


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
