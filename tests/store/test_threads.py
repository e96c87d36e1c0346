"""Chat threads (store.threads), both backends: sessions in the order they were asked; bad links refused with
nothing written."""

from __future__ import annotations

import pytest

from store.records import PromptRecord
from store.session_log import SessionLog
from store.threads import ChatThreads, ThreadError
from tests.store.conftest import StoreTarget


def _session(log: SessionLog, question: str) -> str:
    return log.create_session(question, PromptRecord("User: q", (1, 2), "p"), {}, "base")


def test_a_thread_keeps_its_sessions_in_order(store_target: StoreTarget) -> None:
    log = store_target.open()
    threads = ChatThreads(log)
    a, b, c = (_session(log, q) for q in ("first", "second", "elsewhere"))
    tid = threads.new_id()
    assert threads.add(tid, a) == 0 and threads.add(tid, b) == 1
    assert threads.sessions(tid) == [a, b]
    assert threads.thread_of(a) == tid and threads.thread_of(c) is None
    assert threads.sessions("thr_unknown") == []
    log.close()
    with store_target.open() as reopened:  # reopening the database keeps them
        assert ChatThreads(reopened).sessions(tid) == [a, b]


def test_bad_links_are_refused_and_nothing_is_written(store_target: StoreTarget) -> None:
    log = store_target.open()
    threads = ChatThreads(log)
    a = _session(log, "first")
    tid = threads.new_id()
    threads.add(tid, a)
    with pytest.raises(ThreadError, match="already belongs"):
        threads.add(threads.new_id(), a)
    with pytest.raises(ThreadError, match="unknown session"):
        threads.add(tid, "nope")
    with pytest.raises(ThreadError, match="must not be empty"):
        threads.add("  ", a)
    assert threads.sessions(tid) == [a]
    log.close()
