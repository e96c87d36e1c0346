"""A real trace server for the tracing tests and benchmark: arize-phoenix from `.phoenix/` (`make phoenix`), started
on free loopback ports with its own working folder (its SQLite database), and its spans read back over its REST API.

Phoenix takes OTLP over HTTP on its web port (`/v1/traces`) and OTLP over gRPC on a second port; spans with no
`openinference.project.name` resource attribute land in its `default` project. `GET /v1/projects/default/spans`
returns them (newest first, `next_cursor` to page on) with their attributes as sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.servers import free_port, server_process

REPO_ROOT = Path(__file__).resolve().parents[1]
PHOENIX = REPO_ROOT / ".phoenix" / "bin" / "phoenix"
START_TIMEOUT_S = 120.0  # about 12 s on an idle 2-core machine (database migrations on first start)


def why_missing() -> str | None:
    """Why phoenix cannot be started here, or None."""
    if not os.access(PHOENIX, os.X_OK):
        return f"arize-phoenix is not installed in .phoenix/ ({PHOENIX}): run `make phoenix` (about 90 s once)"
    return None


@dataclass(frozen=True)
class Phoenix:
    """A running phoenix: `endpoint` is what OTEL_EXPORTER_OTLP_ENDPOINT takes (http/protobuf)."""

    root: str

    @property
    def endpoint(self) -> str:
        return self.root

    def spans(self, project: str = "default") -> list[dict[str, Any]]:
        """Every span of the project, oldest first."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            resp = httpx.get(f"{self.root}/v1/projects/{project}/spans", params=params, timeout=30.0)
            if resp.status_code == 404:  # no span has reached the project yet
                return []
            resp.raise_for_status()
            body = resp.json()
            out.extend(body["data"])
            cursor = body.get("next_cursor")
            if not cursor:
                return sorted(out, key=lambda s: s["start_time"])

    def wait_for(self, name: str, count: int = 1, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """All spans, once at least `count` spans named `name` have been stored (ingestion is asynchronous)."""
        return self.wait_until(lambda spans: sum(1 for s in spans if s["name"] == name) >= count, timeout_s)

    def wait_until(self, ready: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30.0
                   ) -> list[dict[str, Any]]:
        """All spans, once `ready(spans)` holds (or the time is up: the caller's assertions say what is missing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if ready(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.5)


@contextmanager
def running_phoenix(workdir: Path) -> Iterator[Phoenix]:
    """Start phoenix on free loopback ports with `workdir` as its working folder; stopped by pid afterwards."""
    port, grpc_port = free_port(), free_port()
    # Through `env`: its working folder (where it creates its database), no analytics pixels, no request to the
    # internet of its own, and none of the OTLP variables a caller's environment may hold (phoenix reads them).
    cmd = ["env", "-u", "OTEL_EXPORTER_OTLP_ENDPOINT", "-u", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
           f"PHOENIX_WORKING_DIR={workdir}", "PHOENIX_TELEMETRY_ENABLED=false",
           "PHOENIX_ALLOW_EXTERNAL_RESOURCES=false",
           str(PHOENIX), "serve", "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port)]
    root = f"http://127.0.0.1:{port}"
    with server_process("phoenix", cmd, f"{root}/healthz", workdir / "phoenix.log", START_TIMEOUT_S, cwd=workdir):
        yield Phoenix(root)
