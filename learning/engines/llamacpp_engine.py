"""llama.cpp as the embedded policy's sampling engine (issue 37): the bundled GGUF decoded in process, LoRA adapters
converted to GGUF and swapped at run time, token ids and the sampler's log-probs recorded for the trainer.

Why: on this 2-core machine llama.cpp decodes the 4-bit SmolLM2 at about 110 tokens/s, while torch's bf16 kernels
manage 15-25 (README, Speed). The split is the one vLLM and the trainer have on a GPU: the sampler draws the tokens in
its own precision, the trainer recomputes every log-prob in its own (`learning.update`: π_old is the trainer's,
tokens are weighted by the truncated importance ratio π_old / π_sampler, and a step whose sampler-trainer KL exceeds
`TrainConfig.max_sampler_kl` is skipped with the reason).

`EmbeddedLlamaCppClient` keeps everything above the forward pass identical to `TransformersPolicyClient`: the same
request surface (`learning.engines.client.EmbeddedClient`), Hugging Face tokenizer and chat template (so token ids
are the trainer's), the same sampler (`learning.engines.sampling`: seeded torch generator, temperature, stop strings,
EOS, LoopGuard), the same prefix reuse between a session's turns. Only
the logits come from llama.cpp, through its C API (`llama_cpp.llama_cpp`, the ctypes bindings of llama-cpp-python):
one context with one sequence, a batch per prompt chunk, and `llama_get_logits_ith` for the rows asked for.

Groups (`generate_group`) decode their rows one after another from one prefill of the shared prompt, each row from
the prompt's KV cache (llama.cpp's `llama_memory_seq_rm` drops the previous row's tokens): the same rows a fresh
`generate` per seed would give. Groups are used for reflection candidates, a few short rows; the trainer's rollouts
are whole sessions, one at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import PolicyUnavailable
from agent.protocols import Generation
from learning.engines.client import AdapterLoadError, EmbeddedClient, read_adapter_config
from learning.engines.cpu_backend import RECORD_FILENAME, CpuBackendError, load_cpu_backend
from learning.engines.gguf_lora import (
    GGUFConversionError,
    cached_file,
    cached_lora,
    cached_merged,
    cached_q8_base,
    forget,
    private_folder,
    recorded,
)
from learning.engines.llamacpp_build import LibraryRefused, verify_installed
from learning.engines.llamacpp_log import install_log_callback, last_errors
from learning.engines.weights import ModelConversionError, check_gguf, restore_hint
from learning.engines.sampling import Row, continuation_logprobs, sample
from learning.engines.threads import (
    PLAN_FILENAME,
    ContentionGuard,
    ThreadPlan,
    available_cpus,
    cached_plan,
    candidate_counts,
    machine_key,
    measure_plan,
    threads_restored,
    use_threads,
)

if TYPE_CHECKING:  # torch is imported lazily so that importing this module stays cheap
    import torch

log = logging.getLogger(__name__)

N_BATCH = 1024  # tokens per llama_decode call of a prompt: 5-10 % faster prefill than llama.cpp's 512 (issue 47)
ANCHOR_STATE_FORMAT = 1  # bump to stop loading system messages saved by an earlier version (`_anchor_file`)
def _llama_cpp_version() -> str:
    import llama_cpp

    return str(getattr(llama_cpp, "__version__", "?"))


class LlamaCppEngine:
    """One llama.cpp model and context with a single sequence: prompt chunks in, last-position logits out.

    Not thread-safe: the client holds its lock around every call.
    """

    def __init__(self, gguf: Path, *, n_ctx: int, threads: int, batch_threads: int,
                 cpu_record: Path | None = None, cpu_variant: str | None = None) -> None:
        try:  # before the import below, which loads libllama (issue 65: every library checked before it is loaded)
            verify_installed()
        except LibraryRefused as exc:
            raise PolicyUnavailable(str(exc)) from exc
        try:  # the first import of llama_cpp in the process (the container only looks its package up, issue 65)
            import llama_cpp.llama_cpp as lc
        except (ImportError, OSError, AttributeError) as exc:  # a missing dependency; a library that does not load, or
            # loads without the llama_* symbols this llama-cpp-python binds (ctypes raises AttributeError for those)
            raise PolicyUnavailable(f"llama-cpp-python is installed but does not import ({exc}); run `make install` "
                                    "again, or set RUBRICEM_AGENT__EMBEDDED_ENGINE=torch") from exc
        import numpy as np

        self._lc, self._np = lc, np
        install_log_callback()
        try:  # before llama_backend_init, which otherwise searches only beside the Python executable
            self.cpu_variant = load_cpu_backend(gguf, cpu_record, cpu_variant)
        except CpuBackendError as exc:
            raise PolicyUnavailable(f"llama.cpp cannot run here: {exc}") from exc
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        self._model = lc.llama_model_load_from_file(str(gguf).encode(), mparams)
        if not self._model:
            raise PolicyUnavailable(f"llama.cpp could not load {gguf}: {last_errors()}; {restore_hint(gguf)}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        self.n_batch = min(N_BATCH, n_ctx)  # llama.cpp aborts (not errs) on a batch larger than its context
        cparams.n_batch = cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads, cparams.n_threads_batch = threads, batch_threads
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lc.llama_model_free(self._model)
            raise PolicyUnavailable(f"llama.cpp could not create a context for {gguf}: {last_errors()}")
        self.n_ctx = int(lc.llama_n_ctx(self._ctx))
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self._model)))
        self.threads, self.batch_threads = threads, batch_threads
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._mem = lc.llama_get_memory(self._ctx)
        self.gguf = Path(gguf)
        self.adapter_file: Path | None = None  # the GGUF LoRA applied now
        self._adapter: Any = None
        self.n_past = 0  # positions in the KV cache
        self.guard: ContentionGuard | None = None  # backs off to one thread while the cores are oversubscribed

    def close(self) -> None:
        """Free the context and model (idempotent)."""
        lc = self._lc
        if self._ctx:
            lc.llama_batch_free(self._batch)
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lc.llama_model_free(self._model)  # frees its adapters too
            self._model = None

    def truncate(self, n: int) -> None:
        """Keep only the first `n` positions of the KV cache."""
        if n < self.n_past:
            self._lc.llama_memory_seq_rm(self._mem, 0, n, -1)
        self.n_past = min(n, self.n_past)

    def eval(self, tokens: Sequence[int], logits_from: int | None = None) -> Any:
        """Append `tokens` to the cache; return the logits (float32 numpy, rows × vocab) of the positions from index
        `logits_from` of `tokens` to the end (default: the last one only)."""
        np, lc = self._np, self._lc
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextTooLong(f"{self.n_past + len(tokens)} tokens exceed llama.cpp's context of {self.n_ctx}")
        first = len(tokens) - 1 if logits_from is None else logits_from
        rows: list[Any] = []
        b = self._batch
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            wanted: list[int] = []
            b.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                b.token[i] = int(tok)
                b.pos[i] = self.n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                want = start + i >= first
                b.logits[i] = want
                if want:
                    wanted.append(i)
            self._follow_guard()
            began = time.perf_counter()
            code = lc.llama_decode(self._ctx, b)
            if self.guard is not None:  # llama.cpp runs a one-token batch on `threads`, a longer one on `batch_threads`
                used = self.threads if len(chunk) == 1 else self.batch_threads
                self.guard.observe(time.perf_counter() - began, len(chunk), used)
            if code != 0:
                self.truncate(self.n_past)  # drop whatever part of the chunk entered the cache
                raise PolicyUnavailable(f"llama_decode failed with code {code}")
            self.n_past += len(chunk)
            for i in wanted:
                ptr = lc.llama_get_logits_ith(self._ctx, i)
                rows.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        return np.stack(rows)

    def save_prefix(self, path: Path, tokens: Sequence[int]) -> None:
        """Write the cache, which must hold exactly `tokens`, with those tokens to `path` (llama.cpp's own format).

        Raises:
            OSError: llama.cpp wrote nothing.
        """
        if self.n_past != len(tokens):
            raise ValueError(f"the cache holds {self.n_past} positions, not the {len(tokens)} to save")
        arr = (self._lc.llama_token * len(tokens))(*tokens)
        if not self._lc.llama_state_seq_save_file(self._ctx, str(path).encode(), 0, arr, len(tokens)):
            raise OSError(f"llama.cpp could not save its cache to {path}")

    def load_prefix(self, path: Path, tokens: Sequence[int]) -> bool:
        """Replace the cache by the one `save_prefix` wrote to `path`; False (and an empty cache) unless it loads
        and was saved for exactly `tokens`."""
        lc = self._lc
        self.truncate(0)
        arr = (lc.llama_token * len(tokens))()
        count = ctypes.c_size_t(0)
        read = lc.llama_state_seq_load_file(self._ctx, str(path).encode(), 0, arr, len(tokens), ctypes.byref(count))
        if read == 0 or count.value != len(tokens) or list(arr) != list(tokens):
            lc.llama_memory_seq_rm(self._mem, 0, 0, -1)  # whatever part of the file entered the cache
            return False
        self.n_past = len(tokens)
        return True

    def _follow_guard(self) -> None:
        if self.guard is not None:
            counts = self.guard.counts()
            if counts != (self.threads, self.batch_threads):
                self.set_threads(*counts)

    def set_threads(self, threads: int, batch_threads: int) -> None:
        """Threads of one-token steps and of prompt batches from the next decode on."""
        self._lc.llama_set_n_threads(self._ctx, int(threads), int(batch_threads))
        self.threads, self.batch_threads = int(threads), int(batch_threads)

    def stack(self, rows: Sequence[Any]) -> Any:
        """Logit rows as one (rows × vocab) array."""
        return self._np.stack(rows)

    def set_adapter(self, path: Path | None) -> None:
        """Serve `path` (a GGUF LoRA) on top of the base weights, or the base weights alone with None.

        Raises:
            AdapterLoadError: llama.cpp refused the file; the previous adapter stays active.
        """
        lc = self._lc
        new = None
        if path is not None:
            new = lc.llama_adapter_lora_init(self._model, str(path).encode())
            if not new:
                raise AdapterLoadError(f"llama.cpp refused the GGUF LoRA {path}: {last_errors()}")
        if new is None:
            code = lc.llama_set_adapters_lora(self._ctx, None, 0, None)
        else:
            adapters = (lc.llama_adapter_lora_p_ctypes * 1)(new)
            scales = (ctypes.c_float * 1)(1.0)
            code = lc.llama_set_adapters_lora(self._ctx, adapters, 1, scales)
        if code != 0:
            if new is not None:
                lc.llama_adapter_lora_free(new)
            raise AdapterLoadError(f"llama.cpp could not apply the adapter {path} (code {code})")
        if self._adapter is not None:
            lc.llama_adapter_lora_free(self._adapter)
        self._adapter, self.adapter_file = new, path
        self.truncate(0)  # cached keys/values came from the old weights


class EmbeddedLlamaCppClient(EmbeddedClient):
    """`PolicyClient` whose tokens llama.cpp decodes in this process (see the module docstring).

    Args (constructor):
        tokenizer_dir: the converted Hugging Face model folder (`ensure_converted`); its tokenizer and chat template
            are the trainer's.
        gguf: the base model GGUF (the bundled Q4_1 by default, or a de-quantized copy from `write_dense_gguf`).
        adapter_path: a PEFT LoRA folder to serve from the start (converted to GGUF LoRA and cached).
        version: the policy version name of the base weights, or of the adapter when one is given.
        lora_cache: where converted adapters are kept (one file per adapter content).
        merge_adapter: serve an adapter merged into a Q8_0 copy of the model (`gguf_lora.write_merged_gguf`, cached
            like the GGUF LoRA) instead of applied at run time: prompts prefill 1.6-1.9x faster (docs/speed.md), at the
            cost of a few seconds' conversion per new adapter and a swap that loads a model (about 0.3 s, against
            0.04 s for a GGUF LoRA). The base weights are served from `gguf` (or its Q8_0 copy) either way.
        base_q8: serve a Q8_0 copy of `gguf` (`gguf_lora.cached_q8_base`, converted once into `lora_cache`, about
            6 s and 145 MB) instead of the file itself. Why: llama.cpp's tiled prompt kernels take Q8_0 but not the
            bundled Q4_1, so a prompt prefills 1.4-1.8x faster, with the adapter as GGUF LoRA or without; but a
            one-token step reads twice the bytes, and the demo session, mostly such steps, ran slower per sampled
            token in an interleaved A/B (docs/speed.md): for prompt-heavy work. The values are the Q4_1 ones within a
            Q8_0 step. A copy that cannot be written is logged, and the file itself is served.
        threads, batch_threads: llama.cpp threads for one-token steps and for prompts. None: measured on this machine
            at the first start (`learning.engines.threads`: each count timed round-robin, the fastest kept, a larger
            count only when it is more than 3 % faster) and cached in `tokenizer_dir/../threads.json` (beside the torch
            engine's plan, under its own key) per CPU model and count. A measured plan of more than one thread backs
            off to one while the cores are oversubscribed (`learning.engines.threads.ContentionGuard`); fixed counts are
            used as given.
        n_ctx: the KV cache size; None = the model's trained context (8,192 for SmolLM2).
        cpu_variant: the llama.cpp CPU backend variant to run (`learning.engines.cpu_backend`); None: the best one
            this CPU runs, probed once per machine (recorded in `tokenizer_dir/../llamacpp-cpu.json`).
        reuse_prefix: keep the KV cache for a prompt that extends the previous one, and prefill a new prompt's
            system message apart so that it can be kept too (`_prefill`).
        persist_anchor: also save that system message's state in `lora_cache` and load it in a new process
            (`_anchor_file`); only with `reuse_prefix`.
    """

    def __init__(
        self,
        tokenizer_dir: Path | str,
        gguf: Path | str,
        *,
        adapter_path: Path | str | None = None,
        version: str = "base",
        lora_cache: Path | str,
        threads: int | None = None,
        batch_threads: int | None = None,
        n_ctx: int | None = None,
        reuse_prefix: bool = True,
        cpu_variant: str | None = None,
        merge_adapter: bool = False,
        base_q8: bool = False,
        persist_anchor: bool = True,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        try:
            self._gguf = check_gguf(Path(gguf))
        except ModelConversionError as exc:
            raise PolicyUnavailable(str(exc)) from exc
        if base_q8:
            try:
                self._gguf = cached_q8_base(self._gguf, Path(lora_cache))
            except GGUFConversionError as exc:
                log.warning("serving %s as it is: %s", self._gguf, exc)
        tokenizer_dir = Path(tokenizer_dir)
        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        config = AutoConfig.from_pretrained(str(tokenizer_dir))
        self._max_context = int(getattr(config, "max_position_embeddings", 0) or 0) or None
        cpus = available_cpus()
        self._lora_cache, self._merge = Path(lora_cache), merge_adapter
        self._cpu_record = tokenizer_dir.parent / RECORD_FILENAME
        merged = self._converted(Path(adapter_path)) if merge_adapter and adapter_path is not None else None
        self._engine = LlamaCppEngine(merged or self._gguf, n_ctx=n_ctx or self._max_context or 4096,
                                      threads=threads or 1, batch_threads=batch_threads or threads or cpus,
                                      cpu_record=self._cpu_record, cpu_variant=cpu_variant)
        variant = self._engine.cpu_variant
        self._max_context = min(self._max_context or self._engine.n_ctx, self._engine.n_ctx)
        if threads is None:
            key = machine_key(f"llama.cpp {self._gguf.name}", f"llama-cpp-python {_llama_cpp_version()}"
                              + (f" cpu-{variant.name}" if variant is not None else ""))
            plan = cached_plan(tokenizer_dir.parent / PLAN_FILENAME, key, self._probe_threads)
            self._engine.set_threads(plan.decode, batch_threads or plan.prefill)
        measured = threads is None
        self.threads = ThreadPlan(decode=self._engine.threads, prefill=self._engine.batch_threads,
                                  source=plan.source if measured else "fixed", timings=plan.timings if measured else {})
        self._engine.guard = ContentionGuard.for_plan(self.threads, "llama.cpp")  # None for fixed counts
        self._eos_ids = self._collect_eos_ids(tokenizer_dir)
        super().__init__()  # the model lock
        self._reuse_prefix = reuse_prefix
        self._persist_anchor = persist_anchor and reuse_prefix
        self._cache_ids: list[int] = []  # the token ids whose keys/values are in the engine's cache
        self._last_prompt: tuple[int, ...] = ()
        self._turn_start = turn_start_id(self._tokenizer)
        self._anchor_len = 0  # leading cached positions that hold a system message prefilled on its own
        self._adapter_version: str | None = None
        self._adapter_path: Path | None = None
        self._base_version = "base" if adapter_path is not None else version
        if merged is not None:  # the engine already holds the adapter's weights
            if not version:
                raise ValueError("an adapter needs a non-empty version name")
            self._adapter_version, self._adapter_path = version, Path(adapter_path)  # type: ignore[arg-type]
        elif adapter_path is not None:
            self.load_adapter(adapter_path, version)

    # -- PolicyClient ------------------------------------------------------------------------------------------------

    @property
    def policy_version(self) -> str:
        """The version that will serve the next request."""
        return self._adapter_version or self._base_version

    @property
    def engine(self) -> LlamaCppEngine:
        """The llama.cpp engine (thread counts, context size), read-only use."""
        return self._engine

    def _release(self) -> None:
        self._engine.close()

    # -- adapters ----------------------------------------------------------------------------------------------------

    def load_adapter(self, path: Path | str, version: str) -> None:
        """Serve the PEFT LoRA adapter in `path` under `version` from the next request on.

        The adapter is converted to a GGUF LoRA (cached by content) before the lock is taken, so a request in
        progress is not held up by the conversion; it finishes on the old weights.

        Raises:
            AdapterLoadError: not a LoRA folder, or it does not fit the base model (`GGUFConversionError`, with the
                reason), or llama.cpp refused it (the converted file then leaves the cache); the old weights stay
                active. The message names the file that failed.
        """
        path = Path(path)
        if not version:
            raise ValueError("an adapter needs a non-empty version name")
        if self._closed:
            raise PolicyUnavailable("the embedded policy client is closed")
        converted = self._converted(path)
        try:
            engine = self._new_engine(converted) if self._merge else None  # loaded before the lock, like the conversion
        except AdapterLoadError as exc:
            raise self._refused(converted, path, exc) from exc
        try:
            with self._lock:
                if self._closed:
                    raise PolicyUnavailable("the embedded policy client is closed")
                if engine is not None:
                    self._swap_engine(engine)
                    engine = None
                else:
                    try:
                        self._engine.set_adapter(converted)
                    except AdapterLoadError as exc:
                        raise self._refused(converted, path, exc) from exc
                self._adapter_version, self._adapter_path = version, path
                self._invalidate_cache()
        finally:
            if engine is not None:
                engine.close()
        log.info("policy adapter %s loaded from %s (llama.cpp, %s)", version, path, converted.name)

    def unload_adapter(self) -> None:
        """Serve the base weights again."""
        if self._adapter_version is None or self._closed:
            return
        engine = self._new_engine(self._gguf) if self._merge else None
        try:
            with self._lock:
                if self._adapter_version is None or self._closed:
                    return
                if engine is not None:
                    self._swap_engine(engine)
                    engine = None
                else:
                    self._engine.set_adapter(None)
                self._adapter_version = self._adapter_path = None
                self._invalidate_cache()
        finally:
            if engine is not None:
                engine.close()
        log.info("policy adapter unloaded; serving %s", self._base_version)

    def _converted(self, path: Path) -> Path:
        """The adapter in `path` as the GGUF this client serves it from: a GGUF LoRA, or with `merge_adapter` the
        model with the adapter merged in (both cached by content).

        Raises:
            AdapterLoadError: not a LoRA folder, or it does not convert for the base model (the reason is given).
        """
        read_adapter_config(path)
        try:
            return (cached_merged if self._merge else cached_lora)(path, self._gguf, self._lora_cache)
        except GGUFConversionError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the conversion is a refused adapter
            raise GGUFConversionError(f"could not convert {path} to a GGUF for llama.cpp: {exc}") from exc

    @staticmethod
    def _refused(converted: Path, path: Path, exc: AdapterLoadError) -> AdapterLoadError:
        """The error of a converted file llama.cpp would not load, once that file is out of the cache.

        Why: the cache vouches for a file by the digest recorded as it was written, not by llama.cpp having read it,
        so a file it cannot load (a writer that stopped short without an error, or a file corrupted before its digest
        was taken) would be served again by every later load of the same adapter, in this process and the next.
        Forgotten, the next load converts the adapter again.
        """
        forget(converted)
        return AdapterLoadError(f"{exc}; {converted} was removed from the cache, so the next load of {path} converts "
                                "it again")

    def _new_engine(self, gguf: Path) -> LlamaCppEngine:
        """An engine on `gguf` with this client's context size, CPU variant, thread counts and contention guard."""
        old = self._engine
        try:
            engine = LlamaCppEngine(gguf, n_ctx=old.n_ctx, threads=old.threads, batch_threads=old.batch_threads,
                                    cpu_record=self._cpu_record,
                                    cpu_variant=old.cpu_variant.name if old.cpu_variant else None)
        except PolicyUnavailable as exc:
            raise AdapterLoadError(f"llama.cpp could not load {gguf.name}: {exc}") from exc
        engine.guard = old.guard
        return engine

    def _swap_engine(self, engine: LlamaCppEngine) -> None:
        """Serve from `engine` and free the old one (lock held)."""
        old, self._engine = self._engine, engine
        old.close()

    # -- internals ---------------------------------------------------------------------------------------------------

    def _probe_threads(self) -> ThreadPlan:
        """The thread plan, measured in a child process on the same GGUF and CPU variant (`probe_threads`).

        Why a child: measured on the 2-core machine, a process whose engine had run at one thread and then at two
        (what the probe does) decoded 1.6x slower for the rest of its life (200 tokens in 10.7 s against 6.9 s; a first
        `make demo` session 78 s against 36 s), with nothing logged; the same happened after a torch product on two
        threads in the calling thread. The probe's state dies with the child.
        """
        variant = self._engine.cpu_variant
        code = ("import json, sys; sys.path.insert(0, sys.argv[3]); "
                "from learning.engines.llamacpp_engine import probe_threads; "
                "print(json.dumps(probe_threads(sys.argv[1], sys.argv[2] or None)))")
        root = Path(__file__).resolve().parents[2]
        done = subprocess.run([sys.executable, "-c", code, str(self._gguf), variant.name if variant else "", str(root)],
                              cwd=root, capture_output=True, text=True, timeout=300, check=False)
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode != 0 or not lines:
            log.warning("the llama.cpp thread probe failed (%s); decoding on %d thread(s) until it succeeds",
                        done.stderr.strip().splitlines()[-1:] or f"exit {done.returncode}", self._engine.threads)
            return ThreadPlan(decode=self._engine.threads, prefill=self._engine.batch_threads, source="fixed")
        data = json.loads(lines[-1])
        return ThreadPlan(decode=int(data["decode"]), prefill=int(data["prefill"]), source="measured",
                          timings=data["timings"])

    def _collect_eos_ids(self, model_dir: Path) -> frozenset[int]:
        from transformers import GenerationConfig

        ids: set[int] = set()
        with contextlib.suppress(OSError, ValueError):
            gen_eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
            if isinstance(gen_eos, int):
                ids.add(gen_eos)
            elif isinstance(gen_eos, (list, tuple)):
                ids.update(int(v) for v in gen_eos)
        if isinstance(self._tokenizer.eos_token_id, int):
            ids.add(self._tokenizer.eos_token_id)
        return frozenset(ids)

    def _invalidate_cache(self) -> None:
        self._engine.truncate(0)
        self._cache_ids = []
        self._last_prompt = ()
        self._anchor_len = 0

    @contextlib.contextmanager
    def _holding_model(self) -> Iterator[str]:
        """The model lock, on an open client, with torch on one thread for the sampler's few vector operations.

        Why one: llama.cpp's worker threads spin for a while after each step, so torch's own thread team (one per
        core by default) competes with them for the same cores at every token; the sampled rate was 72 % of llama.cpp's
        own (43 against 60 tok/s on 2 cores) before, the vector work itself being well under a millisecond.
        """
        with self._lock, threads_restored():
            self._check_open()
            use_threads(1)
            yield self.policy_version

    def _prefill(self, prompt: tuple[int, ...]) -> torch.Tensor:
        """The prompt's last-position logits, reusing the cached prefix when the prompt extends the last one, or
        else its system message when the cache holds the same one (`anchor_end`)."""
        start = anchor = 0
        if (self._reuse_prefix and self._last_prompt and len(prompt) > len(self._last_prompt)
                and prompt[: len(self._last_prompt)] == self._last_prompt):
            n = min(len(self._cache_ids), len(prompt) - 1)
            start = next((i for i in range(n) if self._cache_ids[i] != prompt[i]), n)
        elif self._reuse_prefix:
            anchor = anchor_end(prompt, self._turn_start)
            if anchor and self._anchor_len == anchor and self._cache_ids[:anchor] == list(prompt[:anchor]):
                start = anchor
        if start < self._anchor_len:
            self._anchor_len = 0
        self._engine.truncate(start)
        self._cache_ids = list(prompt[:start])
        self._last_prompt = prompt
        if anchor and start == 0:  # the canonical first piece: the system message on its own
            if not self._load_anchor(prompt[:anchor]):
                self._engine.eval(prompt[:anchor])
                self._save_anchor(prompt[:anchor])
            self._cache_ids.extend(prompt[:anchor])
            start = self._anchor_len = anchor
        logits = self._engine.eval(prompt[start:])
        self._cache_ids.extend(prompt[start:])
        return _tensor(logits[0])

    def _anchor_file(self, tokens: Sequence[int]) -> Path | None:
        """Where the keys and values of the system message `tokens` are saved for this engine, or None when the
        cache folder is not private (`private_folder`) or saving is off.

        Why (issue 47): every new process (`make demo`, `rubricem ask`, a batch, a restarted server) and every
        adapter swap prefilled the same 700-token system message again, about 2.8 s of a 32 s demo session on 2
        cores; loading it takes milliseconds. The key holds everything the values depend on: the weights served (the
        GGUF and the GGUF LoRA, both named by content), the CPU variant and batch size (their kernels' rounding), the
        llama.cpp release and the tokens, so a loaded cache is what prefilling would compute, bit for bit
        (tests/policy/test_llamacpp_engine.py). The system message holds the scaffold and the tools' descriptions,
        never a user's text. A file that no longer matches the digest recorded beside it is written again.
        """
        if not self._persist_anchor:
            return None
        e = self._engine
        try:
            folder = private_folder(self._lora_cache)
            size = e.gguf.stat().st_size
        except (GGUFConversionError, OSError) as exc:
            log.debug("system messages are not saved: %s", exc)
            return None
        parts = [ANCHOR_STATE_FORMAT, _llama_cpp_version(), e.gguf.name, size,
                 e.adapter_file.name if e.adapter_file else None, e.cpu_variant.name if e.cpu_variant else None,
                 e.n_batch, list(tokens)]
        return folder / f"anchor-{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]}.state"

    def _load_anchor(self, tokens: Sequence[int]) -> bool:
        """Whether the system message `tokens` came from its saved file (the cache then holds exactly them)."""
        path = self._anchor_file(tokens)
        if path is None or not recorded(path):
            return False
        if self._engine.load_prefix(path, tokens):
            return True
        log.warning("llama.cpp could not load the saved system message %s; prefilling it and saving it again", path)
        forget(path)
        return False

    def _save_anchor(self, tokens: Sequence[int]) -> None:
        """Save the system message just prefilled (once per key; a failure only costs the next process a prefill)."""
        path = self._anchor_file(tokens)
        if path is None or recorded(path):
            return
        try:
            cached_file(path, lambda p: self._engine.save_prefix(p, tokens))
        except (OSError, ValueError, GGUFConversionError) as exc:
            log.warning("could not save the system message's cache to %s: %s", path, exc)

    def _step(self, token: int) -> torch.Tensor:
        logits = self._engine.eval([token])
        self._cache_ids.append(token)
        return _tensor(logits[0])

    def _generate_locked(self, prompt: tuple[int, ...], stops: tuple[str, ...], max_tokens: int,
                         temperature: float, seed: int | None) -> Generation:
        with self._holding_model() as version:
            try:
                row = Row(self, seed, stops, max_tokens, temperature, version)
                return sample(row, self._prefill(prompt), self._step)
            except BaseException:
                self._invalidate_cache()
                raise

    def _group_locked(self, prompt: tuple[int, ...], stops: tuple[str, ...], max_tokens: int, temperature: float,
                      seeds: tuple[int | None, ...]) -> list[Generation]:
        with self._holding_model() as version:
            try:
                first = self._prefill(prompt)
                out: list[Generation] = []
                for seed in seeds:
                    self._engine.truncate(len(prompt))
                    self._cache_ids = list(prompt)
                    row = Row(self, seed, stops, max_tokens, temperature, version)
                    out.append(sample(row, first.clone(), self._step))
                return out
            except BaseException:
                self._invalidate_cache()
                raise

    def _score_locked(self, prompt: tuple[int, ...], cont: tuple[int, ...], temperature: float) -> tuple[float, ...]:
        with self._holding_model():
            # One token at a time, as the sampler decodes: a batched pass runs other kernels in llama.cpp (its
            # matrix-matrix products round differently; measured up to 0.25 apart), and scores must be the sampler's.
            try:
                self._engine.truncate(0)
                rows = [self._engine.eval(prompt)[0]] + [self._engine.eval([t])[0] for t in cont[:-1]]
            finally:
                self._invalidate_cache()  # the cache now holds this text, not the session's
            return continuation_logprobs(_tensor(self._engine.stack(rows)), cont, temperature)


def turn_start_id(tokenizer: Any) -> int | None:
    """The special token that opens every turn of the chat template (ChatML's `<|im_start|>`), or None when the
    template's first token is not special (then no system message is reused across prompts)."""
    try:  # rendered and tokenized as `render_prompt` does
        text = tokenizer.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)
        ids = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    except Exception:  # noqa: BLE001 - no or an odd template: nothing to anchor on
        return None
    return ids[0] if ids and ids[0] in set(tokenizer.all_special_ids) else None


