"""On-policy distillation: the student samples, a frozen teacher scores, the student moves toward the teacher.

Two signals, both per response token:
- `reverse_kl_advantages`: on the sampled tokens only, A_t = -coef * (log p_s(y_t) - log p_t(y_t)), a
  per-token advantage for the ordinary policy-gradient loss (tinker-cookbook's train_on_policy.py; Thinking
  Machines' "On-Policy Distillation" write-up). Its expectation under the student's own samples is the
  gradient of the per-token reverse KL(p_s || p_t) summed over the sampled prefixes, each prefix held fixed:
  each token gets its own term only (no credit from later tokens, a discount of 0, as there), which is not the
  gradient of the whole sequences' KL.
- `generalized_jsd` / `chunked_generalized_jsd`: GKD's divergence over the full next-token distributions
  (Agarwal et al. 2024, "On-Policy Distillation of Language Models"), differentiated directly. With the mixture
  M = beta * p_t + (1 - beta) * p_s: JSD_beta = beta * KL(p_t || M) + (1 - beta) * KL(p_s || M). As in TRL's
  `generalized_jsd_loss`, beta = 0 is the forward KL(p_t || p_s) and beta = 1 the reverse KL(p_s || p_t) (the
  mixture formula itself tends to 0 at both ends, so the ends are these named divergences instead).

- `topk_forward_kl` / `chunked_topk_forward_kl`: the forward KL restricted to the teacher's top-k ids at each
  position, sum_{v in top-k} p_t(v) * (log p_t(v) - log p_s(v)), for a teacher served by vLLM that returns only
  its top-k log-probs. As verl's `compute_forward_kl_topk`: the student's log-probs are normalised over its whole
  vocabulary and the teacher's top-k mass is not renormalised (the missing tail is dropped, not modelled).

The chunked forms go through both models' LM heads a chunk of rows at a time and recomputes each chunk in
backward, so neither model's (N, V) logits are ever held whole. `vocab` scores on a shared leading range of
ids: two members of one family whose embeddings differ only by trailing padding rows (151936 vs 152064 in
Qwen2.5) are compared on the ids both have.

See it work: tests/test_distill.py.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint


def reverse_kl_advantages(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                          response_mask: torch.Tensor, coef: float = 1.0) -> torch.Tensor:
    """A_t = -coef * (log p_s - log p_t) on response tokens, 0 elsewhere; no gradient.  (B, T) x3 -> (B, T)."""
    gap = (student_logprobs.detach().float() - teacher_logprobs.detach().float()) * response_mask
    return -coef * gap


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row from log-probs.  (N, V) x2 -> (N,)."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def jsd_from_logprobs(student_log_p: torch.Tensor, teacher_log_p: torch.Tensor, beta: float) -> torch.Tensor:
    """GKD's generalized JSD per row from normalised log-probs.  (N, V) x2 -> (N,).  beta 0: KL(t || s); 1: KL(s || t)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"gkd_beta={beta} must be in [0, 1] (0: forward KL, 1: reverse KL, between: the JSD).")
    if beta == 0.0:
        return _kl(teacher_log_p, student_log_p)
    if beta == 1.0:
        return _kl(student_log_p, teacher_log_p)
    mixture = torch.logsumexp(torch.stack([teacher_log_p + math.log(beta), student_log_p + math.log(1.0 - beta)]), 0)
    return beta * _kl(teacher_log_p, mixture) + (1.0 - beta) * _kl(student_log_p, mixture)


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                    temperature: float = 1.0) -> torch.Tensor:
    """GKD's divergence per token from full logits (both divided by `temperature`).  (N, V) x2 -> (N,)."""
    student = torch.log_softmax(student_logits.float() / temperature, -1)
    teacher = torch.log_softmax(teacher_logits.detach().float() / temperature, -1)
    return jsd_from_logprobs(student, teacher, beta)


def _head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, vocab: int) -> torch.Tensor:
    logits = hidden @ weight[:vocab].t()
    return logits if bias is None else logits + bias[:vocab]


def _chunk_jsd(student_hidden, teacher_hidden, student_weight, student_bias, teacher_weight, teacher_bias,
               beta: float, temperature: float, vocab: int) -> torch.Tensor:
    student = _head(student_hidden, student_weight, student_bias, vocab)
    with torch.no_grad():  # in the teacher's own dtype and on its device; compared in fp32 on the student's
        teacher = _head(teacher_hidden, teacher_weight, teacher_bias, vocab).to(student.device)
    return generalized_jsd(student, teacher, beta, temperature)


