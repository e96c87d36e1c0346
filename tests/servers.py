"""Start a real server process for tests, wait for its health URL, and always stop it (by pid) afterwards."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
