"""On-policy distillation math (verl_hf/algorithms/distill.py) against hand-computed values and the full-logits
formula."""

import math

import pytest
import torch

from verl_hf.algorithms.distill import (
    chunked_generalized_jsd,
    chunked_topk_forward_kl,
    generalized_jsd,
    reverse_kl_advantages,
    topk_forward_kl,
)


def test_reverse_kl_advantage_is_the_teacher_student_gap_on_response_tokens():
    student = torch.tensor([[-1.0, -2.0, -0.5]])
    teacher = torch.tensor([[-0.5, -3.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # -(ls - lt): -(-1 + 0.5) = 0.5, -(-2 + 3) = -1, masked 0; scaled by coef 2
    assert torch.equal(reverse_kl_advantages(student, teacher, mask, coef=2.0), torch.tensor([[1.0, -2.0, 0.0]]))


def _hand(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gkd_at_its_three_betas_is_forward_kl_the_jsd_and_reverse_kl(beta):
    p_s, p_t = [0.5, 0.3, 0.2], [0.1, 0.6, 0.3]
    m = [(a + b) / 2 for a, b in zip(p_s, p_t)]
    expected = {0.0: _hand(p_t, p_s), 0.5: 0.5 * _hand(p_t, m) + 0.5 * _hand(p_s, m), 1.0: _hand(p_s, p_t)}[beta]
    value = generalized_jsd(torch.tensor([p_s]).log(), torch.tensor([p_t]).log(), beta)
    assert value.item() == pytest.approx(expected, abs=1e-6)


def test_gkd_refuses_a_beta_outside_zero_one():
    with pytest.raises(ValueError, match=r"gkd_beta=1.5 must be in \[0, 1\]"):
        generalized_jsd(torch.zeros(1, 3), torch.zeros(1, 3), 1.5)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("tied, temperature", [(True, 1.0), (False, 0.7)])
def test_chunked_gkd_equals_the_full_logits_formula_in_value_and_gradient(beta, tied, temperature):
    torch.manual_seed(0)
    n, h, v = 13, 8, 50
    hidden = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, requires_grad=True)
    bias = None if tied else torch.randn(v, dtype=torch.float64, requires_grad=True)
    teacher_hidden, teacher_weight = torch.randn(n, 6, dtype=torch.float64), torch.randn(v, 6, dtype=torch.float64)
    full = generalized_jsd(hidden @ weight.t() + (0 if bias is None else bias), teacher_hidden @ teacher_weight.t(),
                           beta, temperature)
    params = [hidden, weight] + ([] if bias is None else [bias])
    grads = torch.autograd.grad(full.sum(), params)
    chunked = chunked_generalized_jsd(hidden, weight, bias, teacher_hidden, teacher_weight, None, beta, temperature,
                                      chunk_size=4)
    assert torch.allclose(chunked.double(), full.double(), atol=1e-5)
    for got, want in zip(torch.autograd.grad(chunked.sum(), params), grads):
        assert torch.allclose(got, want, atol=1e-5)


def test_a_head_padded_with_trailing_rows_is_scored_on_the_shared_range():
    torch.manual_seed(0)
    hidden, weight = torch.randn(5, 4), torch.randn(10, 4)
    teacher_hidden, teacher_weight = torch.randn(5, 4), torch.randn(10, 4)
    padded = torch.cat([teacher_weight, torch.randn(3, 4)])  # 13 rows: 3 of padding
    same = chunked_generalized_jsd(hidden, weight, None, teacher_hidden, teacher_weight, None, 0.5)
    assert torch.allclose(chunked_generalized_jsd(hidden, weight, None, teacher_hidden, padded, None, 0.5), same)


def test_topk_forward_kl_sums_the_teachers_top_k_terms_only():
    p_s = [0.5, 0.3, 0.2]
    # the teacher's top-2 of [0.1, 0.6, 0.3]: ids 1 and 2, its mass not renormalised (verl's convention);
    # the second row has one entry only (-inf marks the missing one)
    ids = torch.tensor([[1, 2], [0, 0]])
    teacher = torch.tensor([[math.log(0.6), math.log(0.3)], [math.log(0.1), -math.inf]])
    value = topk_forward_kl(torch.tensor([p_s, p_s]).log(), ids, teacher)
    expected = [0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.2), 0.1 * math.log(0.1 / 0.5)]
    assert value.tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("tied, temperature", [(True, 1.0), (False, 0.7)])
def test_chunked_topk_forward_kl_equals_the_full_logits_formula_in_value_and_gradient(tied, temperature):
    torch.manual_seed(0)
    n, h, v, k = 13, 8, 50, 5
    hidden = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, requires_grad=True)
    bias = None if tied else torch.randn(v, dtype=torch.float64, requires_grad=True)
    teacher, ids = torch.log_softmax(torch.randn(n, v, dtype=torch.float64), -1).topk(k, -1)
    teacher[3, 2:] = -math.inf  # a position with fewer entries
    full = topk_forward_kl(hidden @ weight.t() + (0 if bias is None else bias), ids, teacher, temperature)
    params = [hidden, weight] + ([] if bias is None else [bias])
    grads = torch.autograd.grad(full.sum(), params)
    chunked = chunked_topk_forward_kl(hidden, weight, bias, ids, teacher, temperature, chunk_size=4)
    assert torch.isfinite(chunked).all() and (chunked > 0).any()
    assert torch.allclose(chunked.double(), full.double(), atol=1e-5)
    for got, want in zip(torch.autograd.grad(chunked.sum(), params), grads):
        assert torch.isfinite(got).all() and torch.allclose(got, want, atol=1e-5)
