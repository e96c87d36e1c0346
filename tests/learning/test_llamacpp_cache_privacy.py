"""Who can change the llama.cpp libraries this program loads (issue 65, findings 10 and 11).

The libraries are small real shared objects compiled here, each with a constructor that appends a line to the file
named by RUBRICEM_TEST_MARKER: a library that was loaded, even for an instant, leaves that line. They are installed
the way a second clone installs them (`save_to_cache`, then `restore_from_cache`) into folders under the test's own
temporary folder, and loaded in a child process through the product's load paths, pointed at them with
LLAMA_CPP_LIB_PATH (the variable llama-cpp-python itself reads). The real cache and the installed libraries are never
touched, and nothing is compiled but the tiny library.

Real folders, modes, owners and links throughout; another user is root's `chown` to `nobody` where that is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from learning.engines import llamacpp_build
from learning.engines.gguf_lora import GGUFConversionError, private_folder
from learning.engines.llamacpp_build import STAMP_FILENAME, restore_from_cache, save_to_cache

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("haswell",)
TAG = b"rubricem-test-library-A"
LIBRARY_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
static const char tag[] = "rubricem-test-library-A";
__attribute__((constructor)) static void loaded(void) {
    const char *marker = getenv("RUBRICEM_TEST_MARKER");
    FILE *f = marker ? fopen(marker, "a") : NULL;
    if (f) { fputs(tag, f); fputc('\n', f); fclose(f); }
}
"""
NOBODY = 65534


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a shared object that says when it is loaded (see the module docstring)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler: `make install` needs one to build llama.cpp", pytrace=False)
    folder = tmp_path_factory.mktemp("library")
    (folder / "tell.c").write_text(LIBRARY_SOURCE, encoding="utf-8")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "tell.so"), str(folder / "tell.c")], check=True)
    return (folder / "tell.so").read_bytes()


@pytest.fixture
def umask_002() -> Iterator[None]:
    """The umask of a shared Debian account (groups of one person): new folders are 0775 unless chmod-ed."""
    old = os.umask(0o002)
    try:
        yield
    finally:
        os.umask(old)


def built_lib(folder: Path, library: bytes) -> Path:
    """A build's `lib` as llama.cpp installs it: versioned names as links, the core libraries and one CPU variant."""
    folder.mkdir(parents=True)
    (folder / "libllama.so.0.5.0").write_bytes(library)
    (folder / "libllama.so.0").symlink_to("libllama.so.0.5.0")
    (folder / "libllama.so").symlink_to("libllama.so.0")
    for name in ("libggml.so", "libggml-base.so", "libggml-cpu-haswell.so"):
        (folder / name).write_bytes(library)
        (folder / name).chmod(0o755)
    (folder / STAMP_FILENAME).write_text(json.dumps({"release": llamacpp_build.RELEASE}), encoding="utf-8")
    return folder


def installed(tmp_path: Path, library: bytes) -> Path:
    """A `lib` installed from a private build cache, as a second clone on the same machine gets it."""
    cache = tmp_path / "home" / ".cache" / "rubricem" / "llama.cpp"
    save_to_cache(built_lib(tmp_path / "built", library), cache, VARIANTS)
    lib = tmp_path / "env" / "llama_cpp" / "lib"
    assert restore_from_cache(lib, cache, VARIANTS) is None
    return lib


def change_a_byte(path: Path) -> None:
    """One byte of the library's text changed in place (still a library the loader takes)."""
    data = path.read_bytes()
    at = data.index(TAG) + len(TAG) - 1
    path.write_bytes(data[:at] + b"B" + data[at + 1:])


ENGINE = ("from pathlib import Path\nfrom learning.engines.llamacpp_engine import LlamaCppEngine\n"
          "try:\n    LlamaCppEngine(Path('absent.gguf'), n_ctx=64, threads=1, batch_threads=1)\n"
          "except BaseException as exc:\n    print(f'{type(exc).__name__}: {exc}')\n")
CPU_BACKEND = ("from pathlib import Path\nfrom learning.engines.cpu_backend import load_cpu_backend\n"
               "try:\n    print('loaded', load_cpu_backend(Path('absent.gguf'), None))\n"
               "except BaseException as exc:\n    print(f'{type(exc).__name__}: {exc}')\n")


