"""The llama.cpp build `make install` runs (learning/engines/llamacpp_build.py, issue 47): what it refuses before
compiling anything, and how it knows a folder already holds its build. The build itself runs in `make install`,
and `tests/policy/test_cpu_backend.py` checks its result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from learning.engines import llamacpp_build
from learning.engines.llamacpp_build import (
    BASELINE,
    RELEASE,
    BuildError,
    build,
    cache_key,
    choose_variants,
    cpu_flags,
    default_variants,
    is_built,
    package_lib_dir,
    restore_from_cache,
    save_to_cache,
)


def test_a_source_archive_that_is_not_the_pinned_one_is_removed_and_nothing_is_built(tmp_path: Path) -> None:
    if shutil.which("cmake") is None:
        pytest.fail("cmake is missing: `make install` needs it to build llama.cpp", pytrace=False)
    sdist = tmp_path / "work" / "sdist" / f"llama_cpp_python-{RELEASE}.tar.gz"
    sdist.parent.mkdir(parents=True)
    sdist.write_bytes(b"not the release")  # a tampered or truncated download
    lib = tmp_path / "lib"
    with pytest.raises(BuildError, match=f"not the pinned {llamacpp_build.SDIST_SHA256}.*make install"):
        build(lib, tmp_path / "work", say=lambda _line: None)
    assert not sdist.exists() and not lib.exists() and not (tmp_path / "work" / "build-core").exists()


VARIANTS = default_variants()  # what `make install` built on this machine


def test_only_the_variants_this_cpu_advertises_are_built_plus_the_baseline(tmp_path: Path) -> None:
    avx2 = frozenset("fpu sse4_2 avx f16c fma avx2 bmi2".split())
    zen3 = choose_variants(avx2)  # an AMD EPYC without AVX-512 or AVX-VNNI
    assert zen3[0] == ("haswell",) and set(zen3[1]) == {"skylakex", "icelake", "zen4", "alderlake"}
    assert "avx512f" in zen3[1]["skylakex"] and "avx_vnni" in zen3[1]["alderlake"]
    skx = avx2 | set("avx512f avx512cd avx512vl avx512dq avx512bw".split())
    assert choose_variants(skx)[0] == ("haswell", "skylakex")
    full = skx | set("avx512vbmi avx512_vnni avx512_bf16 avx_vnni".split())
    assert choose_variants(full) == (("haswell", "skylakex", "icelake", "zen4", "alderlake"), {})
    assert choose_variants(frozenset())[0] == (BASELINE,)  # the portable baseline, always
    assert choose_variants(None)[0] == llamacpp_build.VARIANTS  # no /proc/cpuinfo: every variant
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 bmi2\n\nprocessor\t: 1\nflags\t\t: other\n")
    assert cpu_flags(info) == frozenset({"fpu", "avx2", "bmi2"}) and cpu_flags(tmp_path / "none") is None
    stamp = json.loads((package_lib_dir() / llamacpp_build.STAMP_FILENAME).read_text())
    assert tuple(stamp["variants"]) == VARIANTS  # what `make install` built here is what this machine chooses


def test_the_installed_folder_holds_this_build_and_a_changed_stamp_does_not(tmp_path: Path) -> None:
    lib = package_lib_dir()
    assert is_built(lib, VARIANTS)  # what `make install` left: a later install skips the compile
    copy = tmp_path / "lib"
    shutil.copytree(lib, copy, symlinks=True)
    stamp = json.loads((copy / llamacpp_build.STAMP_FILENAME).read_text(encoding="utf-8"))
    (copy / llamacpp_build.STAMP_FILENAME).write_text(json.dumps({**stamp, "release": "0.0.1"}), encoding="utf-8")
    assert not is_built(copy, VARIANTS)  # another release: built again
    assert not is_built(lib, (*VARIANTS, "sapphirerapids"))  # a variant not built here


def test_a_cached_build_installs_into_a_new_environment_and_a_changed_file_is_refused(tmp_path: Path) -> None:
    """What a second clone on the same machine does instead of compiling: copy the build `make install` kept in the
    per-user cache, each file checked against the hash taken when it was kept."""
    cache = tmp_path / "cache"
    entry = save_to_cache(package_lib_dir(), cache, VARIANTS)
    assert entry == cache / cache_key(VARIANTS)
    fresh = tmp_path / "fresh-env-lib"  # a new environment's lib: llama-cpp-python's Python code, no libraries
    assert restore_from_cache(fresh, cache, VARIANTS) is None
    assert is_built(fresh, VARIANTS)
    assert (fresh / "libllama.so").is_symlink()  # the versioned names come back as the links they were
    for name in ("libllama.so", "libggml-cpu-zen4.so"):
        assert (fresh / name).read_bytes() == (package_lib_dir() / name).read_bytes()
    # another variant set is another entry
    assert "no cached build" in str(restore_from_cache(tmp_path / "other", cache, ("haswell",)))

    # a cached library changed after it was kept (a disk error, or someone else's code): not installed, nothing lost
    target = tmp_path / "target-lib"
    target.mkdir()
    (target / "libllama.so").write_bytes(b"the install there before")
    victim = entry / "libggml-cpu-haswell.so"
    data = victim.read_bytes()
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    why = restore_from_cache(target, cache, VARIANTS)
    assert why is not None and "libggml-cpu-haswell.so changed since it was cached" in why
    assert [p.name for p in target.iterdir()] == ["libllama.so"]
    assert (target / "libllama.so").read_bytes() == b"the install there before"

    # a manifest naming a file outside its entry is refused too
    manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
    manifest["files"]["../../escape.so"] = manifest["files"]["libggml.so"]
    (entry / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert "outside it" in str(restore_from_cache(target, cache, VARIANTS))
