"""The kernels of the embedded policy's one-token decode steps on CPU (issue 16).

Two measured costs of a decode step with transformers' own kernels (SmolLM2-135M, bf16, one thread, 2,000 tokens of
context; `tests/benchmarks/decode.py`):

- **oneDNN's bf16 matrix-vector products.** With one row of activations, ATen's native bf16 kernel reads the weights
  about twice as fast as oneDNN's: the 211 linear layers of a step took 38 ms with oneDNN and 18 ms without. With
  more rows oneDNN's GEMM wins (a group of 1/2/4/8 samples: 25/40/51/53 tok/s native, 18/32/57/105 oneDNN), so it
  is switched off only around one-token steps of at most two rows (`onednn_disabled`); prompts keep it.
- **Grouped-query attention by copying.** Eager attention repeats each key/value head for the 3 query heads that
  share it (`repeat_kv`), copying the whole cache twice per layer and step, and sdpa is slower still behind a long
  cache. `gqa_attention` folds the query heads of a group into the rows of one product instead, so the cache is read
  in place: the same arithmetic (scores, float32 softmax, weighted sum) as eager attention with no copy.

Both change which kernel computes a product, never what is computed: token ids and log-probs equal the eager path's
within float rounding (`tests/policy/test_decode_kernels.py`).

The oneDNN switch is process-wide (`torch.backends.mkldnn.enabled`). The embedded policy flips it only for a decode
step, with holders counted across threads (the last one out restores it); another thread computing at that moment
(the bank's embedder, say) runs the same products with the other kernels: slower or faster, never different results
beyond rounding.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

GQA_ATTENTION = "rubricem_gqa"  # the name under which `gqa_attention` is registered with transformers
_registered = False
_switch_lock = threading.Lock()
_holders = 0  # blocks inside `onednn_disabled`, in any thread
_saved = True  # the oneDNN setting the first holder found


@contextlib.contextmanager
def onednn_disabled(active: bool = True) -> Iterator[None]:
    """Run the block with oneDNN off (ATen's native CPU kernels), restoring the previous setting after.

    The switch is process-wide, so holders are counted: the first one in saves the setting and turns oneDNN off, the
    last one out restores it. Two policies decoding in two threads therefore never leave oneDNN off for good,
    whatever order they finish in.
    """
    if not active:
        yield
        return
    import torch.backends.mkldnn as mkldnn

    global _holders, _saved
    with _switch_lock:
        if _holders == 0:
            _saved = bool(mkldnn.enabled)
            mkldnn.enabled = False  # type: ignore[assignment]
        _holders += 1
    try:
        yield
    finally:
        with _switch_lock:
            _holders -= 1
            if _holders == 0:
                mkldnn.enabled = _saved  # type: ignore[assignment]


@contextlib.contextmanager
def _onednn_inside_disabled() -> Iterator[None]:
    """oneDNN on for the block while some `onednn_disabled` holds it off (else unchanged); off again after, or the
    saved setting if the last holder left meanwhile (under the same lock as the holder count)."""
    import torch.backends.mkldnn as mkldnn

    with _switch_lock:
        flip = _holders > 0
        if flip:
            mkldnn.enabled = True  # type: ignore[assignment]
    try:
        yield
    finally:
        if flip:
            with _switch_lock:
                mkldnn.enabled = False if _holders > 0 else _saved  # type: ignore[assignment]


def gqa_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Eager attention without `repeat_kv`: query (b, H, q, d) against key/value (b, K, L, d), H = K·g.

    Query heads h = k·g … k·g + g − 1 share key/value head k (transformers' layout), so viewing the query as
    (b, K, g·q, d) puts each group's heads in the rows of one product with its own key/value head. Returns
    (b, q, H, d) as eager attention does, and no attention weights.
    """
    import torch

    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None or (dropout and module.training):
        raise ValueError("the rubricem_gqa decode attention supports plain causal attention only (no softcap, "
                         "sliding window or dropout); set RUBRICEM_AGENT__EMBEDDED_DECODE_ATTENTION=eager")
    b, heads, q, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    rows = query.reshape(b, kv_heads, groups * q, d)
    # A compiled decode step (learning.engines.compiled_decode) gets the products written as sums over one axis, which
    # inductor turns into loops that read the cache in place, fused with the mask and the softmax; batched products
    # would be ATen calls there, with ATen's slow bf16 kernels (oneDNN's switch holds a lock dynamo cannot trace).
    # The sums accumulate in float32 and round to the query's dtype, as the products do.
    compiling = torch.compiler.is_compiling()
    with contextlib.nullcontext() if compiling else _onednn_inside_disabled():  # oneDNN's batched products win here
        if compiling:
            scores = (rows.unsqueeze(-2).float() * key.unsqueeze(2).float()).sum(-1).to(query.dtype) * scaling
        else:
            scores = torch.matmul(rows, key.transpose(2, 3)) * scaling  # (b, K, g·q, L)
        if attention_mask is not None:
            mask = attention_mask[:, :, None, :, :length]  # (b, 1, 1, q, L) against (b, K, g, q, L)
            scores = (scores.view(b, kv_heads, groups, q, length) + mask).view(b, kv_heads, groups * q, length)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        if compiling:
            out = (weights.unsqueeze(-1).float() * value.unsqueeze(2).float()).sum(-2).to(query.dtype)
        else:
            out = torch.matmul(weights, value)  # (b, K, g·q, d)
    return out.view(b, heads, q, d).transpose(1, 2).contiguous(), None


def register_gqa_attention() -> str:
    """Register `gqa_attention` (with eager attention's mask) with transformers once; returns its name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask

        AttentionInterface.register(GQA_ATTENTION, gqa_attention)
        AttentionMaskInterface.register(GQA_ATTENTION, eager_mask)
        _registered = True
    return GQA_ATTENTION
