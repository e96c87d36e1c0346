"""Issue 65, finding 12: a judge call already waiting on the endpoint when a deletion empties the judge's answer cache
does not write its entry afterwards.

The entry's key hashes the whole request, which quotes the deleted person's question and answer, and its content is
the judge's answer about them: before the fix the write landed after the clear, and the cache held their text again.

Real parts: the real `JudgeClient` with its on-disk cache, a real SQLite store, the deletion through
`delete_user_data` with the host's copies (as "Delete my data" and `rubricem users delete-data` call it). The judge
endpoint is the OpenAI-format stand-in (a paid API in production); it holds its answer until the test has deleted,
so the order is certain whatever the load.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from learning.judge.cache import CachedAnswer, JudgeCache, cache_key
from learning.judge.client import JudgeClient
from learning.judge.types import JudgeCall
from store.deletion import Copies, delete_user_data
from store.owner import acting_as
from store.session_log import SessionLog
from tests.judge.builders import store_session, trajectory
from tests.judge.openai_standin import OpenAIStandIn, Reply

ROOT = Path(__file__).resolve().parents[2]
HERS = "Which river did the QX-7 expedition of Alice's family follow?"
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"],
                          "additionalProperties": False}
ANSWER = json.dumps({"score": 1})


class HoldFirst:
    """Answers every request; the first one's answer waits for `release` (set by the test, also in a `finally`)."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()

    def __call__(self, _req: dict[str, Any]) -> str | Reply:
        if not self.arrived.is_set():
            self.arrived.set()
            return Reply(content=ANSWER, hold=self.release)
        return ANSWER


def _messages() -> list[dict[str, str]]:
    return [{"role": "system", "content": "You grade research answers."},
            {"role": "user", "content": f"Question: {HERS}\nAnswer: the Amazon. Score it 0 or 1."}]


def _entries(root: Path) -> list[Path]:
    """Every cache entry file under `root`, temporary ones included."""
    return [p for p in root.rglob("*") if p.is_file() and p.parent != root]


def _judge_in_thread(client: JudgeClient, done: list[JudgeCall | BaseException]) -> threading.Thread:
    """Run one judge call on its own event loop in a thread (as `rubricem judge` runs beside a deletion)."""

    async def call() -> JudgeCall:
        try:
            return await client.complete_json(_messages(), SCHEMA, name="score")
        finally:
            await client.aclose()

    def run() -> None:
        try:
            done.append(asyncio.run(call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which re-raises it
            done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("earlier_entry", [False, True], ids=["first-call-ever", "cache-in-use"])
def test_a_judge_answer_in_flight_during_a_deletion_is_not_cached_after_the_clear(
        tmp_path: Path, earlier_entry: bool) -> None:
    log = SessionLog(tmp_path / "rubricem.sqlite3")
    with acting_as("alice"):
        store_session(log, trajectory("alice-1", question=HERS))
    cache_dir = tmp_path / "judge-cache"
    if earlier_entry:  # the folder exists and holds an entry from before (the clear removes it too)
        JudgeCache(cache_dir).put("ab" + "0" * 62, CachedAnswer(model="judge", name="score", content=ANSWER))
    hold = HoldFirst()
    done: list[JudgeCall | BaseException] = []
    with OpenAIStandIn(responder=hold) as standin:
        client = JudgeClient(standin.root, "judge", cache_dir=cache_dir, max_retries=0)
        thread = _judge_in_thread(client, done)
        try:
            assert hold.arrived.wait(timeout=120), "the judge call never reached the endpoint"
            # The request quoting her question is on its way; she deletes her data, copies on this host included.
            deleted = delete_user_data(log, "alice", requested_by="alice", keep_account=True,
                                       copies=Copies(runs_dir=tmp_path / "runs", judge_cache=cache_dir))
            assert deleted.counts["sessions"] == 1 and deleted.copies is not None and deleted.copies.done
        finally:
            hold.release.set()
            thread.join(timeout=120)
    assert not thread.is_alive() and len(done) == 1
    if isinstance(done[0], BaseException):
        raise done[0]
    assert done[0].data == {"score": 1} and not done[0].cached  # the caller still gets its answer
    key = cache_key(model="judge", json_mode=client.json_mode, name="score", messages=_messages(), schema=SCHEMA,
                    temperature=0.0, max_tokens=client.max_tokens)
    assert JudgeCache(cache_dir).get(key) is None
    assert _entries(cache_dir) == [], "an answer about deleted data was written after the deletion cleared the cache"
    log.close()


def test_a_call_that_starts_after_the_clear_is_cached_as_before(openai_standin: OpenAIStandIn,
                                                                tmp_path: Path) -> None:
    """The guard drops only writes a clear overtook: a later call is cached, and answered from the cache next time."""
    log = SessionLog(tmp_path / "rubricem.sqlite3")
    with acting_as("bob"):
        store_session(log, trajectory("bob-1", question="Who was Haymo of Faversham?"))
    cache_dir = tmp_path / "judge-cache"
    delete_user_data(log, "bob", requested_by="bob", keep_account=True,
                     copies=Copies(runs_dir=tmp_path / "runs", judge_cache=cache_dir))
    openai_standin.responder = lambda _req: ANSWER

    async def twice() -> tuple[JudgeCall, JudgeCall]:
        client = JudgeClient(openai_standin.root, "judge", cache_dir=cache_dir, max_retries=0)
        try:
            return (await client.complete_json(_messages(), SCHEMA, name="score"),
                    await client.complete_json(_messages(), SCHEMA, name="score"))
        finally:
            await client.aclose()

    first, second = asyncio.run(twice())
    assert not first.cached and second.cached and len(openai_standin.chat_requests) == 1
    log.close()


# The judge's side in its own process, as `rubricem judge` or a retraining cycle runs beside the app that deletes.
JUDGE_PROCESS = """
import asyncio, json, sys
from pathlib import Path
from learning.judge.client import JudgeClient
from tests.judge.test_judge_cache_deletion_race import SCHEMA, _messages

async def main():
    client = JudgeClient(sys.argv[1], "judge", cache_dir=Path(sys.argv[2]), max_retries=0)
    try:
        call = await client.complete_json(_messages(), SCHEMA, name="score")
    finally:
        await client.aclose()
    print(json.dumps(call.data))

asyncio.run(main())
"""


def test_the_judge_in_another_process_does_not_write_after_the_apps_deletion(tmp_path: Path) -> None:
    log = SessionLog(tmp_path / "rubricem.sqlite3")
    with acting_as("alice"):
        store_session(log, trajectory("alice-1", question=HERS))
    cache_dir = tmp_path / "judge-cache"
    hold = HoldFirst()
    with OpenAIStandIn(responder=hold) as standin:
        judge = subprocess.Popen([sys.executable, "-c", JUDGE_PROCESS, standin.root, str(cache_dir)], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert hold.arrived.wait(timeout=300), "the judge process never reached the endpoint"
            delete_user_data(log, "alice", requested_by="alice", keep_account=True,
                             copies=Copies(runs_dir=tmp_path / "runs", judge_cache=cache_dir))
        finally:
            hold.release.set()
            out, err = judge.communicate(timeout=300)
    assert judge.returncode == 0, err[-3000:]
    assert json.loads(out) == {"score": 1}
    assert _entries(cache_dir) == [], "an answer about deleted data was written after the deletion cleared the cache"
    log.close()
