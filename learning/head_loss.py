"""An LM head's loss over chosen positions without holding the vocabulary-sized logits.

Two functions, for the two trainers, and `split_head` to find a causal LM's decoder and head.

* SFT: the summed cross-entropy.

`linear_cross_entropy(hidden, weight, targets)` equals `cross_entropy(hidden @ weight.T (in the weights' dtype,
then at least float32), targets, reduction="sum")` and gives the same gradients, but it walks the positions in chunks and
computes each chunk's gradient during the forward pass (softmax minus one-hot, through the head), keeping only the
(N, D) gradient of the hidden states and, for a trainable head, the (V, D) weight gradient. The logits of a long
sequence over a large vocabulary (1,000 trained tokens × 151,936 ids is 0.6 GB per float32 copy, and autograd keeps
several) never exist at once; no work is repeated, the backward pass only scales what was kept.

* GRPO: `linear_logprobs(hidden, weight, targets, temperature)` equals `log_softmax(hidden @ weight.T (float32) /
temperature)[targets]` per position, with the same gradients. Each position's upstream gradient is only known in the
backward pass, so the forward keeps the per-position log-sum-exp and the backward recomputes each chunk's logits
(one more head matmul per chunk) instead of autograd keeping the float32 logits, their log-softmax and a gathered copy.

Pure torch.
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
            logits = _chunk_logits(h, weight, 1.0, loss.dtype)
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


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                chunk: int) -> torch.Tensor:
        dtype = torch.promote_types(weight.dtype, torch.float32)
        out = torch.empty(hidden.shape[0], dtype=dtype, device=hidden.device)
        lse_all = torch.empty_like(out)
        for start in range(0, hidden.shape[0], chunk):
            logits = _chunk_logits(hidden[start:start + chunk], weight, temperature, dtype)
            lse = torch.logsumexp(logits, dim=-1)
            y = targets[start:start + chunk]
            out[start:start + chunk] = logits.gather(1, y.unsqueeze(1)).squeeze(1) - lse
            lse_all[start:start + chunk] = lse
        ctx.save_for_backward(hidden, weight, targets, lse_all)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, targets, lse_all = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        dtype = lse_all.dtype
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=dtype) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start:start + chunk], targets[start:start + chunk]
            g = grad_out[start:start + chunk].to(dtype)
            # d logprob_y / d logits = one_hot(y) - softmax, through the 1/temperature scaling.
            probs = _chunk_logits(h, weight, temperature, dtype).sub_(lse_all[start:start + chunk].unsqueeze(1)).exp_()
            probs.neg_()[torch.arange(y.shape[0], device=y.device), y] += 1.0
            grad_logits = probs.mul_(g.unsqueeze(1) / temperature).to(weight.dtype)
            del probs
            if grad_hidden is not None:
                grad_hidden[start:start + chunk] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += (grad_logits.T @ h).to(dtype)
        gw = grad_weight.to(weight.dtype) if grad_weight is not None else None
        return grad_hidden, gw, None, None, None


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    logits = (h @ weight.T).to(dtype)  # the head's output in its own dtype, then at least float32
    return logits / temperature if temperature != 1.0 else logits


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                    chunk: int = CHUNK) -> torch.Tensor:
    """log softmax(hidden @ weight.T / temperature)[targets], (N,), chunked over N (see the module docstring)."""
    if hidden.ndim != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be (N, D) and targets (N,); got {tuple(hidden.shape)}, {tuple(targets.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, not {temperature}")
    result: torch.Tensor = _LinearLogprobs.apply(hidden, weight, targets, temperature, chunk)
    return result


def split_head(model: Any) -> tuple[Any, torch.nn.Linear] | None:
    """(decoder, head) of an unwrapped causal LM whose logits are exactly `head(decoder(...))`, else None.

    None for a model wrapped for DDP/FSDP/DeepSpeed (the wrapper's own forward must run for its hooks), a head with a
    bias or a LoRA layer, and models that scale or soft-cap their logits. PEFT keeps LoRA layers inside the decoder,
    so a PEFT model's decoder runs with its adapter.
    """
    from accelerate.utils import extract_model_from_parallel

    if extract_model_from_parallel(model) is not model:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    get_decoder = getattr(base, "get_decoder", None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    config = getattr(base, "config", None)
    scaled = any(getattr(config, name, None) not in (None, 1.0) for name in ("final_logit_softcapping", "logit_scale"))
    if get_decoder is None or type(head) is not torch.nn.Linear or head.bias is not None or scaled:
        return None
    return get_decoder(), head
