"""The chunked LM-head cross-entropy equals the plain one: value and gradients, frozen or trainable head."""

from __future__ import annotations

import pytest
import torch

from learning.head_loss import linear_cross_entropy


def _plain(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weight.T
    return torch.nn.functional.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets,
                                             reduction="sum")


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("train_head", [False, True])
def test_value_and_gradients_match_the_plain_loss_in_float64(chunk: int, train_head: bool) -> None:
    g = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(13, 8, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(29, 8, dtype=torch.float64, generator=g, requires_grad=train_head)
    targets = torch.randint(0, 29, (13,), generator=g)
    scale = 0.37  # the trainer divides by the step's trained tokens: the backward pass must scale what it kept

    got = linear_cross_entropy(hidden, weight, targets, chunk=chunk)
    (got * scale).backward()
    got_h = hidden.grad.clone()
    got_w = weight.grad.clone() if train_head else None
    hidden.grad = None
    weight.grad = None
    want = _plain(hidden, weight, targets)
    (want * scale).backward()

    torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_h, hidden.grad, rtol=1e-6, atol=1e-9)
    if train_head:
        torch.testing.assert_close(got_w, weight.grad, rtol=1e-6, atol=1e-9)
    else:
        assert weight.grad is None


def test_gradcheck() -> None:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 4, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (5,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: linear_cross_entropy(h, w, targets, chunk=2), (hidden, weight))


def test_bfloat16_head_gives_the_plain_value() -> None:
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(40, 16, generator=g).bfloat16()
    weight = torch.randn(300, 16, generator=g).bfloat16()
    targets = torch.randint(0, 300, (40,), generator=g)
    torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, chunk=16),
                               _plain(hidden, weight, targets), rtol=1e-5, atol=1e-4)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="hidden must be"):
        linear_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))
