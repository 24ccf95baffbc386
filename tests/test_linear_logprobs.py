"""Chunked log-probs and entropy from hidden states equal the full-logits path, in value and gradient."""

import pytest
import torch

from verl_hf.algorithms import entropy_from_logits, logprobs_from_logits
from verl_hf.algorithms.linear_logprobs import linear_logprobs


def _inputs(bias: bool, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 5, 16, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(50, 16, generator=g) * 0.5).to(dtype).requires_grad_()
    b = (torch.randn(50, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, 50, (3, 5), generator=g)
    return hidden, weight, b, targets


def _reference(hidden, weight, bias, targets, temperature):
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    return logprobs_from_logits(logits, targets), entropy_from_logits(logits)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 4, 1024])  # 15 rows: chunks of 1, uneven chunks, one chunk
@pytest.mark.parametrize("entropy_in_loss", [False, True])
def test_values_and_gradients_match_the_full_logits(bias, chunk_size, entropy_in_loss):
    weights = torch.linspace(-1, 1, 15).view(3, 5)  # an advantage per token
    grads = []
    for fn in (_reference, lambda h, w, b, t, temp: linear_logprobs(h, w, t, b, temperature=temp, chunk_size=chunk_size)):
        hidden, weight, b, targets = _inputs(bias)
        logprobs, entropy = fn(hidden, weight, b, targets, 0.7)
        loss = (weights * logprobs).sum() + (0.1 * entropy.sum() if entropy_in_loss else 0.0)
        loss.backward()
        grads.append((logprobs.detach(), entropy.detach(), hidden.grad, weight.grad, b.grad if bias else None))
    for ref, ours in zip(*grads):
        if ref is not None:
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_a_tied_head_gets_both_gradients():
    """The embedding and the LM head are one tensor: its gradient sums the two uses, as with the full path."""
    grads = []
    for chunked in (False, True):
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(50, 16)
        ids, targets = torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 6))
        hidden = torch.tanh(embedding(ids))
        if chunked:
            logprobs, _ = linear_logprobs(hidden, embedding.weight, targets, chunk_size=5)
        else:
            logprobs = logprobs_from_logits(hidden @ embedding.weight.t(), targets)
        logprobs.sum().backward()
        grads.append(embedding.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)


def test_bf16_weights_run_with_fp32_log_prob_arithmetic():
    hidden, weight, _, targets = _inputs(False, dtype=torch.bfloat16)
    logprobs, entropy = linear_logprobs(hidden, weight, targets, chunk_size=4)
    assert logprobs.dtype == torch.float32 and bool((logprobs <= 0).all()) and bool((entropy >= 0).all())
    ref, _ = _reference(hidden.detach(), weight.detach(), None, targets, 1.0)
    torch.testing.assert_close(logprobs.detach(), ref, atol=1e-4, rtol=1e-4)
    logprobs.sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16


def test_bad_arguments_are_refused():
    hidden, weight, _, targets = _inputs(False)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        linear_logprobs(hidden, weight, targets, chunk_size=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        linear_logprobs(hidden, weight, targets, temperature=0.0)


def test_without_entropy_it_returns_none_and_the_same_log_prob_gradients():
    hidden, weight, _, targets = _inputs(False)
    logprobs, entropy = linear_logprobs(hidden, weight, targets, chunk_size=4, with_entropy=False)
    assert entropy is None
    logprobs.sum().backward()
    ref_hidden, ref_weight, _, _ = _inputs(False)
    ref, _ = _reference(ref_hidden, ref_weight, None, targets, 1.0)
    ref.sum().backward()
    torch.testing.assert_close(logprobs.detach(), ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weight.grad, ref_weight.grad, atol=1e-5, rtol=1e-5)
