"""A compiled one-token decode step for the embedded policy (`TransformersPolicyClient(compile=True)`, issue 37).

What is compiled: one forward of one token over a preallocated KV cache (transformers' `StaticCache`), returning
the last position's logits in float32. `torch.compile` (dynamo, then inductor's C++ backend, one whole graph or
nothing) turns the 30 layers' norms, rotary embeddings, attention, activations and residual adds into a few fused
C++ loops, and `INDUCTOR_OPTIONS` has inductor write the one-row matrix-vector products as fused loops too
(`decompose_mm_pass`: a product whose left side has one row and whose sides are at most 2,048 wide becomes
multiply-and-sum). The tied 49,152-row output projection stays an ATen call, run with oneDNN off as in eager mode.
Attention is `learning.engines.decode_kernels.gqa_attention`, which under compilation is written as sums that read
the cache in place.

Shapes: one graph per cache length, so the cache comes in `DEFAULT_BUCKETS` lengths: a request gets the smallest
bucket that holds its prompt and `max_tokens` (a bigger cache costs attention over its whole length: masked
positions are computed and zeroed). A graph is compiled on the first step in a new bucket or with a new module
structure (base weights, an unmerged LoRA adapter, a merged one); `compiles` counts them and `compile_seconds`
sums the time of the steps that compiled. Weights are graph inputs, not constants, so copying new LoRA weights into
the loaded adapter's tensors (`peft.utils.hotswap.hotswap_adapter`) needs no new graph.

Prompts are not compiled: they run today's eager kernels over a `DynamicCache` seeded with the cached prefix, and
the new positions are copied into the static cache (`prefill_into`), so prompt numerics and speed are unchanged and
a later turn that extends the prompt reuses the cached prefix (positions past it are overwritten). Group decoding
(`generate_group`) stays eager: its batch shrinks as rows finish, one graph per batch size.

Failure: anything that goes wrong while compiling or running the compiled step raises `CompiledDecodeFailed` (after
putting the cache's length back); the client then logs one warning and decodes with the eager kernels from then on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1024, 2048, 4096, 8192)
# inductor config for the decode graph: one-row products become fused multiply-and-sum loops (CPU thresholds of
# torch/_inductor/fx_passes/decompose_mem_bound_mm.py); measured on the 2-core machine, this is what makes the
# compiled step faster than eager (without it ATen's matrix-vector calls dominate as before)
INDUCTOR_OPTIONS: dict[str, Any] = {"post_grad_fusion_options": {"decompose_mm_pass": {}}}


class CompiledDecodeFailed(RuntimeError):
    """The compiled decode step could not be compiled or run; the caller decodes eagerly from here on."""


def _decode_step(model: Any, ids: Any, cache: Any, cache_kw: str) -> Any:
    """The function that is compiled: one forward over `cache`, the last position's logits in float32."""
    return model(input_ids=ids, use_cache=True, **{cache_kw: cache}).logits[:, -1].float()


