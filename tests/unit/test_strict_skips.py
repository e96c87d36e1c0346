"""`make test` runs with RUBRICEM_TEST_STRICT=1 (tests/conftest.py): a skip there is a failure unless the test is marked
`may_skip`, so a CI machine without PostgreSQL, Chromium or vLLM cannot pass green by skipping what needs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = '''
import pytest

def test_needs_a_server():
    pytest.skip("no PostgreSQL binaries")

@pytest.mark.may_skip("CI has no docker daemon")
def test_needs_docker():
    pytest.skip("no docker")

def test_runs():
    assert True
'''


def _run(tmp_path: Path, strict: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "RUBRICEM_TEST_STRICT"}
    if strict:
        env["RUBRICEM_TEST_STRICT"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "tests.conftest", "-p", "no:cacheprovider",
               str(tmp_path / "test_sample.py")]
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False)


def test_a_skip_fails_under_strict_unless_marked(tmp_path: Path) -> None:
    result = _run(tmp_path, strict=True)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed, 1 skipped" in result.stdout
    assert "test_needs_a_server" in result.stdout and "no PostgreSQL binaries" in result.stdout
    assert "RUBRICEM_TEST_STRICT=1" in result.stdout


def test_without_strict_a_skip_stays_a_skip(tmp_path: Path) -> None:
    result = _run(tmp_path, strict=False)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 2 skipped" in result.stdout


def test_test_seconds_are_summed_by_component() -> None:
    """The per-component line CI prints at the end (issue 61)."""
    from tests.conftest import component_seconds

    got = component_seconds({"tests/app/test_a.py::t1": 3.0, "tests/app/test_b.py::t2": 4.0,
                             "tests/unit/test_c.py::t3[x]": 1.5, "tests/test_boundaries.py::t4": 9.0})
    assert got == [("test_boundaries.py", 9.0), ("app", 7.0), ("unit", 1.5)]
