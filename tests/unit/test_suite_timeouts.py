"""How `make test` runs (issue 61): two pytest-xdist workers, every real-vLLM test on one of them, free ports drawn per
worker, and per-test timeouts from the measured seconds, so a hang fails at its own timeout and the run goes on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SECONDS_FILE, TIMEOUT_FLOOR_S, measured_seconds, timeout_for
from tests.servers import PORT_BLOCK_SIZE, PORT_BLOCK_START, free_port, worker_index

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = '''
import os
import time

import pytest


@pytest.mark.timeout(3)
def test_hangs():
    time.sleep(120)


def test_dies():
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os._exit(3)  # a worker that dies mid-test


def test_runs():
    assert True
'''


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "RUBRICEM_TEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", *args,
               str(tmp_path / "test_sample.py")]
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180, check=False)


def test_a_hanging_test_fails_at_its_own_timeout_names_itself_and_the_run_goes_on(tmp_path: Path) -> None:
    result = _run(tmp_path, "-k", "hangs or runs")
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed" in result.stdout, result.stdout
    assert "FAILED test_sample.py::test_hangs" in result.stdout and "Timeout" in result.stdout


def test_a_worker_that_dies_fails_the_run_and_names_its_test(tmp_path: Path) -> None:
    result = _run(tmp_path, "-n", "2", "-k", "dies or runs")
    assert result.returncode == 1, result.stdout
    assert "test_sample.py::test_dies" in result.stdout and "crashed" in result.stdout, result.stdout
    assert "1 passed" in result.stdout


def test_timeouts_are_three_times_the_measured_seconds_above_a_floor() -> None:
    assert timeout_for(None, None) == TIMEOUT_FLOOR_S  # not listed: it took under 30 s
    assert timeout_for(10.0, None) == TIMEOUT_FLOOR_S
    assert timeout_for(162.1, None) == pytest.approx(486.3)
    assert timeout_for(162.1, 3000.0) == pytest.approx(486.3)  # the measurement replaces a generous guess
    assert timeout_for(5.0, 60.0) == 60.0  # a smaller timeout a test sets for itself stays
    assert timeout_for(None, 900.0) == 900.0  # not measured yet: its author's estimate
    seconds = measured_seconds()
    assert seconds and all(s >= 30 for s in seconds.values())
    assert all(nodeid.startswith("tests/") and "::" in nodeid for nodeid in seconds)


def test_every_listed_test_still_exists() -> None:
    """A renamed test would silently fall back to the floor; its row must be renamed too."""
    for nodeid in measured_seconds(SECONDS_FILE):
        path, name = nodeid.split("::", 1)
        assert f"def {name.split('[', 1)[0]}(" in (ROOT / path).read_text(encoding="utf-8"), nodeid


def test_ports_come_from_a_block_per_worker_outside_the_kernels_range() -> None:
    assert worker_index("") == 0 and worker_index("gw0") == 1 and worker_index("gw1") == 2
    assert worker_index("master") == 0
    low, _high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    block = PORT_BLOCK_START + worker_index() * PORT_BLOCK_SIZE
    ports = [free_port() for _ in range(5)]
    assert all(block <= p < block + PORT_BLOCK_SIZE < low for p in ports)
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports[0]))  # a port in use is never handed out
        assert ports[0] not in [free_port() for _ in range(PORT_BLOCK_SIZE)]
