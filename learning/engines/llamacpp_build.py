"""Build llama.cpp's libraries for llama-cpp-python, with CPU backend variants chosen at run time (issue 47).

`make install` installs llama-cpp-python's Python code only (`CMAKE_ARGS=-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF`) and
runs this module, which compiles the same release's vendored llama.cpp into the package's `lib` folder:

- `libllama`, `libggml`, `libggml-base` with `GGML_BACKEND_DL`: the CPU backend is a module loaded at run time;
- one CPU module per variant of `VARIANTS`, with llama.cpp's own feature sets (`GGML_CPU_ALL_VARIANTS` defines
  them); `learning.engines.cpu_backend` picks the best one the CPU runs, probing each once per machine.

Why its own build: llama-cpp-python's build compiles every CPU variant (14 on x86) or none, plus the multimodal
library this project never loads; the variants here are the x86 feature levels that differ in the kernels SmolLM2
runs (AVX2; AVX-512; AVX-512 with VBMI and VNNI; with BF16 as well; AVX-VNNI without AVX-512). AMX
(`sapphirerapids`) is left out: these VMs advertise it and raise SIGILL on it. `GGML_BACKEND_DIR` is this `lib`
folder, so a plain `llama_cpp.Llama` (the llama.cpp dev server) finds the modules too.

Each step's seconds are printed and kept in `lib/.rubricem-llamacpp.json`; a folder that already holds this build
(same release, variants, flags) is left as it is.

A finished build is also kept in a per-user cache (`--cache`; the Makefile passes `~/.cache/rubricem/llama.cpp`),
keyed by the release's pinned hash, the variants and the flags, with each file's SHA-256. A new clone on the same
machine copies it from there (about a second) instead of compiling again (about 3.5 minutes on 2 cores): the role
pip's wheel cache played while pip built llama-cpp-python. A cached file whose hash no longer matches is not used; the
build runs again and replaces the entry.

Who can change the libraries (issue 65, finding 10): llama.cpp's libraries run with this user's rights, so they are
trusted only from folders no other user can write. The cache is created 0700 whatever the umask, and it is used only
while every folder a lookup of it searches (links' targets included) belongs to this user or root and no one else can
write it (root's sticky folders such as /tmp excepted), the cache itself this user's (`files.private_dir`). A cache
that fails is neither read nor written: its manifest could have been rewritten along with its files, so the libraries
are built again from llama.cpp's pinned source instead. The installed libraries' digests are recorded in the stamp
(`files`), which counts only while the `lib` folder passes the same check, and `verify_installed` checks every
library against them before llama.cpp is loaded (`cpu_backend`, `llamacpp_engine`), not only when a file is copied.

Only the variants this CPU advertises are compiled, plus the portable baseline (`haswell`); the others are named,
with the features they need, in the output and in the stamp (`--variants` overrides the choice).

    python -m learning.engines.llamacpp_build [--jobs 2] [--variants auto|haswell,zen4] [--cache DIR]

A folder whose libraries no longer match their record is not "already built": the same command installs them again
(from the cache, or compiled), which is what `rebuild_command` names in every refusal.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from learning.engines.files import NotPrivate, file_problem, folder_problem, private_dir, sha256_file

RELEASE = "0.3.36"  # llama-cpp-python's version: pyproject's [llamacpp] extra pins the same
# SHA-256 of that release's source archive on PyPI, checked before anything from it is compiled (as the vLLM wheel's)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VARIANTS = ("haswell", "skylakex", "icelake", "zen4", "alderlake")
BASELINE = "haswell"  # the portable AVX2 level: always built, so a copied environment or a new CPU still has one
# Each variant's feature set as /proc/cpuinfo names it (llama.cpp's GGML_CPU_ALL_VARIANTS list in
# ggml/src/CMakeLists.txt; its AVX512 means F, CD, VL, DQ and BW). Issue 61: `make install` compiles only the variants
# this CPU advertises, plus the baseline; on a 2-core AMD EPYC without AVX-512 the four others took about 6 minutes.
_AVX2 = ("sse4_2", "avx", "f16c", "fma", "avx2", "bmi2")
_AVX512 = (*_AVX2, "avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")
FEATURES: dict[str, tuple[str, ...]] = {
    "haswell": _AVX2,
    "skylakex": _AVX512,
    "icelake": (*_AVX512, "avx512vbmi", "avx512_vnni"),
    "zen4": (*_AVX512, "avx512vbmi", "avx512_vnni", "avx512_bf16"),
    "alderlake": (*_AVX2, "avx_vnni"),
}
STAMP_FILENAME = ".rubricem-llamacpp.json"
_FORMAT = 1
_COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON", "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_CURL=OFF", "-DCMAKE_SKIP_BUILD_RPATH=ON",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)


DEFAULT_CACHE = "~/.cache/rubricem/llama.cpp"  # the Makefile's LLAMACPP_CACHE
LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"  # llama-cpp-python loads libllama from this folder when it is set


class BuildError(RuntimeError):
    """A step of the build failed; the message names it and the command to retry."""


class LibraryRefused(RuntimeError):
    """llama.cpp's libraries are not loaded: the message names the file or folder, why, and the command that installs
    them again."""


def rebuild_command() -> str:
    """The command that installs this build again: what `make install` runs (it runs only when its inputs changed)."""
    return f"{sys.executable} -m learning.engines.llamacpp_build --cache {DEFAULT_CACHE}"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's feature flags (the first `flags` line), or None where there is no /proc/cpuinfo to read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    line = next((x for x in text.splitlines() if x.startswith("flags")), None)
    return frozenset(line.split(":", 1)[1].split()) if line is not None and ":" in line else None


def choose_variants(flags: frozenset[str] | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """The variants to build for a CPU with `flags`, in VARIANTS order, and why each other one is left out.

    Every variant whose features the CPU advertises, plus BASELINE. Unknown flags (no /proc/cpuinfo): all of them.
    A variant the CPU advertises but faults on is still built; the run-time probe (`cpu_backend`) rejects it.
    """
    if flags is None:
        return VARIANTS, {}
    chosen, skipped = [], {}
    for v in VARIANTS:
        missing = [f for f in FEATURES[v] if f not in flags]
        if not missing or v == BASELINE:
            chosen.append(v)
        else:
            skipped[v] = f"this CPU lacks {', '.join(missing)}"
    return tuple(chosen), skipped


def default_variants() -> tuple[str, ...]:
    """What `make install` builds on this machine."""
    return choose_variants(cpu_flags())[0]


def package_lib_dir() -> Path:
    """llama-cpp-python's `lib` folder in this environment (located, never imported: it has no library yet)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise BuildError("llama-cpp-python is not installed; run `make install`")
    return Path(spec.origin).parent / "lib"


