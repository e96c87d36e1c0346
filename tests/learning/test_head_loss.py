"""The chunked LM-head cross-entropy equals the plain one: value and gradients, frozen or trainable head."""

from __future__ import annotations

import pytest
import torch

from learning.head_loss import linear_cross_entropy, linear_logprobs


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


def _plain_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temp: float) -> torch.Tensor:
    logits = hidden @ weight.T
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temp
    return torch.log_softmax(logits, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)


@pytest.mark.parametrize("chunk", [1, 4, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_gradients_match_the_plain_log_softmax_in_float64(chunk: int, temperature: float) -> None:
    g = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(11, 6, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(23, 6, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 23, (11,), generator=g)
    upstream = torch.randn(11, dtype=torch.float64, generator=g)  # per-position weights, as the GRPO loss gives

    got = linear_logprobs(hidden, weight, targets, temperature, chunk=chunk)
    (got * upstream).sum().backward()
    got_h, got_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want = _plain_logprobs(hidden, weight, targets, temperature)
    (want * upstream).sum().backward()

    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got_h, hidden.grad, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got_w, weight.grad, rtol=1e-9, atol=1e-9)


def test_logprobs_gradcheck_and_bad_temperature() -> None:
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(9, 4, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 9, (5,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: linear_logprobs(h, w, targets, 0.8, chunk=2), (hidden, weight))
    with pytest.raises(ValueError, match="temperature"):
        linear_logprobs(hidden, weight, targets, 0.0)


def _tiny_lm(tie: bool) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.mark.parametrize("tie", [False, True])
def test_response_logprobs_equal_the_full_forward(tie: bool) -> None:
    """The GRPO trainer's log-probs (decoder + chunked head) equal log_softmax of the model's own logits, for rows
    with different prompt lengths and right padding, and their gradients reach the same parameters."""
    from learning.sequences import TrainSequence, collate, response_logprobs

    model = _tiny_lm(tie)
    seqs = [TrainSequence(prompt_ids=(5, 6, 7), response_ids=(8, 9, 10, 11), mask=(1, 1, 1, 1), stages=(1, 1, 2, 3),
                          advantages=(1.0,) * 4),
            TrainSequence(prompt_ids=(12, 13, 14, 15, 16), response_ids=(17, 18), mask=(1, 1), stages=(3, 3),
                          advantages=(-1.0,) * 2)]
    batch = collate(seqs, pad_id=0)
    got = response_logprobs(model, batch, temperature=0.9)
    got_grads = torch.autograd.grad((got * batch.mask).sum(), [p for p in model.parameters()], allow_unused=True)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float() / 0.9
    lp = torch.log_softmax(logits, dim=-1)
    last = lp.shape[1] - 1  # padding positions (masked out) read the last position, as the trainer does
    want = torch.stack([torch.stack([lp[b, min(int(batch.prompt_lens[b]) - 1 + t, last), batch.targets[b, t]]
                                     for t in range(batch.targets.shape[1])]) for b in range(2)])
    want_grads = torch.autograd.grad((want * batch.mask).sum(), [p for p in model.parameters()], allow_unused=True)
    torch.testing.assert_close(got * batch.mask, want * batch.mask, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
