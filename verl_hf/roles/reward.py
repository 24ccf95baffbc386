"""`RewardModel`: a sequence-classification model that scores (prompt, response) pairs.

It scores TEXT: the prompt and the decoded response, tokenised with the reward model's own tokenizer
(and its chat template for chat prompts). So a reward model with a tokenizer unlike the policy's works, and
the score of a pair does not depend on how the policy padded it. It is also a reward function
(`f(prompts, completions, completion_ids, **columns)`), so it can sit in `reward_funcs`.

A model with `num_labels != 1` needs `label_index` (which logit is the reward); without it, a clear error.

See it work: tests/test_reward_model.py.
"""

from __future__ import annotations

import torch

from ..batch import RolloutBatch
from ..rewards.contract import completion_text
from .base import Role


class RewardModel(Role):
    # Its forward may be sharded (ZeRO-3) and run collectives: reward_timeout_s does not interrupt it on one
    # process alone (rewards/calling.py).
    runs_collectives = True
    from transformers import AutoModelForSequenceClassification as auto_class

    frozen = True

    def __init__(self, model, tokenizer=None, label_index: int | None = None, batch_size: int = 32,
                 max_length: int | None = None):
        super().__init__(model, tokenizer)
        num_labels = getattr(model.config, "num_labels", 1)
        if num_labels != 1 and label_index is None:
            raise ValueError(
                f"reward model has num_labels={num_labels}; say which logit is the reward with "
                f"label_index=<0..{num_labels - 1}> (VerlConfig: reward_model_label_index), or load it with "
                f"num_labels=1."
            )
        if label_index is not None and not 0 <= label_index < num_labels:
            raise ValueError(f"label_index={label_index} but the reward model has num_labels={num_labels}; pick "
                             f"0..{num_labels - 1}.")
        if tokenizer is None:
            raise ValueError("RewardModel needs its tokenizer: RewardModel(model, tokenizer=...) or from_pretrained.")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.label_index = label_index or 0
        self.batch_size, self.max_length = batch_size, max_length
        self.__name__ = "reward_model"
        model.eval()
        model.requires_grad_(False)

    @torch.no_grad()
    def score_texts(self, texts: list[str]) -> torch.Tensor:
        """Scores (B,) of already formatted texts, in batches."""
        scores = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start : start + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=self.max_length is not None, max_length=self.max_length,
                                 add_special_tokens=True).to(self.device)
            scores.append(self.model(**enc).logits[:, self.label_index].float().cpu())
        return torch.cat(scores) if scores else torch.zeros(0)

    def format(self, prompt, completion) -> str:
        """The text scored for one pair: chat prompts through the reward model's chat template when it has one.
        `completion`: text, or the messages after a chat prompt (what reward functions get: rewards/contract.py)."""
        if isinstance(prompt, str):
            return prompt + completion_text(completion)
        after = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
        return self.format_conversation(list(prompt) + after)

    def format_conversation(self, messages: list[dict]) -> str:
        """The text scored for a whole conversation (multi-turn: the tool calls and results included), through
        the reward model's chat template when it has one, else one `role: content` line per message."""
        if not getattr(self.tokenizer, "chat_template", None):
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        except Exception as exc:  # jinja's own errors, e.g. roles that must alternate, no `tool` role
            roles = sorted({m["role"] for m in messages})
            raise ValueError(f"the reward model's chat template cannot render this conversation (roles {roles}): "
                             f"{type(exc).__name__}: {exc}. Give the reward model a tokenizer whose template renders "
                             f"them, or score the final answer with a reward function instead.") from exc

    def score(self, sequences: RolloutBatch) -> torch.Tensor:
        """One scalar per sequence (B,); multi-turn batches are scored on their whole conversations."""
        if sequences.env_mask is not None:  # multi-turn: the loop's `messages` (a dataset's own is not this)
            return self.score_texts([self.format_conversation(m) for m in sequences.columns["messages"]])
        return self.score_texts([self.format(p, c) for p, c in zip(sequences.prompts, sequences.completions)])

    get_reward = score  # the name the seed posts use

    def __call__(self, prompts, completions, completion_ids=None, messages=None, tool_statuses=None,
                 **columns) -> list[float]:
        """As a reward function: each pair's score, or with multi-turn rows each whole conversation's, the tool
        exchange included. Multi-turn rows are told by `tool_statuses`, a column only the multi-turn loop
        writes: in single-turn runs a dataset's own `messages` (e.g. a reference chat) is not what was sampled."""
        if messages is not None and tool_statuses is not None:
            return self.score_texts([self.format_conversation(m) for m in messages]).tolist()
        return self.score_texts([self.format(p, c) for p, c in zip(prompts, completions)]).tolist()