def load_in_child(lib: Path, code: str, marker: Path) -> tuple[str, list[str]]:
    """Run `code` (a product load path) in a child process pointed at `lib`; its output, and what was loaded."""
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(lib), "RUBRICEM_TEST_MARKER": str(marker)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    loaded = marker.read_text(encoding="utf-8").splitlines() if marker.exists() else []
    return done.stdout + done.stderr, loaded


# -- finding 10: every library is checked against its recorded digest before it is loaded ----------------------------


def test_a_library_changed_after_it_was_installed_is_not_loaded_and_the_error_names_it(
        tmp_path: Path, library: bytes) -> None:
    lib = installed(tmp_path, library)
    out, loaded = load_in_child(lib, ENGINE, tmp_path / "intact.log")
    assert loaded == [TAG.decode()], f"the intact, private build should load: {out}"
    # it passes its digest, and is no llama.cpp (no llama_* symbols): the import fails, said as the engine's error
    assert "PolicyUnavailable: llama-cpp-python is installed but does not import" in out, out
    change_a_byte(lib / "libllama.so.0.5.0")
    out, loaded = load_in_child(lib, ENGINE, tmp_path / "changed.log")
    assert loaded == [], f"a library that no longer matches its digest was loaded: {out}"
    assert "PolicyUnavailable" in out and f"{lib / 'libllama.so.0.5.0'} does not match" in out
    assert "-m learning.engines.llamacpp_build --cache" in out  # the command that installs it again


INSTALLED_CHECK = "from app.container import llamacpp_installed\nprint('installed', llamacpp_installed())\n"


def test_asking_whether_llamacpp_is_installed_loads_no_library(tmp_path: Path, library: bytes) -> None:
    """The container asks whether llama-cpp-python is there before it builds the engine, which checks the digests:
    the question itself must not load libllama (`import llama_cpp` would, at import)."""
    lib = installed(tmp_path, library)
    change_a_byte(lib / "libllama.so.0.5.0")  # a library that would be refused, had the engine been asked
    out, loaded = load_in_child(lib, INSTALLED_CHECK, tmp_path / "asked.log")
    assert "installed True" in out, out
    assert loaded == [], f"asking whether llama-cpp-python is installed loaded a library: {out}"


def test_a_cpu_variant_changed_after_it_was_installed_is_not_loaded(tmp_path: Path, library: bytes) -> None:
    lib = installed(tmp_path, library)
    out, loaded = load_in_child(lib, CPU_BACKEND, tmp_path / "intact.log")
    assert loaded == [TAG.decode()] and "loaded None" in out, out  # mapped and scored (it has no score: skipped)
    change_a_byte(lib / "libggml-cpu-haswell.so")
    out, loaded = load_in_child(lib, CPU_BACKEND, tmp_path / "changed.log")
    assert loaded == []
    assert "CpuBackendError" in out and f"{lib / 'libggml-cpu-haswell.so'} does not match" in out, out
    assert "-m learning.engines.llamacpp_build --cache" in out


def test_a_library_put_beside_the_recorded_ones_is_not_loaded(tmp_path: Path, library: bytes) -> None:
    lib = installed(tmp_path, library)
    (lib / "libggml-cpu-zen4.so").write_bytes(library)  # ggml loads any libggml-*.so from its backend folder
    out, loaded = load_in_child(lib, CPU_BACKEND, tmp_path / "marker.log")
    assert loaded == []
    assert f"{lib / 'libggml-cpu-zen4.so'} is not part of the recorded build" in out, out


def test_a_record_in_a_folder_others_can_write_vouches_for_nothing(tmp_path: Path, library: bytes) -> None:
    """The attack of finding 10: whoever can write the folder replaces the library and its digest together."""
    lib = installed(tmp_path, library)
    change_a_byte(lib / "libllama.so.0.5.0")
    stamp = json.loads((lib / STAMP_FILENAME).read_text(encoding="utf-8"))
    stamp["files"] = llamacpp_build.record_libraries(lib)  # the changed library's digest, as the attacker writes it
    (lib / STAMP_FILENAME).write_text(json.dumps(stamp), encoding="utf-8")
    lib.chmod(0o775)  # an environment made under umask 002: anyone in the group can write it
    out, loaded = load_in_child(lib, ENGINE, tmp_path / "marker.log")
    assert loaded == [], f"a library vouched for by a record others could rewrite was loaded: {out}"
    assert f"{lib} is a folder other users can write (mode 0775)" in out, out


