"""Which of llama.cpp's CPU backend variants this process runs (issue 47).

`make install` builds llama.cpp with its backends as loadable modules (`GGML_BACKEND_DL`) and several CPU variants
(`libggml-cpu-<name>.so`: haswell for AVX2, skylakex/icelake/zen4 for AVX-512 with VBMI, VNNI and BF16, alderlake for
AVX-VNNI), never the AMX one, which faults on the VMs this project runs on. Each variant says how well it fits the
CPU (`ggml_backend_score`, 0 when an instruction set it needs is missing). Before the first model is loaded,
`load_cpu_backend` registers the best-scoring variant that has not faulted on this machine; llama.cpp then skips its
own search (which looks only next to the Python executable and in the working folder).

Why not trust the score alone: a CPU can advertise an instruction set the hypervisor does not let a process run
(these VMs advertise AMX and raise SIGILL on it). So a variant runs a probe first, once per machine: a child process
loads it and the model, and evaluates a short prompt and a few single-token steps (the two kernel paths). A variant
whose probe crashes or fails is recorded with the reason and never chosen again on that machine; the next one down is
tried. The record lives beside the thread plan (`llamacpp-cpu.json` in the model cache), keyed by CPU model, CPU
flags' digest and llama-cpp-python version.

A llama-cpp-python built the ordinary way (the CPU backend linked in, no variant files) needs none of this:
`load_cpu_backend` then does nothing and returns None.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from learning.engines.files import file_lock, store_keyed
from learning.engines.llamacpp_build import LibraryRefused, installed_lib_dir, verify_installed
from learning.engines.threads import cpu_model

log = logging.getLogger(__name__)

RECORD_FILENAME = "llamacpp-cpu.json"
VARIANT_PREFIX = "libggml-cpu-"
PROBE_TIMEOUT_S = 120.0
_RECORD_FORMAT = 1

_lock = threading.Lock()
_loaded: CpuVariant | None = None
_load_done = False


class CpuBackendError(RuntimeError):
    """No CPU variant of llama.cpp can run on this machine (every candidate faulted or the CPU lacks them all)."""


@dataclass(frozen=True, slots=True)
class CpuVariant:
    """One CPU backend module: its name (`haswell`, `zen4`, ...), file and score on this CPU (0: cannot run)."""

    name: str
    path: Path
    score: int


def lib_dir() -> Path | None:
    """The folder llama-cpp-python loads `libllama.so` from (`llamacpp_build.installed_lib_dir`: its package's `lib`,
    located, not imported, or LLAMA_CPP_LIB_PATH), so the variants come from the same build as libllama."""
    return installed_lib_dir()


def variant_files(lib: Path) -> list[Path]:
    """The CPU variant modules in `lib` (none for a build with the CPU backend linked in)."""
    if not lib.is_dir():
        return []
    return sorted(p for p in lib.iterdir() if p.name.startswith(VARIANT_PREFIX) and p.name.endswith(".so"))


def _variant_name(path: Path) -> str:
    return path.name[len(VARIANT_PREFIX):-len(".so")]


def scored_variants(lib: Path) -> list[CpuVariant]:
    """Every variant in `lib` with its score on this CPU, best first.

    Loading a module runs none of its kernels (only its score function, plain C), so a variant that would fault can be
    scored safely; it stays mapped, as llama.cpp's own search leaves it.
    """
    out: list[CpuVariant] = []
    for path in variant_files(lib):
        try:
            module = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
            score_fn = module.ggml_backend_score
        except (OSError, AttributeError) as exc:
            log.warning("llama.cpp CPU variant %s cannot be loaded (%s); skipped", path.name, exc)
            continue
        score_fn.restype = ctypes.c_int
        out.append(CpuVariant(_variant_name(path), path, int(score_fn())))
    return sorted(out, key=lambda v: (-v.score, v.name))


def machine_record_key(lib: Path | None = None) -> str:
    """What a probe result holds for: the CPU model, a digest of its flags, llama-cpp-python's version and the
    build's stamp (`learning.engines.llamacpp_build`: a rebuild probes again)."""
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.split(":")[0].strip() in ("flags", "Features"):
                flags = " ".join(sorted(line.partition(":")[2].split()))
                break
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    try:
        from importlib.metadata import version

        llama_version = version("llama-cpp-python")
    except Exception:  # noqa: BLE001 - the key only needs to change when the build does
        llama_version = "?"
    build = "?"
    with contextlib.suppress(OSError):
        stamp = (lib or lib_dir() or Path(".")) / ".rubricem-llamacpp.json"
        build = hashlib.sha256(stamp.read_bytes()).hexdigest()[:12]
    return f"v{_RECORD_FORMAT} | {cpu_model()} | flags {digest} | llama-cpp-python {llama_version} | build {build}"


