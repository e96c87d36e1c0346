"""Summed cross-entropy of an LM head over chosen positions without holding the vocabulary-sized logits.

`linear_cross_entropy(hidden, weight, targets)` equals `cross_entropy(hidden @ weight.T (in the weights' dtype,
then at least float32), targets, reduction="sum")` and gives the same gradients, but it walks the positions in chunks and
computes each chunk's gradient during the forward pass (softmax minus one-hot, through the head), keeping only the
(N, D) gradient of the hidden states and, for a trainable head, the (V, D) weight gradient. The logits of a long
sequence over a large vocabulary (1,000 trained tokens × 151,936 ids is 0.6 GB per float32 copy, and autograd keeps
several) never exist at once; no work is repeated, the backward pass only scales what was kept. Pure torch.
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK = 512  # positions per chunk: 512 × 151,936 float32 logits is 0.3 GB


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int) -> torch.Tensor:
        loss = torch.zeros((), dtype=torch.promote_types(weight.dtype, torch.float32), device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=loss.dtype) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start:start + chunk], targets[start:start + chunk]
            logits = h @ weight.T  # the head's output in its own dtype, then at least float32, as the plain path
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            lse = torch.logsumexp(logits, dim=-1)
            loss += (lse - logits.gather(1, y.unsqueeze(1)).squeeze(1)).sum()
            # d(sum CE)/d logits = softmax - one_hot, written over the logits to keep one vocabulary-sized buffer.
            probs = logits.sub_(lse.unsqueeze(1)).exp_()
            probs[torch.arange(y.shape[0], device=y.device), y] -= 1.0
            grad_logits = probs.to(weight.dtype)  # autograd would hand the head's matmul a gradient in its dtype
            del logits, probs
            if grad_hidden is not None:
                grad_hidden[start:start + chunk] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += (grad_logits.T @ h).to(loss.dtype)
        ctx.save_for_backward(grad_hidden if grad_hidden is not None else torch.empty(0),
                              grad_weight if grad_weight is not None else torch.empty(0))
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = grad_hidden * grad_loss.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        gw = (grad_weight * grad_loss).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk: int = CHUNK) -> torch.Tensor:
    """Summed CE of `hidden @ weight.T` (N, V) against `targets` (N,), chunked over N (see the module docstring)."""
    if hidden.ndim != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be (N, D) and targets (N,); got {tuple(hidden.shape)}, {tuple(targets.shape)}")
    result: torch.Tensor = _LinearCrossEntropy.apply(hidden, weight, targets, chunk)
    return result
