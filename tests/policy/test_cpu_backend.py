"""llama.cpp's CPU backend variants (issue 47): the build `make install` made, the choice, and a variant that faults.

The faulting variant is a real shared object with the two entry points ggml looks for: it scores itself above every
real variant and executes an illegal instruction when ggml initialises it, which is what the AMX variant does on
these VMs (SIGILL). Its probe runs in a child process, as the product's does.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from learning.engines import cpu_backend
from learning.engines.cpu_backend import CpuBackendError, choose, lib_dir, scored_variants

TRAP_SOURCE = """
int ggml_backend_score(void) { return 1 << 20; }
void *ggml_backend_init(void) { __builtin_trap(); return 0; }
"""


def _installed_lib() -> Path:
    lib = lib_dir()
    assert lib is not None and cpu_backend.variant_files(lib), (
        "llama-cpp-python has no CPU variant modules: run `make install` (learning/engines/llamacpp_build.py)")
    return lib


def test_the_build_has_an_avx2_floor_and_no_amx_variant() -> None:
    names = {v.name for v in scored_variants(_installed_lib())}
    assert {"haswell", "skylakex", "icelake", "zen4", "alderlake"} <= names
    assert "sapphirerapids" not in names  # AMX: these VMs advertise it and fault on it


def test_the_chosen_variant_fits_this_cpu_and_is_recorded(smollm2_gguf: Path, tmp_path: Path) -> None:
    variants = scored_variants(_installed_lib())
    record = tmp_path / "llamacpp-cpu.json"
    chosen = choose(variants, smollm2_gguf, record)
    assert chosen.score > 0 and chosen.score == max(v.score for v in variants if v.score > 0)
    assert chosen.name in record.read_text(encoding="utf-8")


def _lib_with_a_trap(tmp_path: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler: `make install` needs one to build llama.cpp", pytrace=False)
    lib = tmp_path / "lib"
    lib.mkdir()
    real = _installed_lib()
    for f in real.iterdir():  # the real libraries and the AVX2 variant, symlinks kept as symlinks
        if f.name.startswith(("libllama.so", "libggml.so", "libggml-base.so")) or f.name == "libggml-cpu-haswell.so":
            shutil.copy2(f, lib / f.name, follow_symlinks=False)
    src = tmp_path / "trap.c"
    src.write_text(TRAP_SOURCE, encoding="utf-8")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(lib / "libggml-cpu-trap.so"), str(src)], check=True)
    return lib


def test_a_variant_that_faults_is_recorded_and_never_chosen_again(
    smollm2_gguf: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    variants = scored_variants(_lib_with_a_trap(tmp_path))
    assert [v.name for v in variants][:2] == ["trap", "haswell"]  # the trap scores best
    record = tmp_path / "record.json"
    with caplog.at_level(logging.INFO, logger="learning.engines.cpu_backend"):
        chosen = choose(variants, smollm2_gguf, record)
    assert chosen.name == "haswell"
    assert "trap faulted in its probe (killed by SIGILL" in caplog.text
    saved = cpu_backend._read_record(record, cpu_backend.machine_record_key(variants[0].path.parent))
    assert saved["faulted"]["trap"].startswith("killed by SIGILL") and "haswell" in saved["ok"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="learning.engines.cpu_backend"):
        assert choose(variants, smollm2_gguf, record).name == "haswell"
    assert "trap skipped: it faulted here before (killed by SIGILL" in caplog.text  # not probed again
    assert "faulted in its probe" not in caplog.text
    with pytest.raises(CpuBackendError, match="'trap' faulted on this machine before .*SIGILL"):
        choose(variants, smollm2_gguf, record, forced="trap")  # named explicitly: refused, never run


def test_a_corrupt_model_is_not_blamed_on_the_variant(tmp_path: Path) -> None:
    variants = scored_variants(_installed_lib())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)  # the magic, then nothing usable
    record = tmp_path / "record.json"
    with pytest.raises(CpuBackendError, match="could not load the model .*bad.gguf"):
        choose(variants, bad, record)
    assert not record.exists() or "faulted\": {}" in record.read_text(encoding="utf-8")


def test_a_named_variant_must_exist_and_fit(smollm2_gguf: Path) -> None:
    variants = scored_variants(_installed_lib())
    with pytest.raises(CpuBackendError, match="no llama.cpp CPU variant 'nope' is built .*haswell"):
        choose(variants, smollm2_gguf, None, forced="nope")
    assert choose(variants, smollm2_gguf, None, forced="haswell").name == "haswell"