def chunked_generalized_jsd(student_hidden: torch.Tensor, student_weight: torch.Tensor,
                            student_bias: torch.Tensor | None, teacher_hidden: torch.Tensor,
                            teacher_weight: torch.Tensor, teacher_bias: torch.Tensor | None, beta: float,
                            temperature: float = 1.0, chunk_size: int = 1024,
                            vocab: int | None = None) -> torch.Tensor:
    """`generalized_jsd` of the two LM heads' logits, `chunk_size` rows at a time, each chunk recomputed in
    backward (activation checkpointing): peak extra memory is one chunk of each model's logits.
    Hidden states (N, H_s), (N, H_t); head weights (V_s, H_s), (V_t, H_t); biases or None -> (N,).
    Gradients flow to the student's hidden states and head only. `vocab`: score ids [0, vocab) (default the
    smaller head's rows). The teacher's side may be in another dtype or on another device than the student's."""
    vocab = vocab or min(student_weight.shape[0], teacher_weight.shape[0])
    return _by_chunks(_chunk_jsd, (student_hidden, teacher_hidden.detach()),
                      (student_weight, student_bias, teacher_weight, teacher_bias, beta, temperature, vocab), chunk_size)


def _by_chunks(chunk_loss, rows: tuple, shared: tuple, chunk_size: int) -> torch.Tensor:
    """cat over chunks of `chunk_size` rows of chunk_loss(*rows[chunk], *shared), each chunk recomputed in backward
    when the student's hidden states (rows[0]) or head (shared[0]) need gradients.  -> (N,)"""
    grad = torch.is_grad_enabled() and (rows[0].requires_grad or shared[0].requires_grad)
    parts = []
    for start in range(0, rows[0].shape[0], chunk_size):
        args = (*(each[start:start + chunk_size] for each in rows), *shared)
        parts.append(checkpoint(chunk_loss, *args, use_reentrant=False) if grad else chunk_loss(*args))
    return torch.cat(parts) if parts else rows[0].new_zeros(0, dtype=torch.float32)


def _topk_kl(student_log_p: torch.Tensor, teacher_ids: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """sum_k p_t * (log p_t - log p_s[ids]) per row; ids whose teacher log-prob is -inf (no entry) count 0.
    (N, V), (N, k), (N, k) -> (N,)."""
    present = torch.isfinite(teacher_logprobs)
    teacher = torch.where(present, teacher_logprobs.float(), 0.0)
    student = student_log_p.gather(-1, teacher_ids.long())
    return torch.where(present, teacher.exp() * (teacher - student), 0.0).sum(-1)


def topk_forward_kl(student_logits: torch.Tensor, teacher_ids: torch.Tensor, teacher_logprobs: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """Forward KL on the teacher's top-k ids from the student's full logits.  (N, V), (N, k), (N, k) -> (N,)."""
    return _topk_kl(torch.log_softmax(student_logits.float() / temperature, -1), teacher_ids, teacher_logprobs)


def _chunk_topk_kl(student_hidden, teacher_ids, teacher_logprobs, student_weight, student_bias,
                   temperature: float, vocab: int) -> torch.Tensor:
    return topk_forward_kl(_head(student_hidden, student_weight, student_bias, vocab), teacher_ids, teacher_logprobs,
                           temperature)


def chunked_topk_forward_kl(student_hidden: torch.Tensor, student_weight: torch.Tensor,
                            student_bias: torch.Tensor | None, teacher_ids: torch.Tensor,
                            teacher_logprobs: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024,
                            vocab: int | None = None) -> torch.Tensor:
    """`topk_forward_kl` of the student's LM-head logits, `chunk_size` rows at a time, each chunk recomputed in
    backward. Hidden states (N, H), head weight (V, H), bias or None, teacher top-k ids and log-probs (N, k)
    (-inf where a position has fewer entries) -> (N,). `vocab`: the student's distribution over ids [0, vocab)."""
    vocab = vocab or student_weight.shape[0]
    device = student_hidden.device
    return _by_chunks(_chunk_topk_kl, (student_hidden, teacher_ids.to(device), teacher_logprobs.to(device)),
                      (student_weight, student_bias, temperature, vocab), chunk_size)
