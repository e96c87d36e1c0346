"""The llama.cpp build `make install` runs (learning/engines/llamacpp_build.py, issue 47): what it refuses before
compiling anything, and how it knows a folder already holds its build. The build itself runs in `make install`,
and `tests/policy/test_cpu_backend.py` checks its result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from learning.engines import llamacpp_build
from learning.engines.llamacpp_build import RELEASE, VARIANTS, BuildError, build, is_built, package_lib_dir


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


def test_the_installed_folder_holds_this_build_and_a_changed_stamp_does_not(tmp_path: Path) -> None:
    lib = package_lib_dir()
    assert is_built(lib, VARIANTS)  # what `make install` left: a later install skips the compile
    copy = tmp_path / "lib"
    shutil.copytree(lib, copy, symlinks=True)
    stamp = json.loads((copy / llamacpp_build.STAMP_FILENAME).read_text(encoding="utf-8"))
    (copy / llamacpp_build.STAMP_FILENAME).write_text(json.dumps({**stamp, "release": "0.0.1"}), encoding="utf-8")
    assert not is_built(copy, VARIANTS)  # another release: built again
    assert not is_built(lib, (*VARIANTS, "sapphirerapids"))  # a variant not built here