class CompiledDecode:
    """Compiled one-token decode steps over static KV caches of a few bucket lengths (see the module docstring).

    Args:
        backend: "inductor" (with `options`), or any `torch.compile` backend (a name or a callable; tests inject a
            failing one).
        buckets: the static cache lengths, ascending; a request longer than the largest cannot be compiled.
        options: inductor config patches (default `INDUCTOR_OPTIONS`); ignored for other backends.
    """

    def __init__(
        self,
        backend: str | Callable[..., Any] = "inductor",
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        options: dict[str, Any] | None = None,
    ) -> None:
        if not buckets or any(int(b) < 1 for b in buckets):
            raise ValueError(f"buckets must be positive lengths, not {buckets!r}")
        self.backend = backend
        self.buckets = tuple(sorted({int(b) for b in buckets}))
        self.options = dict(INDUCTOR_OPTIONS if options is None else options)
        self.compiles = 0  # graphs compiled so far (each new bucket or module structure compiles one)
        self.compile_seconds = 0.0  # wall time of the steps that compiled (tracing + inductor + that one step)
        self.compile_log: list[tuple[int, float]] = []  # (cache length, seconds) per compiled graph
        self.failure: str | None = None  # why compiling failed, once it has
        self._fn: Callable[..., Any] | None = None

    # -- caches ------------------------------------------------------------------------------------------------------

    def bucket(self, length: int) -> int | None:
        """The smallest bucket of at least `length` positions, or None when none is that long."""
        return next((b for b in self.buckets if b >= length), None)

    @staticmethod
    def length(cache: Any) -> int:
        """Positions a static cache holds (its first layer's count; all layers hold the same)."""
        return int(cache.layers[0].cumulative_length) if cache.layers[0].is_initialized else 0

    @staticmethod
    def capacity(cache: Any) -> int:
        return int(cache.layers[0].max_cache_len)

    @staticmethod
    def _set_length(cache: Any, length: int) -> None:
        for layer in cache.layers:
            layer.cumulative_length.fill_(length)  # in place: the compiled graph reads this tensor

    def prefill_into(
        self,
        config: Any,
        static: Any | None,
        start: int,
        need: int,
        run: Callable[[Any], Any],
    ) -> tuple[Any, Any]:
        """Run a prompt's new positions eagerly and store their keys/values in a static cache.

        Args:
            config: the model config (for the caches).
            static: the current static cache (its first `start` positions are the prompt's prefix), or None.
            start: positions of `static` to keep.
            need: positions the request may fill (prompt + max_tokens); picks the bucket.
            run: runs the model over a `DynamicCache` (seeded with the kept prefix) and returns the logits.

        Returns:
            (the static cache now holding the whole prompt, `run`'s logits). A new, larger cache is made when
            `static` is too short for `need` or holds nothing to keep.

        Raises:
            CompiledDecodeFailed: `need` is longer than the largest bucket.
        """
        from transformers import DynamicCache, StaticCache

        bucket = self.bucket(need)
        if bucket is None:
            raise CompiledDecodeFailed(f"{need} positions exceed the largest static cache bucket {self.buckets[-1]}")
        if static is not None and self.length(static) < start:
            raise ValueError(f"cannot keep {start} positions of a cache holding {self.length(static)}")
        dynamic = DynamicCache(config=config)
        if static is not None and start > 0:
            for i, layer in enumerate(static.layers):  # copies: the static buffers are overwritten later
                dynamic.update(layer.keys[:, :, :start], layer.values[:, :, :start], i)
        logits = run(dynamic)
        end = dynamic.get_seq_length()
        if static is None or start == 0 or self.capacity(static) < need:
            fresh = StaticCache(config=config, max_cache_len=bucket)
            for layer, src in zip(fresh.layers, dynamic.layers, strict=True):
                layer.lazy_initialization(src.keys, src.values)
            static, start = fresh, 0  # the seeded prefix is in `dynamic` too: copy everything
        for layer, src in zip(static.layers, dynamic.layers, strict=True):
            layer.keys[:, :, start:end].copy_(src.keys[:, :, start:end])
            layer.values[:, :, start:end].copy_(src.values[:, :, start:end])
        self._set_length(static, end)
        return static, logits

    def to_dynamic(self, static: Any, config: Any) -> Any:
        """A `DynamicCache` holding a copy of what `static` holds (for decoding on without the compiled step)."""
        from transformers import DynamicCache

        n = self.length(static)
        dynamic = DynamicCache(config=config)
        for i, layer in enumerate(static.layers):
            dynamic.update(layer.keys[:, :, :n], layer.values[:, :, :n], i)
        return dynamic

    # -- the compiled step -------------------------------------------------------------------------------------------

    def _compiler(self, gm: Any, example_inputs: Any) -> Any:
        """The backend torch.compile calls once per new graph: counts it, then hands it to the real backend."""
        self.compiles += 1
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches=self.options)
        if callable(self.backend):
            return self.backend(gm, example_inputs)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.backend)(gm, example_inputs)

    def step(self, model: Any, token: int, cache: Any, cache_kw: str) -> Any:
        """One compiled decode step of `token` over the static `cache`: the logits (1, vocab), float32.

        Call under `torch.inference_mode()`, with the model's decode attention set and with the thread count the
        step should run (inductor fixes a graph's thread count when it compiles it).

        Raises:
            CompiledDecodeFailed: compiling or running failed (the cache's length is as before the call).
        """
        import torch

        if self.failure is not None:
            raise CompiledDecodeFailed(self.failure)
        if self._fn is None:
            self._fn = torch.compile(_decode_step, backend=self._compiler, dynamic=False, fullgraph=True)
        before_len, before_compiles = self.length(cache), self.compiles
        ids = torch.tensor([[token]], dtype=torch.long)
        started = time.perf_counter()
        try:
            logits = self._fn(model, ids, cache, cache_kw)
        except Exception as exc:
            self._set_length(cache, before_len)
            self.failure = f"{type(exc).__name__}: {exc}".strip()[:2000]
            raise CompiledDecodeFailed(self.failure) from exc
        if self.compiles != before_compiles:
            seconds = time.perf_counter() - started
            self.compile_seconds += seconds
            self.compile_log.append((self.capacity(cache), seconds))
            log.info("compiled the decode step for a %d-position cache in %.1f s", self.capacity(cache), seconds)
        return logits
