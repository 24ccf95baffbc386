"""`TeacherPolicy`: the frozen teacher of on-policy distillation. It scores every token the student sampled.

Like the reference it never builds a graph (frozen parameters, `torch.no_grad()`), and it is placed the same
way (a whole copy per process, partitioned under ZeRO-3, sharded under FSDP2). Unlike the reference it is
always a model of its own, and it may carry trailing padding rows the student lacks (Qwen2.5-7B's 152064 rows
against 0.5B's 151936, one tokenizer): `vocab_size` then limits its distributions to the ids both share
(verl_hf/vocabulary.py decides that number, and refuses teachers whose tokenizer differs).

In a custom loop:

    teacher = TeacherPolicy.from_pretrained("path/to/teacher", vocab_size=shared_vocabulary(...))
    teacher_logprobs = teacher.get_logprobs(batch)                       # (B, Lr)
    advantages = reverse_kl_advantages(student_logprobs, teacher_logprobs, batch.response_mask)

See it work: tests/test_distill_training.py, examples/custom_loop_distill.py.
"""

from __future__ import annotations

import torch

from ..algorithms.distill import chunked_generalized_jsd
from ..batch import RolloutBatch
from ..distributed import compute_device
from .base import Role, score_in_chunks
from .scoring import divergence_chunk_size, output_head, per_position, response_hidden_states, sequence_logprobs


class TeacherPolicy(Role):
    """Holds: the frozen teacher model, the temperature it scores at (the student's sampling temperature), the
    LM-head chunk size, the ids its distributions cover, and under ZeRO-3 the inference engine holding it."""

    from transformers import AutoModelForCausalLM as auto_class

    frozen = True

    def __init__(self, model, tokenizer=None, temperature: float = 1.0, logits_chunk_size: int | None = None,
                 vocab_size: int | None = None):
        """`vocab_size`: score over ids [0, vocab_size) (the rows teacher and student share); None: every row."""
        super().__init__(model, tokenizer)
        self.temperature, self.logits_chunk_size, self.vocab_size = temperature, logits_chunk_size, vocab_size
        self.engine = None  # a DeepSpeed inference engine holding the model under ZeRO-3
        model.eval()
        model.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return compute_device(self.model)

    def get_logprobs(self, sequences: RolloutBatch, micro_batch_size: int | None = None) -> torch.Tensor:
        """The teacher's log-probs (B, Lr) of the sampled response tokens; never carries gradients."""
        logprobs = score_in_chunks(self.model, sequences, micro_batch_size,
                                   lambda m, mb: sequence_logprobs(m, mb, self.temperature,
                                                                     chunk_size=self.logits_chunk_size,
                                                                     vocab=self.vocab_size)[0])
        return logprobs.to(sequences.response_ids.device)

    def divergence_against(self, sequences: RolloutBatch, beta: float):
        """GKD's generalized JSD of a student against this teacher on `sequences`' response positions, as the
        function `scored_responses(divergence=...)` calls with the student's hidden states (B, K, H) and head:
        -> (B, K), through both heads a chunk of rows at a time (algorithms/distill.py). The teacher's forward
        runs here, once, without gradients; its head is read where it lives (one process or DDP)."""
        was_training = self.model.training
        self.model.eval()
        try:
            teacher_hidden = response_hidden_states(self.model, sequences.to(self.device))
        finally:
            self.model.train(was_training)
        head = output_head(self.model)
        # the student scores K = Lr + 1 positions (the last predicts nothing); the teacher's last is not kept
        teacher_hidden = torch.nn.functional.pad(teacher_hidden, (0, 0, 0, 1)).flatten(0, 1)
        rows = self.logits_chunk_size or divergence_chunk_size(head.out_features)
        return per_position(lambda hidden, weight, bias: chunked_generalized_jsd(
            hidden, weight, bias, teacher_hidden, head.weight, head.bias, beta, self.temperature, rows,
            self.vocab_size))
