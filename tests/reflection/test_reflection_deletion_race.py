"""Issue 46, item 6: a deletion that commits while the reflection writer is banking a reflection on one of the
person's sessions wins: the item does not stay in the rubric bank.

The writer stores its batch, then writes the best reflection (the question text and lessons drawn from the session)
to the bank. Before the fix, a deletion that ran between the two (its bank part included) found nothing in the bank
to remove, and the write that landed after it stayed for good.

Real parts: the writer, a real SQLite log, a real `chroma run` server holding the bank, the bundled MiniLM and the
offline reflection judge; the deletion through the store API the chat's "Delete my data" calls, with its own bank
client straight to the server. The policy is the scripted double of the policy server (the LLM boundary). Between the
writer and Chroma sits a forwarding proxy that holds the item's write until the test has deleted, so the order is
certain whatever the load: a slow network, not a fault.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from learning.judge.buffer import RubricBuffer, save_buffer
from learning.judge.offline_reflection import OfflineReflectionJudge
from learning.reflection import ReflectionOutcome, write_reflection
from store.config import BankConfig, StoreConfig
from store.deletion import delete_user_data
from store.owner import acting_as
from store.rubric_bank import RubricBank
from store.session_log import SessionLog
from tests.judge.builders import QUESTION
from tests.reflection.helpers import GOOD, RUBRICS, add_session
from tests.reflection.test_reflection_writer import policy_saying

SESSION = "alice-session-7f3a"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class HoldingProxy:
    """Forwards HTTP to `upstream`; the first write whose body names `marker` waits until `release` is set."""

    def __init__(self, upstream: str, marker: str) -> None:
        self.arrived, self.release = threading.Event(), threading.Event()
        self._client = httpx.Client(base_url=upstream, timeout=120.0)
        self._marker, self._held = marker.encode(), False
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def _hold_this(self, method: str, path: str, body: bytes) -> bool:
        with self._lock:
            hold = not self._held and method == "POST" and path.endswith(("/upsert", "/add")) and self._marker in body
            self._held = self._held or hold
        return hold

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy._hold_this(self.command, self.path, body):
                    proxy.arrived.set()
                    proxy.release.wait()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                answer = proxy._client.request(self.command, self.path, content=body, headers=headers)
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in _HOP and k.lower() != "content-encoding":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        return Handler

    def close(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._client.close()


@pytest.fixture
def banks(chroma_server: tuple[str, int], tmp_path: Path) -> Iterator[tuple[RubricBank, RubricBank, HoldingProxy]]:
    """(the writer's bank client, through the proxy; the deletion's, straight to the server; the proxy, which holds
    the write of SESSION's item)."""
    host, port = chroma_server
    proxy = HoldingProxy(f"http://{host}:{port}", SESSION)
    collection = BankConfig(collection=f"bank_race_{tmp_path.name[-8:]}")

    def bank(folder: str, to_port: int) -> RubricBank:
        return RubricBank(StoreConfig(data_dir=tmp_path / folder, chroma_mode="server", chroma_host=host,
                                      chroma_port=to_port, bank=collection))

    try:
        yield bank("writer", proxy.port), bank("direct", port), proxy
    finally:
        proxy.close()


def test_a_deletion_while_a_reflection_is_banked_leaves_no_item(banks: tuple[RubricBank, RubricBank, HoldingProxy],
                                                                 tmp_path: Path) -> None:
    through_proxy, direct, proxy = banks
    sid = SESSION
    log = SessionLog(tmp_path / "log.sqlite3")
    save_buffer(log, RubricBuffer.empty(QUESTION).add(RUBRICS)[0])
    with acting_as("alice"):
        add_session(log, sid)
    outcome: list[ReflectionOutcome | BaseException] = []

    def write() -> None:
        try:
            outcome.append(asyncio.run(write_reflection(sid, log=log, policy=policy_saying(GOOD),
                                                        judge=OfflineReflectionJudge(), bank=through_proxy,
                                                        candidates=1)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert proxy.arrived.wait(timeout=300), "the writer never wrote its item"
        # The batch is stored and the item is on its way to the bank: alice deletes her data now, bank part included.
        deleted = delete_user_data(log, "alice", requested_by="alice", bank=direct, keep_account=True)
        assert deleted.counts["sessions"] == 1 and not deleted.bank_pending
    finally:
        proxy.release.set()
        writer.join(timeout=300)
    (out,) = outcome
    assert isinstance(out, ReflectionOutcome), out
    assert out.reason != "accepted" and out.accepted is None
    # Nothing of her session is in the bank: not under its id, not under its question.
    assert direct.by_question(QUESTION) is None
    assert direct.delete_derived([sid]) == 0
    log.close()
