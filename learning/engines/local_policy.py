"""The torch engine: SmolLM2-135M-Instruct run in-process with transformers, with hot-swappable LoRA.

`TransformersPolicyClient` implements `agent.protocols.PolicyClient` on the bf16 folder `learning.engines.weights`
converts from the bundled GGUF (no server, no GPU, no network). What it shares with the llama.cpp engine (the
request surface, the sampler) is in `learning.engines.client` and `learning.engines.sampling`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.protocols import Generation
from learning.engines.client import AdapterLoadError, EmbeddedClient, read_adapter_config
from learning.engines.compiled_decode import DEFAULT_BUCKETS, CompiledDecode, CompiledDecodeFailed
from learning.engines.decode_kernels import onednn_disabled, register_gqa_attention
from learning.engines.threads import (
    ContentionGuard,
    PLAN_FILENAME,
    ThreadPlan,
    available_cpus,
    cached_plan,
    candidate_counts,
    machine_key,
    measure_plan,
    threads_restored,
    use_threads,
)
from learning.engines.sampling import Row, continuation_logprobs, sample

if TYPE_CHECKING:  # torch/transformers are imported lazily so that importing this module stays cheap
    import torch

log = logging.getLogger(__name__)

NATIVE_MATMUL_MAX_ROWS = 2  # decode steps of at most this many rows use ATen's native products (decode_matmul)
PROBE_PROMPT_TOKENS = 64  # the prompt the thread probe times (learning.engines.threads.measure_plan)


@dataclass(frozen=True, slots=True)
class _Adapter:
    name: str  # PEFT adapter name (a module-safe key)
    version: str  # the policy version it serves, e.g. "policy@3"
    path: Path


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class TransformersPolicyClient(EmbeddedClient):
    """`PolicyClient` that runs a causal LM (by default the bundled SmolLM2) in this process.

    Generation is a manual decoding loop over a KV cache, one request at a time: each request runs in a worker
    thread (`asyncio.to_thread`) and holds a lock for its whole duration. `generate_group` decodes N samples of one
    prompt as one request (one prefill, one batched forward per step). Adapter swaps take the same lock, so a
    request in progress finishes on the old weights and the next one uses the new ones.

    The KV cache of the previous request is reused when the new prompt strictly extends the previous prompt (the
    next turn of the same research session); otherwise the prompt is prefilled from scratch. This keeps results
    independent of unrelated earlier requests: the same session replayed with the same seed computes the same way.

    Threads (`learning.engines.threads`): one-token decode steps of at most two rows run `threads.decode` CPU threads;
    prompts, scoring and group steps of more rows run `threads.prefill` (matrix-matrix products use every core, a
    one-token step mostly waits on memory and on small kernels, where more threads only add synchronisation). By
    default both counts are measured on this machine at start (the fastest of 1..CPUs, about 2 s) and cached in the
    model cache folder. On the shared 2-core development machine both came out 1: with the other core idle, 2
    threads took 62 ms per decode step against 60 and 84 ms per 64-token prompt against 83; with it busy, 2.4 s per
    step. So a measured plan of more than one thread backs off to one for a minute or more after a forward six times
    slower than measured (`threads.ContentionGuard`; fixed counts are used as given, and the compiled step
    follows the back-off without timing its own steps). The count is switched (`torch.set_num_threads`, only when it
    changes, about a microsecond) in the worker thread that runs the request, and that thread's previous count is put
    back when the request ends. torch's setting is process-wide for MKL and for threads that have not yet run torch
    work, so such a thread starting during a request inherits the phase's count.

    `compile=True` runs one-token decode steps of `generate` as a compiled graph over a static KV cache
    (`learning.engines.compiled_decode`). In bf16 its log-probs differ from the eager kernels' by up to ~0.2 (a fused
    kernel rounds to bf16 once where eager rounds every op), so greedy tokens are the same except at near-ties (the
    SFT adapter on one benchmark prompt: top two within 0.01 at the second token, where an eager full forward also
    disagrees with eager decoding). Prompts, scoring and `generate_group` stay eager. Each cache-length bucket and
    module structure (base, adapter) compiles once, on its first step: 1.5 to 3.5 minutes on the 2-core machine, 10
    to 30 s when inductor's on-disk cache already holds the graph (a later start). `load_adapter` then copies a
    compatible adapter's weights into the loaded adapter's tensors (same rank, alpha and target modules), which needs
    no new graph. Measured there (one thread, greedy, 128 tokens behind 870 prompt tokens): 10.2 → 15.5 decode
    tokens/s on the base weights, 9.4 → 14.7 with the SFT adapter. A compile that fails logs one warning and decoding
    goes on eagerly.
    """

    def __init__(
        self,
        model_dir: Path | str,
        dtype: str = "bfloat16",
        adapter_path: Path | str | None = None,
        version: str = "base",
        threads: int | None = None,
        reuse_prefix: bool = True,
        decode_attention: str = "gqa",
        decode_matmul: str = "native",
        merge_adapter: bool = False,
        prefill_threads: int | None = None,
        compile: bool = False,
        compile_backend: str | Callable[..., Any] = "inductor",
        compile_buckets: Sequence[int] = DEFAULT_BUCKETS,
    ) -> None:
        """Load the tokenizer and model (blocking, about 0.3 s for the converted SmolLM2).

        Args:
            model_dir: a Hugging Face model folder (e.g. from `ensure_converted`).
            dtype: "bfloat16" (faster on CPUs with avx512_bf16) or "float32".
            adapter_path: a PEFT LoRA adapter folder to load at start.
            version: the policy version name; the base model's when no adapter is given, else the adapter's.
            threads: CPU threads of one-token decode steps. 0 or None: measured on this machine (the fastest count,
                cached per CPU model, CPU count, torch version and dtype in `<model_dir>/../threads.json`; see
                `learning.engines.threads`). A fixed count also serves prompts and scoring unless `prefill_threads` says
                otherwise, and measures nothing.
            reuse_prefix: reuse the KV cache when a prompt extends the previous one (see the class docstring).
            decode_attention: "gqa", "eager" or "sdpa", the attention kernel of one-token decode steps
                (`_use_attention`; "gqa" is `learning.engines.decode_kernels.gqa_attention`).
            decode_matmul: "native" (ATen's kernels) or "onednn", the CPU matrix products of one-token decode steps
                (`learning.engines.decode_kernels.onednn_disabled`); prompts and scoring always use oneDNN.
            merge_adapter: serve a loaded adapter folded into the weights (`_merge_for_serving`): one product per
                layer instead of three, but bf16 rounding of the merged weights changes the outputs slightly.
            prefill_threads: CPU threads of prompts, scoring and group steps of more than two rows; None: measured
                (with `threads` 0/None) or equal to a fixed `threads`.
            compile: compile the one-token decode step of `generate` (see the class docstring).
            compile_backend: the `torch.compile` backend of that step ("inductor", or any backend; tests inject a
                failing one to check the fallback).
            compile_buckets: the static KV cache lengths a compiled step is built for.
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype must be 'bfloat16' or 'float32', not {dtype!r}")
        if decode_attention not in ("gqa", "eager", "sdpa"):
            raise ValueError(f"decode_attention must be 'gqa', 'eager' or 'sdpa', not {decode_attention!r}")
        if decode_matmul not in ("native", "onednn"):
            raise ValueError(f"decode_matmul must be 'native' or 'onednn', not {decode_matmul!r}")
        self._decode_attention = register_gqa_attention() if decode_attention == "gqa" else decode_attention
        self._decode_matmul = decode_matmul
        self._merge_adapter = merge_adapter
        self._merged = False  # the active adapter is folded into the base weights
        self._pristine: dict[str, Any] = {}  # module name -> its base weight before any merge (merge_adapter only)
        for name, value in (("threads", threads), ("prefill_threads", prefill_threads)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be an int >= 0 or None, not {value!r}")
        self._threads: ThreadPlan | None = None  # set below; None while the probe measures
        self._compiled = CompiledDecode(compile_backend, compile_buckets) if compile else None
        self._compile_warned = False
        self._model_dir = Path(model_dir)
        if not (self._model_dir / "config.json").is_file():
            raise FileNotFoundError(f"no Hugging Face model in {self._model_dir} (config.json missing)")
        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(self._model_dir))
        self._model: Any = AutoModelForCausalLM.from_pretrained(str(self._model_dir), dtype=getattr(torch, dtype))
        self._model.eval()
        self._peft: Any = None  # a PeftModel wrapping self._model while an adapter is loaded
        self._adapter: _Adapter | None = None
        self._adapter_seq = 0
        self._base_version = "base" if adapter_path is not None else version
        super().__init__()  # the model lock
        self._reuse_prefix = reuse_prefix
        self._cache: Any = None
        self._cache_static = False  # `_cache` is the compiled step's StaticCache (else a DynamicCache)
        self._cache_arg: str | None = None
        self._cache_ids: list[int] = []
        self._last_prompt: tuple[int, ...] = ()
        self._eos_ids = self._collect_eos_ids()
        self._max_context = int(getattr(self._model.config, "max_position_embeddings", 0) or 0) or None
        self._guard: ContentionGuard | None = None  # none while the probe measures
        self._threads = self._plan_threads(threads or None, prefill_threads or None, dtype)
        self._guard = ContentionGuard.for_plan(self._threads, "torch")  # one thread while the cores are oversubscribed
        if adapter_path is not None:
            self.load_adapter(adapter_path, version)

    # -- PolicyClient (the rest is EmbeddedClient's) -----------------------------------------------------------------

    @property
    def policy_version(self) -> str:
        """The version that will serve the next request: the adapter's version, or the base version."""
        adapter = self._adapter
        return adapter.version if adapter is not None else self._base_version

    @property
    def threads(self) -> ThreadPlan:
        """The thread counts of decode steps and of prompts, and where they came from (fixed, measured, cached)."""
        assert self._threads is not None
        return self._threads

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling decode steps so far (0.0 without `compile`)."""
        return self._compiled.compile_seconds if self._compiled is not None else 0.0

    @property
    def compile_stats(self) -> dict[str, Any]:
        """The compiled decode step's state: enabled, graphs compiled, seconds, (cache length, seconds) per graph,
        and the failure that switched it off (None while it works)."""
        c = self._compiled
        if c is None:
            return {"enabled": False, "compiles": 0, "compile_seconds": 0.0, "graphs": [], "failure": None}
        return {"enabled": c.failure is None, "compiles": c.compiles, "compile_seconds": round(c.compile_seconds, 3),
                "graphs": list(c.compile_log), "failure": c.failure}

    def _release(self) -> None:
        self._invalidate_cache()

    # -- LoRA adapters -----------------------------------------------------------------------------------------------

    def load_adapter(self, path: Path | str, version: str) -> None:
        """Load a PEFT LoRA adapter and make it serve every later request under `version`.

        Blocks until a request in progress has finished (it completes on the old weights). The previous adapter, if
        any, is removed; the base weights are never modified. With `compile`, an adapter of the same rank, alpha and
        target modules as the loaded one is copied into the loaded one's tensors instead (`_hotswap`), so the
        compiled decode step needs no new graph.

        Raises:
            AdapterLoadError: the folder is not a LoRA adapter for this model; the old weights stay active.
        """
        path = Path(path)
        if not version:
            raise ValueError("an adapter needs a non-empty version name")
        config = read_adapter_config(path)
        with self._lock:
            self._unmerge()
            if self._hotswap(path, config):
                assert self._adapter is not None
                self._adapter = _Adapter(name=self._adapter.name, version=version, path=path)
                self._invalidate_cache()
                log.info("policy adapter %s copied in from %s (no new compiled graph)", version, path)
                return
            self._adapter_seq += 1
            name = f"adapter{self._adapter_seq}"  # PEFT keys modules by this name; versions may contain '@', '.'
            old = self._adapter
            try:
                with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5 (FutureWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                    if self._peft is None:
                        from peft import PeftModel

                        self._peft = PeftModel.from_pretrained(self._model, str(path), adapter_name=name, config=config)
                    else:
                        self._peft.load_adapter(str(path), adapter_name=name)
                        self._peft.set_adapter(name)
            except Exception as exc:
                self._recover_after_failed_load(old, name)
                raise AdapterLoadError(f"could not load LoRA adapter from {path}: {exc}") from exc
            if old is not None:
                self._peft.delete_adapter(old.name)
            self._model.eval()
            self._adapter = _Adapter(name=name, version=version, path=path)
            self._invalidate_cache()
        log.info("policy adapter %s loaded from %s", version, path)

    def unload_adapter(self) -> None:
        """Remove the LoRA adapter and serve the untouched base weights again (no-op without an adapter)."""
        with self._lock:
            if self._peft is None:
                return
            self._unmerge()
            self._model = self._peft.unload()  # puts the original Linear modules back: outputs equal the base's
            self._model.eval()
            self._peft = None
            self._adapter = None
            self._invalidate_cache()
        log.info("policy adapter unloaded; serving %s", self._base_version)

    # -- internals ---------------------------------------------------------------------------------------------------

    def _collect_eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        gen_eos = getattr(getattr(self._model, "generation_config", None), "eos_token_id", None)
        for value in (gen_eos, self._tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return frozenset(ids)

    def _recover_after_failed_load(self, old: _Adapter | None, name: str) -> None:
        """Undo a half-done adapter load so the previous weights keep serving."""
        if self._peft is None:
            # PeftModel.from_pretrained may have injected LoRA layers into the base model before failing.
            from peft.tuners.tuners_utils import BaseTunerLayer

            if any(isinstance(m, BaseTunerLayer) for m in self._model.modules()):
                log.warning("a failed adapter load left LoRA layers behind; reloading the base model")
                from transformers import AutoModelForCausalLM

                dtype = next(self._model.parameters()).dtype
                self._model = AutoModelForCausalLM.from_pretrained(str(self._model_dir), dtype=dtype)
                self._model.eval()
            return
        with contextlib.suppress(Exception):
            if name in self._peft.peft_config:
                self._peft.delete_adapter(name)
        if old is not None:
            self._peft.set_adapter(old.name)

    def _hotswap(self, path: Path, config: Any) -> bool:
        """With `compile`: copy the adapter at `path` into the loaded adapter's tensors (lock held, unmerged).

        Why: loading it under a new name and deleting the old one changes the modules the compiled graph was traced
        through (adapter names are guarded), so every swap would compile again (minutes on 2 cores); copied
        weights are graph inputs, so the same graph serves them. Only an adapter with the loaded one's rank, alpha,
        rank/alpha patterns and target modules, and a file of exactly its tensors' names and shapes (`_same_tensors`),
        is copied; any other is loaded the ordinary way (False), which compiles once more.
        """
        if self._compiled is None or self._peft is None or self._adapter is None:
            return False
        loaded = self._peft.peft_config.get(self._adapter.name)
        same = loaded is not None and all(
            getattr(loaded, key, None) == getattr(config, key, None)
            for key in ("r", "lora_alpha", "rank_pattern", "alpha_pattern", "use_rslora", "use_dora")
        ) and set(loaded.target_modules or ()) == set(config.target_modules or ())
        if not same:
            log.info("adapter %s differs in rank, alpha or targets from the loaded one: loading it as a new adapter "
                     "(the compiled decode step compiles again)", path)
            return False
        if not self._same_tensors(path):
            log.info("adapter %s holds other tensors than the loaded one (names or shapes): loading it as a new "
                     "adapter, which checks them", path)
            return False
        from peft.utils.hotswap import hotswap_adapter

        device = str(next(self._model.parameters()).device)
        try:
            with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5 (FutureWarning)
                warnings.simplefilter("ignore", FutureWarning)
                hotswap_adapter(self._peft, str(path), adapter_name=self._adapter.name, torch_device=device)
        except Exception as exc:  # the ordinary load replaces whatever was copied
            log.info("could not copy adapter %s into the loaded one (%s); loading it as a new adapter", path, exc)
            return False
        self._model.eval()
        return True

    def _same_tensors(self, path: Path) -> bool:
        """Whether the adapter file at `path` holds exactly the loaded adapter's LoRA tensors, by name and shape.

        Why: PEFT's hot swap checks names only, then zeroes the loaded tensors the file lacks and puts a tensor of
        another shape in place of the loaded one (`torch.utils.swap_tensors`). A file whose config matches but one of
        whose matrices does not (a writer's bug, a file edited by hand) was copied in without an error, the new
        version reported as serving, and every request after it failed in a matrix product. The ordinary load checks
        shapes and, when it fails, leaves the old adapter serving. Reads the file's header only.
        """
        from safetensors import safe_open

        assert self._adapter is not None and self._peft is not None
        weights = path / "adapter_model.safetensors"
        if not weights.is_file():
            return False
        infix = f".{self._adapter.name}."  # PEFT's keys name the adapter; the saved file's do not
        loaded = {k.replace(infix, "."): tuple(v.shape) for k, v in self._peft.state_dict().items()
                  if ".lora_" in k and infix in k}
        try:
            with safe_open(str(weights), framework="pt") as fh:
                found = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
        except Exception:  # noqa: BLE001 - changed since it was checked: the ordinary load raises AdapterLoadError
            return False
        return found == loaded

    def _merge_for_serving(self) -> None:
        """With `merge_adapter`, fold the active adapter into the base weights before it serves (lock held).

        Why: unmerged, every adapted layer runs three products (base, A, B) and PEFT's dtype casts; merged, one.
        Measured on the demo session (bf16, one thread): 54.7 s unmerged, 46.5 s merged. Why it is not the default:
        the merged weights are rounded to bf16, so outputs differ from the unmerged model's by that rounding (greedy
        tokens diverged in the demo session's third turn). Each layer's base weight is copied once before its first
        merge, and `_unmerge` restores that copy, so swapping adapters never drifts the base weights (subtracting
        the delta again in bf16 would).
        """
        if not self._merge_adapter or self._adapter is None or self._merged or self._peft is None:
            return
        from peft.tuners.lora import LoraLayer

        name = self._adapter.name
        self._merged = True  # set first: a failure half-way is undone by `_unmerge` from the saved copies
        self._invalidate_cache()  # the cached keys/values came from the unmerged weights
        try:
            for key, module in self._peft.named_modules():
                if isinstance(module, LoraLayer) and name in module.lora_A:
                    if key not in self._pristine:
                        self._pristine[key] = module.get_base_layer().weight.detach().clone()
                    module.merge(adapter_names=[name])
        except BaseException:
            self._unmerge()
            raise

    def _unmerge(self) -> None:
        """Undo `_merge_for_serving` exactly: the base weights get their saved copies back (lock held)."""
        if not self._merged or self._peft is None:
            self._merged = False
            return
        import torch
        from peft.tuners.lora import LoraLayer

        with torch.no_grad():
            for key, module in self._peft.named_modules():
                if isinstance(module, LoraLayer) and key in self._pristine:
                    if module.merged:
                        module.unmerge()
                    module.get_base_layer().weight.copy_(self._pristine[key])
        self._merged = False
        self._invalidate_cache()

    def _invalidate_cache(self) -> None:
        self._cache = None
        self._cache_static = False
        self._cache_ids = []
        self._last_prompt = ()

    def _plan_threads(self, threads: int | None, prefill_threads: int | None, dtype: str) -> ThreadPlan:
        """The thread counts of the two phases: fixed ones as given, else measured or read from the plan file."""
        if threads is not None:
            return ThreadPlan(decode=threads, prefill=prefill_threads or threads, source="fixed")
        plan = cached_plan(self._model_dir.parent / PLAN_FILENAME, machine_key(dtype, self._model_dir.name),
                           self._probe_threads)
        return replace(plan, prefill=prefill_threads) if prefill_threads is not None else plan

    def _probe_threads(self) -> ThreadPlan:
        """Time one-token decode steps (behind a 64-token prompt) and a 64-token prompt at each candidate count
        (`learning.engines.threads.measure_plan`, about 2 s), with the kernels the requests use."""
        import torch
        from transformers import DynamicCache

        counts = candidate_counts(available_cpus())
        if len(counts) == 1:
            return ThreadPlan(decode=1, prefill=1, source="measured")
        vocab = int(self._model.config.vocab_size)
        prompt = [(1000 + 37 * i) % vocab for i in range(PROBE_PROMPT_TOKENS)]
        config = self._model.config
        with torch.inference_mode(), threads_restored():
            use_threads(1)  # the context's prompt: torch's default count can be very slow on a busy machine
            cache = DynamicCache(config=config)
            self._forward([prompt], cache, logits_to_keep=1)

            def decode_step() -> None:
                self._forward([[prompt[-1]]], cache)
                cache.crop(-1)  # keep the context length fixed across steps

            def prefill() -> None:
                self._forward([prompt], DynamicCache(config=config), logits_to_keep=1)

            return measure_plan(counts, decode_step, prefill)

    @contextlib.contextmanager
    def _holding_model(self) -> Iterator[str]:
        """Hold the model lock on an open client; yields the policy version, which cannot change until released."""
        with self._lock, threads_restored():  # the phases switch this worker thread's count (`_forward`)
            self._check_open()
            self._merge_for_serving()
            yield self.policy_version

    def _generate_locked(
        self, prompt: tuple[int, ...], stops: tuple[str, ...], max_tokens: int, temperature: float, seed: int | None
    ) -> Generation:
        with self._holding_model() as version:
            try:
                return self._generate(prompt, stops, max_tokens, temperature, seed, version)
            except BaseException:
                self._invalidate_cache()  # the cache may hold a partial step
                raise

    def _score_locked(self, prompt: tuple[int, ...], cont: tuple[int, ...], temperature: float) -> tuple[float, ...]:
        import torch

        with self._holding_model():
            ids = torch.tensor([prompt + cont], dtype=torch.long)
            self._use_attention(ids.shape[1])
            self._use_threads(ids.shape[1], 1)
            with torch.inference_mode():
                logits = self._model(input_ids=ids, use_cache=False, logits_to_keep=len(cont) + 1).logits[0, :-1]
                return continuation_logprobs(logits.float(), cont, temperature)

    def _prefill(self, prompt: tuple[int, ...], max_tokens: int = 0) -> torch.Tensor:
        """Run the prompt through the model (reusing the cache when allowed); return the last position's logits.

        With a working compiled step the prompt ends up in a static cache of a bucket holding `max_tokens` more
        positions (`CompiledDecode.prefill_into`); otherwise in a DynamicCache.
        """
        from transformers import DynamicCache

        start = 0
        if (
            self._reuse_prefix
            and self._cache is not None
            and len(prompt) > len(self._last_prompt)
            and prompt[: len(self._last_prompt)] == self._last_prompt
        ):
            start = min(_common_prefix_len(self._cache_ids, prompt), len(prompt) - 1)
        compiled = self._compiled
        if compiled is not None and compiled.failure is None and compiled.bucket(len(prompt) + max_tokens):
            static = self._cache if self._cache_static else None
            start = start if static is not None else 0
            self._last_prompt = prompt

            def run(cache: Any) -> torch.Tensor:
                return self._forward([list(prompt[start:])], cache, logits_to_keep=1)

            self._cache, logits = compiled.prefill_into(self._model.config, static, start, len(prompt) + max_tokens,
                                                        run)
            self._cache_static = True
            self._cache_ids = self._cache_ids[:start] + list(prompt[start:])
            return logits[0]
        if self._cache_static:  # no compiled step for this request: go on from a dynamic copy of the cache
            assert compiled is not None
            self._cache, self._cache_static = compiled.to_dynamic(self._cache, self._model.config), False
        if start > 0:
            drop = len(self._cache_ids) - start
            if drop > 0:
                self._cache.crop(-drop)  # transformers 5: a negative count removes that many trailing positions
            self._cache_ids = self._cache_ids[:start]
        if start == 0 or self._cache.get_seq_length() != start:
            start = 0
            self._cache = DynamicCache(config=self._model.config)
            self._cache_ids = []
        self._last_prompt = prompt
        logits = self._forward([list(prompt[start:])], self._cache, logits_to_keep=1)
        self._cache_ids.extend(prompt[start:])
        return logits[0]

    def _cache_kw(self) -> str:
        """The forward argument that takes the KV cache: `cache` from transformers 5.2x, `past_key_values` before
        (still accepted, with a FutureWarning on every run's first forward)."""
        if self._cache_arg is None:
            model = self._model.get_base_model() if hasattr(self._model, "get_base_model") else self._model
            params = inspect.signature(type(model).forward).parameters
            self._cache_arg = "cache" if "cache" in params else "past_key_values"
        return self._cache_arg

    def _forward(self, ids: list[list[int]], cache: Any, **kw: Any) -> torch.Tensor:
        """One forward of `ids` (one row per sequence) over `cache`; each row's last-position logits, in float32."""
        import torch

        self._use_attention(len(ids[0]))
        self._use_threads(len(ids[0]), len(ids))
        # ATen's native products win for one or two rows, oneDNN's from four (see learning/engines/decode_kernels.py)
        native = self._decode_matmul == "native" and len(ids[0]) == 1 and len(ids) <= NATIVE_MATMUL_MAX_ROWS
        began = time.perf_counter()
        with onednn_disabled(native):
            out = self._model(input_ids=torch.tensor(ids, dtype=torch.long), **{self._cache_kw(): cache},
                              use_cache=True, **kw)
        logits = out.logits[:, -1].float()
        if self._guard is not None and len(ids) == 1:
            self._guard.observe(time.perf_counter() - began, len(ids[0]), torch.get_num_threads())
        return logits

    def _use_attention(self, new_tokens: int) -> None:
        """The attention kernel for a forward of `new_tokens` positions per row.

        Measured on this CPU (tests/benchmarks/attention_context.py, one thread): a one-token step behind a 3,000-token
        cache takes 156 ms with `sdpa` and 82 ms with `eager`, while a 3,000-token prompt takes 15 s with `sdpa` and
        49 s with `eager` (eager writes out every query-key score). So prompts and scoring run `sdpa`, decode steps
        the `decode_attention` argument's kernel (by default `gqa`: eager's arithmetic without copying the cache, see
        `decode_kernels`; "sdpa" keeps one kernel throughout); all read the same KV cache, and the switch
        (transformers' `set_attn_implementation`) is a config change, made only when the phase changes.
        """
        want = self._decode_attention if new_tokens == 1 else "sdpa"
        if self._model.config._attn_implementation != want:
            self._model.set_attn_implementation(want)

    def _use_threads(self, new_tokens: int, rows: int) -> None:
        """The thread count of a forward of `rows` × `new_tokens` (see the class docstring); none while probing."""
        plan = self._threads
        if plan is not None:
            one_token = new_tokens == 1 and rows <= NATIVE_MATMUL_MAX_ROWS
            decode, prefill = self._guard.counts() if self._guard is not None else (plan.decode, plan.prefill)
            use_threads(decode if one_token else prefill)

    def _step(self, token: int) -> torch.Tensor:
        if self._cache_static:
            assert self._compiled is not None
            self._use_attention(1)
            self._use_threads(1, 1)
            try:
                with onednn_disabled(self._decode_matmul == "native"):
                    logits = self._compiled.step(self._model, token, self._cache, self._cache_kw())
            except CompiledDecodeFailed as exc:
                self._compile_failed(exc)
            else:
                self._cache_ids.append(token)
                return logits[0]
        logits = self._forward([[token]], self._cache)
        self._cache_ids.append(token)
        return logits[0]

    def _compile_failed(self, exc: CompiledDecodeFailed) -> None:
        """The compiled step failed: warn once, and decode on eagerly from a dynamic copy of the cache."""
        assert self._compiled is not None
        if not self._compile_warned:
            self._compile_warned = True
            log.warning("the compiled decode step is unavailable (%s); decoding with the eager kernels instead. "
                        "Set RUBRICEM_AGENT__EMBEDDED_COMPILE=false to skip the attempt.", exc)
        self._cache, self._cache_static = self._compiled.to_dynamic(self._cache, self._model.config), False

    def _generate(
        self,
        prompt: tuple[int, ...],
        stops: tuple[str, ...],
        max_tokens: int,
        temperature: float,
        seed: int | None,
        version: str,
    ) -> Generation:
        import torch

        row = Row(self, seed, stops, max_tokens, temperature, version)
        with torch.inference_mode():
            return sample(row, self._prefill(prompt, max_tokens), self._step)

    def _group_locked(
        self,
        prompt: tuple[int, ...],
        stops: tuple[str, ...],
        max_tokens: int,
        temperature: float,
        seeds: tuple[int | None, ...],
    ) -> list[Generation]:
        """N continuations of one prompt, decoded together: one prefill, its KV cache repeated to N rows, then one
        batched forward per step for the unfinished rows.

        In float32 the token ids equal the single path's and the logprobs agree to ~1e-5; in bf16 a batched matmul
        rounds differently from a one-row one, so logprobs agree to ~1e-2 and a sampled token can flip where two
        choices are almost tied (then the rows diverge from there on).

        All active rows always have the same length (same prompt, one token each per step), so no padding or
        attention mask is needed; a finished row is dropped from the batch and from the KV cache
        (`DynamicCache.batch_select_indices`). The session's own KV cache (`self._cache`) is left alone.
        """
        with self._holding_model() as version:
            return self._decode_group(prompt, stops, max_tokens, temperature, seeds, version)

    def _decode_group(self, prompt: tuple[int, ...], stops: tuple[str, ...], max_tokens: int, temperature: float,
                      seeds: tuple[int | None, ...], version: str) -> list[Generation]:
        import torch
        from transformers import DynamicCache

        rows = [Row(self, s, stops, max_tokens, temperature, version) for s in seeds]
        results: list[Generation | None] = [None] * len(rows)
        with torch.inference_mode():
            cache = DynamicCache(config=self._model.config)
            logits = self._forward([list(prompt)], cache, logits_to_keep=1).expand(len(rows), -1)  # one prompt
            active = list(range(len(rows)))  # row index of each batch position
            batch = 1  # the cache's batch size (1 after the prefill)
            while active:
                keep: list[int] = []  # batch positions whose row goes on
                for j, r in enumerate(active):
                    done = rows[r].push(logits[j])
                    if done is None:
                        keep.append(j)
                    else:
                        results[r] = done
                if not keep:
                    break
                if batch == 1:
                    if len(keep) > 1:
                        cache.batch_repeat_interleave(len(keep))
                elif len(keep) < len(active):
                    cache.batch_select_indices(torch.tensor(keep, dtype=torch.long))
                active = [active[j] for j in keep]
                batch = len(active)
                logits = self._forward([[rows[r].ids[-1]] for r in active], cache)
        return [g for g in results if g is not None]

