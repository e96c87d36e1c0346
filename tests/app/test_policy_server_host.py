"""Issue 65, finding 14: `rubricem policy-server` with no key (loopback only) checks the Host header, so a web page
whose DNS name an attacker rebinds to 127.0.0.1 cannot read /v1/models or /metrics.

A browser's GET carries no Origin header, so the guard's Origin check does not stop it; the request does carry the
attacker's name as its Host. Real parts: the guard module the launcher loads into vLLM
(`app/vllm_plugins/rubricem_vllm_guard.py`), in a real uvicorn server process whose environment is exactly the one
the launcher builds for vLLM (`server_env`), in front of an app that answers vLLM's read-only routes as vLLM does
(vLLM itself is not installed on every test machine; `tests/app/test_policy_server.py` runs the guard in vLLM's
own app when it is).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from app.policy_server import GUARD_MIDDLEWARE, VLLMServerSpec, server_env
from tests.servers import free_port

KEY = "sk-" + "k" * 40
REBOUND = "rebind.attacker.example"

# vLLM's read-only routes, as vLLM answers them; the guard wraps the app exactly as `--middleware` does.
HARNESS = """
import importlib, json, sys, uvicorn

async def vllm_routes(scope, receive, send):
    if scope["type"] != "http":
        return
    body, kind = {
        "/v1/models": (json.dumps({"object": "list", "data": [{"id": "policy", "root": "/srv/models/policy"}]}),
                       b"application/json"),
        "/metrics": ("vllm:num_requests_running 0\\n", b"text/plain"),
        "/health": ("", b"text/plain"),
    }.get(scope["path"], ('{"error": "not found"}', b"application/json"))
    await send({"type": "http.response.start", "status": 200 if body != '{"error": "not found"}' else 404,
                "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": body.encode()})

module, _, name = sys.argv[2].rpartition(".")
guard = getattr(importlib.import_module(module), name)
uvicorn.run(guard(vllm_routes), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="off")
"""


@contextmanager
def guarded_server(tmp_path: Path, api_key: str | None) -> Iterator[str]:
    """The guard in a real server on 127.0.0.1, in the environment the launcher gives vLLM; yields its root URL."""
    spec = VLLMServerSpec(model_dir=tmp_path / "model", api_key=api_key, cpu_bind="auto")
    env = server_env(spec, {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")})
    script = tmp_path / "harness.py"
    script.write_text(HARNESS, encoding="utf-8")
    port = free_port()
    log = tmp_path / f"guard-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), str(port), GUARD_MIDDLEWARE], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                httpx.get(f"{root}/health", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the guarded server did not start"
                time.sleep(0.2)
        yield root
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _get(root: str, path: str, host: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{root}{path}", headers={"Host": host, **headers}, timeout=30)


def test_without_a_key_a_dns_rebound_page_cannot_read_models_or_metrics(tmp_path: Path) -> None:
    with guarded_server(tmp_path, api_key=None) as root:
        port = root.rsplit(":", 1)[1]
        rebound = {path: _get(root, path, f"{REBOUND}:{port}") for path in ("/v1/models", "/metrics", "/health")}
        bare = _get(root, "/v1/models", REBOUND)
        lookalikes = {h: _get(root, "/metrics", h).status_code
                      for h in ("localhost.attacker.example", "127.0.0.1.attacker.example", "localhost.",
                                f"[::ffff:7f00:1]:{port}", "127.1", "")}
        ours = {h: _get(root, "/v1/models", h) for h in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST",
                                                          f"[::1]:{port}", "127.0.0.2")}
    for path, r in {**rebound, "bare name": bare}.items():
        assert r.status_code == 421, (path, r.status_code, r.text)
        assert "policy" not in r.text.replace("policy server", "") and "vllm:" not in r.text, r.text
        assert "loopback host" in r.json()["error"] and "RUBRICEM_AGENT__POLICY_API_KEY" in r.json()["error"]
    assert lookalikes == {h: 421 for h in lookalikes}
    for host, r in ours.items():  # the app and the launcher's readiness check name the host they were given
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "policy", (host, r.status_code, r.text)


def test_with_a_key_the_key_is_the_lock_whatever_the_host(tmp_path: Path) -> None:
    """With a key the server may be bound to any address and reached by any name (a proxy's): no Host check."""
    with guarded_server(tmp_path, api_key=KEY) as root:
        keyed = _get(root, "/v1/models", "policy.internal.example", Authorization=f"Bearer {KEY}")
        keyless = _get(root, "/metrics", "127.0.0.1")
    assert keyed.status_code == 200 and keyed.json()["data"][0]["id"] == "policy"
    assert keyless.status_code == 401