def anchor_end(prompt: Sequence[int], turn_start: int | None) -> int:
    """Where a prompt's system message ends: at its second turn-start token; 0 when it has none.

    Why: a new session's prompt shares its system message (about 600 of SmolLM2's 760 first-prompt tokens) with the
    last session's, but does not extend it, so only the last-prompt rule would prefill it again (2-3 s at 250 tok/s).
    A prompt that does not extend the last one is always prefilled in two pieces, the system message and the rest,
    so reusing a cached system message computes exactly what prefilling it would: the same tokens at the same
    positions in the same batch (llama.cpp's results depend on how a prompt is split into batches), and results stay
    independent of unrelated earlier requests.
    """
    if turn_start is None or not prompt or prompt[0] != turn_start:
        return 0
    try:
        return list(prompt).index(turn_start, 1)
    except ValueError:
        return 0


def _tensor(logits: Any) -> torch.Tensor:
    """llama.cpp's logits (a float32 NumPy array, a fresh copy per call) as the tensor the sampler takes."""
    import torch

    return torch.from_numpy(logits)


def probe_threads(gguf: str, cpu_variant: str | None) -> dict[str, Any]:
    """A thread plan's measurement, run in the child process `EmbeddedLlamaCppClient._probe_threads` starts: one-token
    steps and a 64-token prompt at each candidate count (`threads.measure_plan`) on a fresh engine."""
    engine = LlamaCppEngine(Path(gguf), n_ctx=256, threads=1, batch_threads=1, cpu_variant=cpu_variant)
    prompt = list(range(1000, 1064))

    def decode_step() -> None:
        engine.set_threads(count[0], count[0])
        engine.truncate(len(prompt))
        engine.eval([prompt[0]])

    def prefill() -> None:
        engine.set_threads(count[0], count[0])
        engine.truncate(0)
        engine.eval(prompt)

    count = [1]
    counts = candidate_counts(available_cpus())
    engine.eval(prompt)

    def at(fn: Any) -> Any:  # measure_plan sets torch's count; llama.cpp's follows it
        import torch

        def run() -> None:
            count[0] = torch.get_num_threads()
            fn()
        return run

    try:
        plan = measure_plan(counts, at(decode_step), at(prefill))
    finally:
        engine.close()
    return {"decode": plan.decode, "prefill": plan.prefill, "timings": plan.timings}