def _read_record(path: Path, key: str) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"ok": {}, "faulted": {}}
    entry = data.get(key) if isinstance(data, dict) else None
    if not isinstance(entry, dict):
        return {"ok": {}, "faulted": {}}
    return {"ok": dict(entry.get("ok") or {}), "faulted": dict(entry.get("faulted") or {})}


def _write_record(path: Path, key: str, record: dict[str, dict[str, str]]) -> None:
    try:
        store_keyed(path, key, record)
    except OSError as exc:  # a read-only cache only costs probing again next time
        log.info("could not record llama.cpp CPU variant probes in %s: %s", path, exc)


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


_MODEL_UNUSABLE = 3  # the probe's exit code when the model, not the variant, failed to load


def probe(variant: CpuVariant, gguf: Path, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Run `variant` on `gguf` in a child process; None when it worked, else why not (a crash's signal included).

    Raises:
        CpuBackendError: the model itself could not be loaded: that says nothing about the variant, so it is not
            recorded against it.
    """
    code = ("import sys; sys.path.insert(0, sys.argv[3]); from learning.engines.cpu_backend import _probe_main; "
            "_probe_main(sys.argv[1], sys.argv[2])")
    root = Path(__file__).resolve().parents[2]
    try:  # the child inherits this environment; the repository goes on its path by argument
        done = subprocess.run([sys.executable, "-c", code, str(variant.path), str(gguf), str(root)], cwd=root,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"the probe did not finish in {timeout_s:.0f} s"
    if done.returncode == 0:
        return None
    tail = " ".join(done.stderr.strip().splitlines()[-2:])[-300:]
    if done.returncode == _MODEL_UNUSABLE:
        raise CpuBackendError(tail or f"llama.cpp could not load {gguf}")
    return _describe_exit(done.returncode) + (f": {tail}" if tail else "")


def _probe_main(variant_path: str, gguf: str) -> None:
    """The probe's child process: load only this variant, then a prompt batch and single-token steps. The variant
    may live in another folder (a test's); its `libggml-base` is then the one llama-cpp-python already loaded (the
    dynamic loader matches libraries by their soname)."""
    lib = lib_dir() or Path(variant_path).parent
    try:
        verify_installed(lib)
    except LibraryRefused as exc:
        raise SystemExit(str(exc)) from exc
    ggml = ctypes.CDLL(str(lib / "libggml.so"), mode=os.RTLD_GLOBAL)
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    if not ggml.ggml_backend_load(variant_path.encode()):
        raise SystemExit(f"ggml_backend_load refused {variant_path}")
    import llama_cpp.llama_cpp as lc

    quiet = lc.llama_log_callback(lambda *_: None)  # kept referenced: llama.cpp calls it until the process ends
    lc.llama_log_set(quiet, ctypes.c_void_p(0))
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(gguf.encode(), lc.llama_model_default_params())
    if not model:
        print(f"llama.cpp could not load the model {gguf}", file=sys.stderr)
        raise SystemExit(_MODEL_UNUSABLE)
    cparams = lc.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_threads, cparams.n_threads_batch = 128, 64, 64, 1, 1
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    batch = lc.llama_batch_init(64, 0, 1)
    for start, n in ((0, 48), (48, 1), (49, 1), (50, 1)):  # a prompt batch (matrix-matrix), then one-token steps
        batch.n_tokens = n
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 1 + (start + i) % 100, start + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == n - 1
        if lc.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)


def _register(variant: CpuVariant) -> None:
    from learning.engines.llamacpp_log import install_log_callback

    install_log_callback()  # llama.cpp's own lines (the "loaded CPU backend" one too) go to Python logging
    ggml = ctypes.CDLL(str((lib_dir() or variant.path.parent) / "libggml.so"), mode=os.RTLD_GLOBAL)
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    if not ggml.ggml_backend_load(str(variant.path).encode()):
        raise CpuBackendError(f"llama.cpp refused its CPU backend {variant.path}")


def choose(variants: list[CpuVariant], gguf: Path, record_path: Path | None, forced: str | None = None) -> CpuVariant:
    """The variant to run: `forced` when named (it must exist and fit the CPU), else the best-scoring one that works.

    A variant is used without a probe when the record says it worked on this machine; otherwise it is probed, and the
    result is recorded. A failed probe logs a warning with the reason, and the next variant down is tried.

    Raises:
        CpuBackendError: no variant fits this CPU, every fitting one faulted, or `forced` is unknown or cannot run.
    """
    key = machine_record_key(variants[0].path.parent if variants else None)
    if forced:
        named = next((v for v in variants if v.name == forced), None)
        if named is None:
            raise CpuBackendError(f"no llama.cpp CPU variant {forced!r} is built (have: "
                                  f"{', '.join(v.name for v in variants) or 'none'})")
        if named.score <= 0:
            raise CpuBackendError(f"llama.cpp CPU variant {forced!r} needs instructions this CPU lacks")
        fault = _read_record(record_path, key)["faulted"].get(forced) if record_path is not None else None
        if fault:
            raise CpuBackendError(f"llama.cpp CPU variant {forced!r} faulted on this machine before ({fault})")
        return named
    fitting = [v for v in variants if v.score > 0]
    if not fitting:
        raise CpuBackendError("no llama.cpp CPU variant fits this CPU (built: "
                              f"{', '.join(v.name for v in variants) or 'none'}); rebuild with `make install`")
    with contextlib.ExitStack() as stack:
        if record_path is not None:
            with contextlib.suppress(OSError):
                record_path.parent.mkdir(parents=True, exist_ok=True)
                stack.enter_context(file_lock(record_path.with_name(f".{record_path.name}.lock")))
        record = _read_record(record_path, key) if record_path is not None else {"ok": {}, "faulted": {}}
        for v in fitting:
            if v.name in record["faulted"]:
                log.info("llama.cpp CPU variant %s skipped: it faulted here before (%s)", v.name,
                         record["faulted"][v.name])
                continue
            if v.name in record["ok"]:
                return v
            why = probe(v, gguf)
            if why is None:
                record["ok"][v.name] = "probe passed"
                if record_path is not None:
                    _write_record(record_path, key, record)
                return v
            log.warning("llama.cpp CPU variant %s faulted in its probe (%s); it will not be used on this machine",
                        v.name, why)
            record["faulted"][v.name] = why
            if record_path is not None:
                _write_record(record_path, key, record)
    raise CpuBackendError("every llama.cpp CPU variant that fits this CPU faulted: "
                          + "; ".join(f"{k}: {r}" for k, r in record["faulted"].items()))


def load_cpu_backend(gguf: Path, record_path: Path | None, forced: str | None = None) -> CpuVariant | None:
    """Register the CPU variant this process runs, once per process (see the module docstring); None for a build
    without variant files. A later call names the variant already loaded (llama.cpp cannot swap it).

    Raises:
        CpuBackendError: no variant can run here, or the libraries failed their check (`verify_installed`: a folder
            others could change, or a file that does not match its recorded digest); nothing was loaded then.
    """
    global _loaded, _load_done
    with _lock:
        if _load_done:
            if forced and _loaded is not None and forced != _loaded.name:
                log.warning("llama.cpp CPU variant %s asked for, but %s is already loaded in this process", forced,
                            _loaded.name)
            return _loaded
        lib = lib_dir()
        if lib is not None:
            try:
                verify_installed(lib)  # before any of them is mapped: loading runs a library's constructors
            except LibraryRefused as exc:
                raise CpuBackendError(str(exc)) from exc
        variants = scored_variants(lib) if lib is not None else []
        if not variants:
            _load_done = True
            return None
        chosen = choose(variants, Path(gguf), record_path, forced)
        _register(chosen)
        _loaded, _load_done = chosen, True
        others = ", ".join(f"{v.name} ({v.score})" for v in variants if v is not chosen)
        log.info("llama.cpp CPU backend: %s (score %d; others: %s)", chosen.name, chosen.score, others or "none")
        return chosen


def loaded_variant() -> CpuVariant | None:
    """The variant registered in this process, if any."""
    return _loaded
