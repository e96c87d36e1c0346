"""Start a real server process for tests, wait for its health URL, and always stop it (by pid) afterwards."""

from __future__ import annotations

import itertools
import os
import random
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


# Ports for the servers tests start come from a block of their own per pytest-xdist worker, below the kernel's
# ephemeral range (32768-60999 on Linux). A port asked of the kernel (bind to 0) and released again could be handed to
# the other worker before our server binds it; a port outside the ephemeral range is never handed out by the kernel,
# and the other worker draws from another block, so the check-then-bind gap has no one to race with (issue 61).
PORT_BLOCK_START = 20000
PORT_BLOCK_SIZE = 1000
_PORT_BLOCKS = 12  # 20000-31999: below the ephemeral range
_next_port = itertools.count(random.randrange(PORT_BLOCK_SIZE))  # a nested pytest run on one worker starts elsewhere


def worker_index(name: str | None = None) -> int:
    """0 for the controller or a plain run, K + 1 for xdist's worker gwK (PYTEST_XDIST_WORKER, set by xdist)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "") if name is None else name
    return int(name[2:]) + 1 if name.startswith("gw") and name[2:].isdigit() else 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, from this worker's own block."""
    block = PORT_BLOCK_START + (worker_index() % _PORT_BLOCKS) * PORT_BLOCK_SIZE
    for _ in range(PORT_BLOCK_SIZE):
        port = block + next(_next_port) % PORT_BLOCK_SIZE
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken (a server of this worker, or another program): try the next one
            return port
    raise RuntimeError(f"no free port in {block}-{block + PORT_BLOCK_SIZE - 1} for this test worker")


@contextmanager
def server_process(
    name: str, cmd: Sequence[str], health_url: str, log_path: Path, timeout_s: float, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `cmd` until `health_url` answers 200 (fail the test with the log tail if it exits or times out)."""
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(list(cmd), stdout=log_file, stderr=subprocess.STDOUT, cwd=cwd)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                pytest.fail(f"{name} exited with {proc.returncode} while starting:\n{tail}", pytrace=False)
            try:
                if httpx.get(health_url, timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{name} did not answer {health_url} within {timeout_s:.0f}s", pytrace=False)
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
