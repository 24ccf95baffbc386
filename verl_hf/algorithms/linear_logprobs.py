"""Log-probs and entropy straight from hidden states, through the LM head in row chunks: the (N, V) logits are
never held whole, neither in forward nor in backward (the fused linear log-prob of verl and NeMo-RL; Unsloth's
reason for its GRPO memory savings).

`linear_logprobs(hidden, weight, bias, targets, ...)` equals `logprobs_from_logits(hidden @ weight.T + bias)`
(and `entropy_from_logits`) in value and gradient, but its peak extra memory is one chunk of logits
(chunk_size x V) instead of several (N, V) tensors. Backward recomputes each chunk's logits from the saved
hidden states and weight (one extra matmul per chunk, the usual recompute-for-memory trade); when one chunk
holds every row there is nothing to save by recomputing, so that chunk's log-softmax is kept for backward.

The roles reach it through `verl_hf.roles.scoring.sequence_logprobs`; see it work: tests/test_linear_logprobs.py.
"""

from __future__ import annotations

import torch


def _log_softmax_chunk(hidden, weight, bias, temperature: float):
    """log softmax((h W^T + b) / T) of one chunk in fp32, computed in place in one (n, V) buffer."""
    z = hidden @ weight.t()
    if bias is not None:
        z = z + bias
    z = z.float().div_(temperature)
    return z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))


def _entropy(log_p: torch.Tensor) -> torch.Tensor:
    """H = -sum_v p_v log p_v per row, one (n, V) temporary.  (n, V) -> (n,)."""
    return -(log_p.exp() * log_p).sum(-1)


class _LinearLogprobs(torch.autograd.Function):
    """logprobs (N,), entropy (N,) or None from hidden (N, H), weight (V, H), bias (V,) or None, targets (N,)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, with_entropy):
        logprobs = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(logprobs) if with_entropy else None
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            log_p = _log_softmax_chunk(hidden[rows], weight, bias, temperature)
            logprobs[rows] = log_p.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1)
            if with_entropy:
                entropy[rows] = _entropy(log_p)
        # One chunk: recomputing it would cost a matmul and save no memory, so backward reuses it.
        ctx.kept = log_p if hidden.shape[0] <= chunk_size and any(ctx.needs_input_grad[:3]) else None
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        # Backward recomputes the chunks under the same autocast as forward (bf16 matmuls stay bf16).
        device = hidden.device.type
        ctx.autocast = device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        ctx.set_materialize_grads(False)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        device, enabled, dtype = ctx.autocast
        with torch.autocast(device, dtype=dtype, enabled=enabled):
            return _LinearLogprobs._backward(ctx, grad_logprobs, grad_entropy)

    @staticmethod
    def _backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and ctx.needs_input_grad[2] else None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            log_p = ctx.kept if ctx.kept is not None else _log_softmax_chunk(hidden[rows], weight, bias, ctx.temperature)
            ctx.kept = None  # _grad_logits overwrites it: a second backward must recompute
            grad_z = _grad_logits(log_p, targets[rows],
                                  None if grad_logprobs is None else grad_logprobs[rows],
                                  None if grad_entropy is None else grad_entropy[rows])
            grad_z = grad_z.div_(ctx.temperature)
            if not ctx.autocast[1]:
                grad_z = grad_z.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad_z @ weight
            if grad_weight is not None:
                grad_weight += (grad_z.t() @ hidden[rows]).float()
            if grad_bias is not None:
                grad_bias += grad_z.float().sum(0)
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def _grad_logits(log_p, targets, grad_logprobs, grad_entropy) -> torch.Tensor:
    """d loss / d z of one chunk (before the 1/T), reusing `log_p`'s buffer.  (n, V) -> (n, V).

    Formula: d log p_y / d z = onehot(y) - p;  d H / d z = -p (log p + H).
    """
    p, grad_z = log_p.exp(), None
    if grad_entropy is not None:
        entropy = -(p * log_p).sum(-1, keepdim=True)
        # log_p's buffer becomes -g_H p (log p + H), the entropy's share, in place.
        grad_z = log_p.add_(entropy).mul_(p).mul_(-grad_entropy.float().unsqueeze(-1))
    if grad_logprobs is not None:
        g = grad_logprobs.float().unsqueeze(-1)
        share = p.mul_(-g)
        grad_z = share if grad_z is None else grad_z.add_(share)
        grad_z.scatter_add_(-1, targets.unsqueeze(-1), g)
    return grad_z if grad_z is not None else torch.zeros_like(p)


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None = None,
                    *, temperature: float = 1.0, chunk_size: int = 256,
                    with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs, entropies) of `targets` under softmax((hidden @ weight.T + bias) / temperature), in fp32.

    Shapes: hidden (..., H), weight (V, H), targets (...) int, bias (V,) or None -> (...), (...).
    Formula: log p(y) = z_y - logsumexp(z), H = logsumexp(z) - sum_v softmax(z)_v z_v, z = (h W^T + b) / T, computed
    `chunk_size` rows at a time (peak: about two chunk x V fp32 buffers). Gradients flow to hidden, weight and
    bias; an output not used in the loss (e.g. entropy as a metric) costs nothing in backward, and
    `with_entropy=False` skips the entropy (returned as None).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    shape = targets.shape
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1).long()
    logprobs, entropy = _LinearLogprobs.apply(flat_hidden, weight, bias, flat_targets, float(temperature), chunk_size,
                                              with_entropy)
    return logprobs.view(shape), entropy.view(shape) if entropy is not None else None