def _run(cmd: list[str], log: Path, what: str) -> None:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise BuildError(f"{what} failed (exit {done.returncode}); the last lines of {log}:\n" + "\n".join(tail)
                         + "\nRetry with `make install`.")


def _wanted(variants: tuple[str, ...]) -> dict[str, object]:
    return {"format": _FORMAT, "release": RELEASE, "variants": list(variants), "flags": list(_COMMON_FLAGS),
            "machine": platform.machine()}


def is_built(lib: Path, variants: tuple[str, ...]) -> bool:
    """Whether `lib` already holds this build, every file of it present and matching its recorded digest."""
    try:
        stamp = json.loads((lib / STAMP_FILENAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if {k: stamp.get(k) for k in _wanted(variants)} != _wanted(variants):
        return False
    return all((lib / n).exists() for n in _library_names(variants)) and library_problem(lib) is None


def installed_lib_dir() -> Path | None:
    """The folder llama-cpp-python loads llama.cpp from: `LLAMA_CPP_LIB_PATH` when set, else its package's `lib`
    (located, never imported: importing it loads the library). None when llama-cpp-python is not installed."""
    override = os.environ.get(LIB_PATH_ENV)
    if override:
        return Path(override)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "lib"


def _is_library(name: str) -> bool:
    return name.startswith("lib") and ".so" in name


def record_libraries(lib: Path) -> dict[str, str]:
    """Each library in `lib` (`lib*.so*`) with its SHA-256, or `link:<target>` for a link (the versioned names
    llama.cpp installs: `libllama.so -> libllama.so.0`): the record the stamp keeps and `library_problem` checks."""
    files = {}
    for f in sorted(lib.iterdir()):
        if _is_library(f.name):
            files[f.name] = f"link:{os.readlink(f)}" if f.is_symlink() else sha256_file(f, follow_links=False)
    return files


def library_problem(lib: Path) -> str | None:
    """Why llama.cpp's libraries in `lib` must not be loaded, or None when every one matches the digest recorded
    when it was installed.

    The record (the stamp's `files`) counts only because `lib` passed the privacy check first: in a folder another
    user can write, the stamp could have been rewritten along with the library. Every `lib*.so*` there must be
    recorded, since ggml loads any `libggml-*.so` from its backend folder, and a link must name a recorded file
    beside it.
    """
    try:
        return _library_problem(lib)
    except OSError as exc:  # a folder or file this user cannot read: nothing there is vouched for
        return f"llama.cpp's libraries in {lib} cannot be checked ({exc})"


def _library_problem(lib: Path) -> str | None:
    try:
        real = private_dir(lib, create=False, root_may_own=True)
    except FileNotFoundError:
        return f"llama.cpp's libraries are not installed ({lib} does not exist)"
    except NotPrivate as exc:
        return f"llama.cpp's libraries in {lib} are in a folder another user could change: {exc}"
    stamp_path = real / STAMP_FILENAME
    why = file_problem(stamp_path)
    if why is not None:
        return f"the record of llama.cpp's libraries is unusable: {why}"
    try:
        files = json.loads(stamp_path.read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError) as exc:
        return f"the record of llama.cpp's libraries {stamp_path} is unreadable ({exc})"
    if not isinstance(files, dict) or not files:
        return f"{stamp_path} records no digests of llama.cpp's libraries (installed before they were recorded)"
    present = {p.name for p in real.iterdir() if _is_library(p.name)}
    unrecorded = sorted(present - set(files))
    if unrecorded:
        return f"{real / unrecorded[0]} is not part of the recorded build (ggml would load it)"
    for stem in _CORE_STEMS:
        if f"{stem}.so" not in files:
            return f"the record in {stamp_path} lacks {stem}.so"
    for name, digest in sorted(files.items()):
        path = real / str(name)
        if "/" in str(name) or not isinstance(digest, str):
            return f"the record in {stamp_path} names {name!r}, not a library beside it"
        if digest.startswith("link:"):
            target = digest[len("link:"):]
            if "/" in target or target not in files or not path.is_symlink() or os.readlink(path) != target:
                return f"{path} is not the link to {target} it was when it was installed"
            continue
        why = file_problem(path)
        if why is not None:
            return why
        if sha256_file(path, follow_links=False) != digest:
            return f"{path} does not match the SHA-256 recorded when it was installed"
    return None


_verified: set[Path] = set()  # folders checked in this process: a library, once loaded, is not read again


def verify_installed(lib: Path | None = None) -> Path:
    """Check llama.cpp's libraries in `lib` (default: the folder llama-cpp-python loads them from) before any of them
    is loaded (`library_problem`); returns the folder. Called by every load path (`cpu_backend.load_cpu_backend`,
    `llamacpp_engine.LlamaCppEngine`, the CPU probe), once per process and folder.

    Raises:
        LibraryRefused: the file or folder that failed, why, and the command that installs the libraries again.
    """
    lib = lib if lib is not None else installed_lib_dir()
    if lib is None:
        raise LibraryRefused("llama-cpp-python is not installed; run `make install`")
    key = Path(os.path.realpath(lib))
    if key in _verified:
        return lib
    why = library_problem(lib)
    if why is not None:
        raise LibraryRefused(f"llama.cpp is not loaded: {why}. Install its libraries again with `{rebuild_command()}`")
    _verified.add(key)
    return lib


_CORE_STEMS = ("libllama", "libggml", "libggml-base")  # what the core build installs, beside one module per variant


def _library_names(variants: tuple[str, ...]) -> list[str]:
    return [f"{stem}.so" for stem in _CORE_STEMS] + [f"libggml-cpu-{v}.so" for v in variants]


def _stem(name: str) -> str:
    return name.split(".so")[0]  # libllama.so.0.5.0 -> libllama


def _ours(name: str) -> bool:
    """Whether `name` (in a `lib` folder) is a library this build installs, under any of its versioned names."""
    return _stem(name) in _CORE_STEMS or _stem(name).startswith("libggml-cpu-")


def cache_key(variants: tuple[str, ...]) -> str:
    """The cache entry's name: what makes two builds the same (release and its source hash, variants, flags)."""
    wanted = json.dumps({**_wanted(variants), "sdist": SDIST_SHA256}, sort_keys=True)
    return f"{RELEASE}-{hashlib.sha256(wanted.encode()).hexdigest()[:16]}"


def _clear_libraries(lib: Path) -> None:
    for stale in lib.glob("lib*.so*"):
        # ours from an earlier build, and a linked-in CPU backend or multimodal library from llama-cpp-python's own
        if _ours(stale.name) or _stem(stale.name) in ("libggml-cpu", "libmtmd"):
            stale.unlink()


def save_to_cache(lib: Path, cache: Path, variants: tuple[str, ...]) -> Path:
    """Copy the build in `lib` into `cache/<cache_key>` with a manifest of each file's SHA-256, or of each link's
    target (the versioned names llama.cpp installs: `libllama.so -> libllama.so.0`). It is written into a temporary
    folder, then renamed into place, so a reader never sees half an entry. Returns the entry.

    Raises:
        NotPrivate: `cache` is not private (`files.private_dir`, which creates it 0700): nothing is written.
    """
    cache = private_dir(cache)
    entry = cache / cache_key(variants)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=cache))
    try:
        files = {}
        for f in sorted(lib.glob("lib*.so*")):
            if _ours(f.name):
                shutil.copy2(f, tmp / f.name, follow_symlinks=False)
                files[f.name] = f"link:{os.readlink(f)}" if f.is_symlink() else sha256_file(f)
        stamp = json.loads((lib / STAMP_FILENAME).read_text(encoding="utf-8"))
        (tmp / "manifest.json").write_text(json.dumps({"files": files, "stamp": stamp}, indent=1), encoding="utf-8")
        shutil.rmtree(entry, ignore_errors=True)  # an entry that failed its check, being replaced
        os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def restore_from_cache(lib: Path, cache: Path, variants: tuple[str, ...]) -> str | None:
    """Install the cached build of `variants` into `lib`, its digests recorded in the stamp. Returns None when it was
    installed, else why not (a cache other users could change, no entry, a file missing or changed since it was
    cached); `lib` is left as it was in that case, unless the copy itself then failed its check.

    The manifest counts only because the cache passed the privacy check first: whoever can write the folder can
    rewrite the manifest along with the files it vouches for."""
    try:
        cache = private_dir(cache, create=False)
    except FileNotFoundError:
        return f"no build cache in {cache}"
    except NotPrivate as exc:
        return f"the build cache {cache} is refused: {exc}"
    except OSError as exc:
        return f"the build cache {cache} cannot be checked ({exc})"
    entry = cache / cache_key(variants)
    try:
        entry_problem = _entry_problem(entry)
    except FileNotFoundError:
        return f"no cached build in {entry}"
    if entry_problem is not None:
        return f"the cached build in {entry} is refused: {entry_problem}"
    try:
        manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
        files: dict[str, str] = manifest["files"]
        stamp = manifest["stamp"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no cached build in {entry}"
    if any("/" in name or not name.startswith("lib") for name in files):
        return f"the cached build in {entry} names a file outside it"
    for name in _library_names(variants):
        if name not in files:
            return f"the cached build in {entry} lacks {name}"
    for name, digest in files.items():
        path = entry / name
        if digest.startswith("link:"):
            if not path.is_symlink() or f"link:{os.readlink(path)}" != digest or "/" in digest:
                return f"the cached {path} is not the link it was"
        elif file_problem(path) is not None or sha256_file(path, follow_links=False) != digest:
            return f"the cached {path} changed since it was cached"
    lib.mkdir(parents=True, exist_ok=True)
    _clear_libraries(lib)
    for name in files:
        shutil.copy2(entry / name, lib / name, follow_symlinks=False)
    record = {**stamp, "from_cache": str(entry), "files": files}
    (lib / STAMP_FILENAME).write_text(json.dumps(record, indent=1), encoding="utf-8")
    return library_problem(lib)  # the copies, checked against the cache's digests


def _entry_problem(entry: Path) -> str | None:
    """Why a cache entry (a folder in the private cache) could have been changed by another user, or None. Raises
    FileNotFoundError when there is none."""
    if not os.path.lexists(entry):
        raise FileNotFoundError(entry)
    why = folder_problem(entry, leaf=True)
    return why if why is not None else file_problem(entry / "manifest.json")


def build(lib: Path, work: Path, variants: tuple[str, ...] = VARIANTS, jobs: int | None = None,
          say: object = print, skipped: dict[str, str] | None = None) -> dict[str, float]:
    """Download llama-cpp-python's source release, build the libraries and variants, install them into `lib`
    (`skipped`: the variants left out and why, kept in the stamp).

    Returns the seconds of each step. Raises BuildError with the failing step's log tail.
    """
    def emit(line: str) -> None:
        (say if callable(say) else print)(line)
        sys.stdout.flush()  # the Makefile's log shows each step as it ends
    steps: dict[str, float] = {}
    work.mkdir(parents=True, exist_ok=True)
    log = work / "build.log"
    log.write_text("", encoding="utf-8")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake is not installed; install it (Debian: `apt-get install cmake`) and run `make install`")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []

    t = time.monotonic()
    sdist_dir = work / "sdist"
    sdist = sdist_dir / f"llama_cpp_python-{RELEASE}.tar.gz"
    if not sdist.is_file():
        sdist_dir.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={RELEASE}", "-d", str(sdist_dir)], log, "downloading llama-cpp-python's source")
    digest = sha256_file(sdist)
    if digest != SDIST_SHA256:
        sdist.unlink()
        raise BuildError(f"llama-cpp-python {RELEASE}'s source archive has SHA-256 {digest}, not the pinned "
                         f"{SDIST_SHA256}; it was removed. Retry with `make install`.")
    src_root = work / "src"
    source = src_root / f"llama_cpp_python-{RELEASE}" / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        shutil.rmtree(src_root, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(src_root, filter="data")
    steps["download and unpack"] = round(time.monotonic() - t, 1)
    emit(f"llama.cpp {RELEASE}: source ready ({steps['download and unpack']} s)")

    backend_dir = [f"-DGGML_BACKEND_DIR={lib.resolve()}"]
    # the libraries, without a CPU backend (it is a module); then the variants, which link only ggml-base
    core, cpu = work / "build-core", work / "build-cpu"
    t = time.monotonic()
    _run([cmake, "-S", str(source), "-B", str(core), *generator, *_COMMON_FLAGS, *backend_dir, "-DGGML_CPU=OFF"],
         log, "configuring llama.cpp")
    parallel = ["-j", str(jobs)] if jobs else []
    _run([cmake, "--build", str(core), "--target", "llama", *parallel], log, "building libllama")
    steps["libllama, libggml"] = round(time.monotonic() - t, 1)
    emit(f"llama.cpp: libllama and libggml built ({steps['libllama, libggml']} s)")
    t = time.monotonic()
    _run([cmake, "-S", str(source), "-B", str(cpu), *generator, *_COMMON_FLAGS, *backend_dir,
          "-DGGML_CPU_ALL_VARIANTS=ON"], log, "configuring the CPU variants")
    steps["configure variants"] = round(time.monotonic() - t, 1)
    for v in variants:
        t = time.monotonic()
        _run([cmake, "--build", str(cpu), "--target", f"ggml-cpu-{v}", *parallel], log,
             f"building the CPU variant {v}")
        steps[f"variant {v}"] = round(time.monotonic() - t, 1)
        emit(f"llama.cpp: CPU variant {v} built ({steps[f'variant {v}']} s)")

    t = time.monotonic()
    lib.mkdir(parents=True, exist_ok=True)
    _clear_libraries(lib)
    for folder in (core / "bin", cpu / "bin"):
        for f in sorted(folder.glob("lib*.so*")):
            if f.name.startswith("libggml-cpu-") and f.name[len("libggml-cpu-"):-3] not in variants:
                continue
            if folder == cpu / "bin" and not f.name.startswith("libggml-cpu-"):
                continue  # the variants' own ggml-base is the same code as the core build's
            shutil.copy2(f, lib / f.name, follow_symlinks=False)
    steps["install"] = round(time.monotonic() - t, 1)
    stamp = {**_wanted(variants), "skipped": skipped or {}, "seconds": steps, "jobs": jobs,
             "built_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()), "files": record_libraries(lib)}
    (lib / STAMP_FILENAME).write_text(json.dumps(stamp, indent=1), encoding="utf-8")
    return steps


def _keep(lib: Path, cache: Path, variants: tuple[str, ...]) -> None:
    try:
        entry = save_to_cache(lib, cache, variants)
        print(f"llama.cpp {RELEASE}: kept in the build cache {entry}")
    except OSError as exc:  # a full or read-only home: the install itself is done
        print(f"warning: could not keep the build in {cache}: {exc}", file=sys.stderr)


def usable_cache(cache: Path) -> Path | None:
    """`cache`'s real path, created 0700 if missing, or None (why printed) when it is not private.

    Why a refused cache is not repaired (`chmod go-w`) and used: what it holds may already have been replaced, manifest
    and all, and a chmod would vouch for it. Why building is safe instead: the build uses only llama.cpp's source
    archive, checked against its pinned SHA-256, and installs into the environment's own `lib`, which `main` checks
    for privacy first. So a refused cache costs one compile (about 3.5 minutes on 2 cores) and nothing is read from
    it or written to it until its owner makes it private, or `--cache` names another folder.
    """
    try:
        return private_dir(cache)
    except NotPrivate as exc:
        print(f"llama.cpp: the build cache {cache} is refused, neither read nor written: {exc}. Building from the "
              "pinned source instead. To use a cache again, make the folder named private (`chmod go-w`; a cache "
              "others could write may hold their files, so remove it and it is made again, 0700) or pass another "
              "--cache", file=sys.stderr)
    except OSError as exc:  # a read-only home: the install itself can go on
        print(f"warning: cannot use the build cache {cache}: {exc}", file=sys.stderr)
    return None


def _check_lib_folder(lib: Path) -> None:
    """Refuse to install into a `lib` folder other users could change: its libraries would be refused when loaded
    (`verify_installed`), and its stamp could not vouch for them."""
    try:
        private_dir(lib, mode=0o755, root_may_own=True)
    except NotPrivate as exc:
        raise BuildError(f"llama.cpp's libraries would be installed in {lib}, which other users could change: {exc}. "
                         "`chmod go-w` the folder named, or make the environment again under umask 022 "
                         "(`make install`)") from exc
    except OSError as exc:
        raise BuildError(f"cannot create {lib}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=None,
                    help="parallel compile jobs (default: cmake's own, CMAKE_BUILD_PARALLEL_LEVEL, which the Makefile "
                         "sets to 2)")
    ap.add_argument("--variants", default="auto",
                    help=f"CPU variants to build, comma-separated from {','.join(VARIANTS)}; auto (the default): "
                         f"those this CPU advertises, plus {BASELINE}")
    ap.add_argument("--work", default=".cache/llama.cpp", help="download and build folder (default: %(default)s)")
    ap.add_argument("--cache", default=None,
                    help="a per-user folder that keeps finished builds for the next clone (default: none; the "
                         "Makefile passes ~/.cache/rubricem/llama.cpp)")
    ap.add_argument("--force", action="store_true", help="build even when the folder or the cache holds this build")
    args = ap.parse_args(argv)
    skipped: dict[str, str] = {}
    if args.variants == "auto":
        variants, skipped = choose_variants(cpu_flags())
        for v, why in skipped.items():
            print(f"llama.cpp: CPU variant {v} not built ({why})")
    else:
        variants = tuple(v for v in args.variants.split(",") if v)
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown or not variants:
            ap.error(f"unknown CPU variant(s) {unknown or args.variants!r}; choose from {', '.join(VARIANTS)}")
    cache = usable_cache(Path(args.cache).expanduser()) if args.cache else None
    try:
        lib = package_lib_dir()
        _check_lib_folder(lib)
        if not args.force and is_built(lib, variants):
            print(f"llama.cpp {RELEASE}: already built in {lib}")
            if cache is not None and not (cache / cache_key(variants) / "manifest.json").is_file():
                _keep(lib, cache, variants)  # an environment built before the cache existed
            return 0
        started = time.monotonic()
        if cache is not None and not args.force:
            why = restore_from_cache(lib, cache, variants)
            if why is None:
                print(f"llama.cpp {RELEASE}: copied from the build cache {cache / cache_key(variants)} into {lib} "
                      f"({time.monotonic() - started:.1f} s)")
                return 0
            print(f"llama.cpp {RELEASE}: building ({why})")
        build(lib, Path(args.work), variants, jobs=args.jobs, skipped=skipped)
        if cache is not None:
            _keep(lib, cache, variants)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"llama.cpp {RELEASE}: built in {time.monotonic() - started:.0f} s into {lib}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