def test_a_new_build_cache_is_private_whatever_the_umask(tmp_path: Path, library: bytes, umask_002: None) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    cache = home / ".cache" / "rubricem" / "llama.cpp"
    entry = save_to_cache(built_lib(tmp_path / "built", library), cache, VARIANTS)
    for folder in (home / ".cache", home / ".cache" / "rubricem", cache, entry):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, f"{folder} is {folder.stat().st_mode:o}"


def test_a_build_cache_others_can_write_is_refused_and_nothing_is_installed_from_it(
        tmp_path: Path, library: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    """A cache that an older install made 0775 under umask 002, where a group member replaced a library and
    rewrote the manifest to match."""
    cache = tmp_path / "home" / ".cache" / "rubricem" / "llama.cpp"
    planted = built_lib(tmp_path / "planted", library)
    change_a_byte(planted / "libllama.so.0.5.0")
    save_to_cache(planted, cache, VARIANTS)
    cache.chmod(0o775)
    lib = tmp_path / "env" / "llama_cpp" / "lib"
    why = restore_from_cache(lib, cache, VARIANTS)
    assert why is not None and str(cache) in why and "other users can write (mode 0775)" in why, why
    assert not lib.exists()
    with pytest.raises(PermissionError, match="other users can write"):
        save_to_cache(built_lib(tmp_path / "built", library), cache, VARIANTS)  # nothing is added to it either
    # `make install` then builds from the pinned source instead, saying why
    assert llamacpp_build.usable_cache(cache) is None
    err = capsys.readouterr().err
    assert f"the build cache {cache} is refused" in err and "Building from the pinned source" in err


def test_a_build_cache_reached_through_a_link_into_a_world_writable_folder_is_refused(
        tmp_path: Path, library: bytes) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone can rename the cache away and put theirs in its place
    (shared / "llama.cpp").mkdir(mode=0o700)
    home = tmp_path / "home" / ".cache" / "rubricem"
    home.mkdir(parents=True)
    (home / "llama.cpp").symlink_to(shared / "llama.cpp")
    with pytest.raises(PermissionError, match=f"{shared} is a folder other users can write"):
        save_to_cache(built_lib(tmp_path / "built", library), home / "llama.cpp", VARIANTS)
    assert list((shared / "llama.cpp").iterdir()) == []


@pytest.mark.may_skip("only root can give a folder to another user")
def test_a_build_cache_inside_another_users_folder_or_their_sticky_folder_is_refused(
        tmp_path: Path, library: bytes) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder to another user")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match=f"{theirs} belongs to another user"):
        save_to_cache(built_lib(tmp_path / "built", library), theirs / "cache", VARIANTS)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    os.chown(sticky, NOBODY, NOBODY)  # sticky, but its owner can still rename what is inside it
    with pytest.raises(PermissionError, match=f"{sticky} belongs to another user"):
        save_to_cache(tmp_path / "built", sticky / "cache", VARIANTS)
    os.chown(sticky, 0, 0)  # root's and sticky, like /tmp: a private cache inside it is fine
    assert save_to_cache(tmp_path / "built", sticky / "cache", VARIANTS).parent == sticky / "cache"


def test_a_private_build_cache_installs_and_its_libraries_load(tmp_path: Path, library: bytes) -> None:
    lib = installed(tmp_path, library)
    assert llamacpp_build.library_problem(lib) is None
    out, loaded = load_in_child(lib, ENGINE, tmp_path / "marker.log")
    assert loaded == [TAG.decode()], out


# -- finding 11: the GGUF LoRA cache ------------------------------------------------------------------------------


def test_a_gguf_cache_whose_parent_is_a_link_into_a_world_writable_folder_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # world-writable, not sticky
    (shared / "data").mkdir(mode=0o700)  # this user's own folder, private itself: its parent is the way in
    home = tmp_path / "home"
    home.mkdir()
    (home / "data").symlink_to(shared / "data")
    with pytest.raises(GGUFConversionError, match=f"{shared} is a folder other users can write"):
        private_folder(home / "data" / "gguf-lora")
    assert not (shared / "data" / "gguf-lora").exists()


def test_a_gguf_cache_through_a_link_to_a_private_folder_is_used_by_its_real_path(tmp_path: Path) -> None:
    (tmp_path / "disk" / "data").mkdir(parents=True)
    (tmp_path / "data").symlink_to(tmp_path / "disk" / "data")
    folder = private_folder(tmp_path / "data" / "gguf-lora")
    assert folder == tmp_path / "disk" / "data" / "gguf-lora"  # the link is not followed again later
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
