"""How `make test` runs (issue 61): two pytest-xdist workers, every real-vLLM test on one of them, each worker its
share of the CPUs, free ports drawn per worker, per-test timeouts from the measured seconds (so a hang fails at its
own timeout and the run goes on), and the shared embedded policy left on its base weights by every test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from learning.engines.threads import available_cpus
from tests.conftest import (
    SECONDS_FILE,
    THREAD_ENV,
    TIMEOUT_FLOOR_S,
    measured_seconds,
    plain_nodeid,
    share_cpus_among_workers,
    timeout_for,
    vllm_cpu_bind,
    worker_threads,
)
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


def _run(tmp_path: Path, *args: str, files: dict[str, str] | None = None,
         extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """An inner pytest run of `files` (name -> source; the SAMPLE module by default) with this suite's conftest."""
    files = files or {"test_sample.py": SAMPLE}
    for name, source in files.items():
        (tmp_path / name).write_text(source, encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "RUBRICEM_TEST_")) and k not in THREAD_ENV}
    env.update({"PYTHONPATH": str(ROOT), **(extra_env or {})})
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", *args,
               *(str(tmp_path / name) for name in files)]
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False)


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
    # beside another xdist worker a test has half the cores it was measured with: the measured part doubles, not the
    # floor, and a test's own smaller timeout still stays
    assert timeout_for(162.1, None, workers=2) == pytest.approx(972.6)
    assert timeout_for(10.0, None, workers=2) == TIMEOUT_FLOOR_S
    assert timeout_for(5.0, 60.0, workers=2) == 60.0
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


# Three modules: one names the shared vLLM fixture in its source (as tests/conftest.py's vLLM-group check reads
# it; spelled in pieces here, so that this module itself is not put in the group),
# one carries the group mark itself (as tests/app/test_policy_server.py does), one is plain. Each test records the
# worker that ran it and the thread count that worker got.
_RECORD = """
import json
import os
import time

import pytest


def record(name):
    time.sleep(0.2)  # each test takes a moment, as real ones do
    with open(os.environ["SAMPLE_OUT"], "a", encoding="utf-8") as out:
        out.write(json.dumps([name, os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("OMP_NUM_THREADS")]) + "\\n")
"""
GROUP_SAMPLES = {
    "test_named.py": _RECORD + """
# uses {VLLM_FIXTURE} (only named here: the module's source decides)
@pytest.mark.parametrize("k", ["a@b", "c"])
def test_named(k):
    record(f"named[{k}]")


def test_named_too():
    record("named_too")
""",
    "test_marked.py": _RECORD + """
pytestmark = pytest.mark.xdist_group("vllm")


def test_marked():
    record("marked")
""",
    "test_plain.py": _RECORD + """
@pytest.mark.parametrize("k", range(6))
def test_plain(k):
    record(f"plain{k}")
""",
}
GROUP_SAMPLES["test_named.py"] = GROUP_SAMPLES["test_named.py"].replace("{VLLM_FIXTURE}", "real_" + "vllm")


@pytest.mark.slow
def test_two_workers_run_every_vllm_test_on_one_of_them_and_share_the_cpus(tmp_path: Path) -> None:
    """The measured two-worker run spread the vLLM tests over both workers (the group's marks never reached xdist's
    scheduler), and the contract test's request was batched with the other worker's; each worker also ran torch with
    every core, two workers oversubscribing them."""
    out = tmp_path / "ran.jsonl"
    result = _run(tmp_path, "-n", "2", "--dist", "loadgroup", "-rA", files=GROUP_SAMPLES,
                  extra_env={"SAMPLE_OUT": str(out)})
    assert result.returncode == 0, result.stdout + result.stderr
    ran = {name: (worker, threads) for name, worker, threads in map(json.loads, out.read_text().splitlines())}
    assert len(ran) == 10, ran
    grouped = {ran[n][0] for n in ("named[a@b]", "named[c]", "named_too", "marked")}
    assert len(grouped) == 1, ran  # one worker ran the whole group
    assert {w for w, _ in ran.values()} == {"gw0", "gw1"}, ran  # and the run really was spread over two
    assert {t for _, t in ran.values()} == {str(worker_threads(available_cpus(), 2))}, ran
    assert "test_named.py::test_named[a@b]@vllm" in result.stdout  # the suffix xdist's scheduler groups by


def test_each_worker_gets_its_share_of_the_cpus_and_one_process_all_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert worker_threads(2, 1) == 2 and worker_threads(2, 2) == 1 and worker_threads(1, 2) == 1
    assert worker_threads(16, 3) == 5
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(name, raising=False)
    env: dict[str, str] = {}
    assert share_cpus_among_workers(env) is None and env == {}  # one process: nothing changed
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    share_cpus_among_workers(env)
    assert env == {name: str(worker_threads(available_cpus(), 2)) for name in THREAD_ENV}
    mine = {"OMP_NUM_THREADS": "3"}
    assert share_cpus_among_workers(mine) == 3 and mine["OMP_NUM_THREADS"] == "3"  # a count set by hand wins


def test_a_test_vllm_binds_to_one_workers_share_of_the_cores_and_to_all_of_them_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUBRICEM_TEST_VLLM_CPU_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert vllm_cpu_bind(1) == "all"  # one process: every core, as in production
    assert vllm_cpu_bind(2) == "2,3" and vllm_cpu_bind(4) == "3"
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    assert vllm_cpu_bind(2) == "1"
    monkeypatch.setenv("RUBRICEM_TEST_VLLM_CPU_BIND", "all")
    assert vllm_cpu_bind(2) == "all"  # set by hand: it wins


def test_seconds_are_recorded_under_the_ids_seconds_tsv_lists() -> None:
    assert plain_nodeid("tests/policy/test_x.py::test_x@vllm") == "tests/policy/test_x.py::test_x"
    assert plain_nodeid("tests/a.py::test_y[policy@sft]") == "tests/a.py::test_y[policy@sft]"


GUARD_SAMPLE = """
from agent.config import SHIPPED_SFT_ADAPTER


def test_leaves_an_adapter_loaded(embedded_policy):
    embedded_policy.load_adapter(SHIPPED_SFT_ADAPTER, "sft")


def test_the_next_user_gets_the_base_weights(embedded_policy):
    assert embedded_policy.policy_version == "base"
"""


@pytest.mark.slow
def test_a_test_that_leaves_the_shared_policy_changed_fails_by_name_and_the_next_gets_base(tmp_path: Path) -> None:
    """The shared `embedded_policy` is one object per worker; which tests ran before a given one differs with the
    number of workers, so one left on an adapter would move another's numbers only in some runs."""
    result = _run(tmp_path, "-rA", files={"test_guard.py": GUARD_SAMPLE})
    assert result.returncode == 1, result.stdout
    assert "2 passed, 1 error" in result.stdout, result.stdout  # the first test's call passed, its teardown failed
    assert "ERROR at teardown of test_leaves_an_adapter_loaded" in result.stdout, result.stdout
    assert "PASSED test_guard.py::test_the_next_user_gets_the_base_weights" in result.stdout, result.stdout
    assert ("test_guard.py::test_leaves_an_adapter_loaded left the shared embedded_policy serving 'sft' instead of "
            "the base weights") in result.stdout, result.stdout
