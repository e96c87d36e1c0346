"""People in the store (issue 18), on both backends: owners on every session, thread and feedback row (old rows
become `local`), named accounts with bcrypt hashes, the user-scoped accessor that refuses another person's session
exactly like a missing one, and consent deciding what judging, reflection and the training window may use."""

from __future__ import annotations

import pytest

from store import InvalidInput, PromptRecord, SessionLog, SessionNotFound
from store.migrations import apply_migrations, load_migrations
from store.owner import acting_as
from store.people import ScopedStore, Viewer
from store.registry import Registry
from store.threads import ChatThreads
from store.users import UnknownUser, UserError, Users
from tests.store.conftest import StoreTarget, raw_connect

PROMPT = PromptRecord(text="<|im_start|>system\nYou research.<|im_end|>", token_ids=(1, 2), prompt_sha="sha")


def completed(log: SessionLog, question: str, owner: str | None = None, source: str = "chat") -> str:
    sid = log.create_session(question, PROMPT, {}, "base", source=source, owner=owner)  # type: ignore[arg-type]
    log.finish(sid, "completed", report=f"report on {question}")
    return sid


def test_rows_written_before_the_migration_belong_to_local(store_target: StoreTarget) -> None:
    if store_target.sqlite_path is not None:
        store_target.sqlite_path.parent.mkdir(parents=True)
    before = tuple(m for m in load_migrations() if m.version < 8)
    with raw_connect(store_target) as conn:
        apply_migrations(conn, before)
        conn.execute(
            "INSERT INTO sessions (session_id, question, policy_version, options_json, prompt_text, prompt_token_ids, "
            "prompt_sha, status, created_at, updated_at, finished_at, source) VALUES ('old', 'q?', 'base', '{}', 'p', "
            "?, 's', 'completed', '2030-01-01T00:00:00.000000+00:00', '2030-01-01T00:00:00.000000+00:00', "
            "'2030-01-01T00:00:01.000000+00:00', 'chat')", (b"\x01\x00\x00\x00",))
        conn.execute("INSERT INTO feedback (session_id, rating, note, created_at) VALUES ('old', 'up', '', 'x')")
        conn.execute("INSERT INTO chat_threads (session_id, thread_id, position, created_at) VALUES ('old', 't', 0, "
                     "'x')")
    with store_target.open() as log:
        assert log.get("old").owner == "local"
        local = ScopedStore(log, Viewer("local"))
        assert [s.session_id for s in local.list_sessions()] == ["old"]
        assert local.thread_sessions("t") == ["old"] and len(local.feedback("old")) == 1
        with log.transaction(write=False) as conn:
            assert conn.execute("SELECT owner FROM feedback").fetchone()[0] == "local"
            assert conn.execute("SELECT owner FROM chat_threads").fetchone()[0] == "local"
        assert log.completed_unjudged() == ["old"]  # the deployment default (consent) applies to old rows too


def test_accounts_hash_passwords_and_refuse_bad_input(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        users = Users(log)
        alice = users.add("alice", password="correct horse", role="admin")
        assert (alice.user_id, alice.kind, alice.role, alice.consent) == ("alice", "password", "admin", None)
        assert "correct horse" not in repr(alice)
        with log.transaction(write=False) as conn:
            stored = conn.execute("SELECT password_hash FROM users WHERE user_id = 'alice'").fetchone()[0]
        assert stored.startswith("$2") and "correct horse" not in stored
        assert users.verify_password("alice", "correct horse") == alice
        assert users.verify_password("alice", "wrong horse!") is None
        assert users.verify_password("nobody", "correct horse") is None
        assert users.verify_password("alice", "x" * 100) is None  # over bcrypt's 72 bytes: a failed login
        with pytest.raises(InvalidInput, match="at most 72 bytes"):
            users.add("bob", password="é" * 40)  # 80 bytes in UTF-8: refused, never truncated
        with pytest.raises(InvalidInput, match="at least 8"):
            users.add("bob", password="short")
        with pytest.raises(InvalidInput, match="has no password"):
            users.add("carol@example.org", kind="oidc", password="something long")
        with pytest.raises(UserError, match="already exists"):
            users.add("alice", password="another password")
        oidc = users.ensure("Carol@Example.org", kind="oidc", role="user")
        assert oidc.user_id == "carol@example.org" and users.verify_password("carol@example.org", "") is None
        assert [u.user_id for u in users.list()] == ["alice", "carol@example.org"]
        with pytest.raises(UnknownUser, match="no user 'dave'"):
            users.set_consent("dave", False)
        with pytest.raises(UnknownUser):
            users.remove("dave")
        users.remove("alice")
        assert users.find("alice") is None and users.verify_password("alice", "correct horse") is None


def test_no_other_login_lands_on_a_password_account(store_target: StoreTarget) -> None:
    """Issue 34: an account named like an e-mail could be reached by an OIDC login with that address (ensure kept the
    account and handed over its sessions). Names with '@' or ':' and the names 'local' and 'mcp' are refused; ensure() never
    lands on a password account, whatever kind asks."""
    with store_target.open() as log:
        users = Users(log)
        for name in ("mallory@example.org", "shared:user", "oidc:abc:1", "local", "mcp"):
            with pytest.raises(InvalidInput, match="no '@'"):
                users.add(name, password="a long password")
        assert users.list() == []
        bob = users.add("bob", password="bob's password")
        for kind in ("oidc", "local"):
            with pytest.raises(UserError, match="'bob' is a password account"):
                users.ensure("bob", kind=kind, role="admin")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="password accounts come from"):
            users.ensure("eve", kind="password", role="user")
        assert users.get("bob") == bob and users.verify_password("bob", "bob's password") == bob
        assert users.ensure("shared:user", kind="local", role="user").kind == "local"
        assert users.ensure("shared:user", kind="local", role="admin").role == "admin"  # the role follows settings


def test_a_person_sees_only_their_own_sessions_and_another_id_reads_as_missing(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        a1 = completed(log, "alice's first question?", "alice")
        with acting_as("alice"):  # what the chat page does around a run
            a2 = completed(log, "alice's second question?")
        b1 = completed(log, "bob's question?", "bob")
        threads = ChatThreads(log)
        threads.add("thr_a", a1)
        threads.add("thr_a", a2)
        alice, bob = ScopedStore(log, Viewer("alice")), ScopedStore(log, Viewer("bob"))
        admin = ScopedStore(log, Viewer("root", admin=True))
        assert [s.session_id for s in alice.list_sessions()] == [a2, a1]
        assert [s.session_id for s in bob.list_sessions()] == [b1]
        assert [s.session_id for s in bob.list_sessions(user="alice")] == [b1]  # a user cannot filter to others
        assert {s.session_id for s in admin.list_sessions()} == {a1, a2, b1}
        assert [s.owner for s in admin.list_sessions(user="bob")] == ["bob"]
        assert admin.owners() == ["alice", "bob"] and bob.owners() == ["bob"]
        assert alice.get(a1).report == "report on alice's first question?" and admin.get(a1).owner == "alice"

        with pytest.raises(SessionNotFound) as missing:
            bob.get("0" * 32)
        for refused in (bob.get, bob.feedback, bob.judgements, bob.thread_of,
                        lambda sid: bob.add_feedback(sid, "down", "mine now"),
                        lambda sid: bob.set_learning(sid, False)):
            with pytest.raises(SessionNotFound) as caught:
                refused(a1)
            # Same words as a missing id; nothing about the session, its owner or its question.
            assert str(caught.value) == str(missing.value).replace("0" * 32, a1)
            assert "alice" not in str(caught.value)
        assert bob.thread_sessions("thr_a") == [] and alice.thread_sessions("thr_a") == [a1, a2]
        assert log.feedback(a1) == [] and not log.get(a1).training_opt_out  # the refused writes wrote nothing

        alice.add_feedback(a1, "up", "good")
        admin.add_feedback(b1, None, "an admin's note")
        with log.transaction(write=False) as conn:
            owners = conn.execute("SELECT session_id, owner FROM feedback ORDER BY feedback_id").fetchall()
        assert [tuple(r) for r in owners] == [(a1, "alice"), (b1, "root")]


def test_consent_decides_what_is_judged_reflected_and_trained_on(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        users = Users(log)
        users.add("yes@example.org", kind="oidc", consent=True)
        users.add("no@example.org", kind="oidc", consent=False)
        yes = completed(log, "a consenting question?", "yes@example.org")
        no = completed(log, "a refusing question?", "no@example.org")
        default = completed(log, "an undecided question?", "local")
        with acting_as("yes@example.org", learn=False):  # the chat's per-session toggle, off before asking
            toggled = completed(log, "not this one?")
        completed(log, "a benchmark question?", "local", source="eval")
        registry = Registry(log)
        window_end = log.now()
        assert log.completed_unjudged() == [yes, default]
        assert registry.sessions_in_window(None, window_end) == [yes, default]
        assert registry.skipped_in_window(None, window_end) == 2  # the refusing user and the toggled session
        for sid in (yes, default):
            log.record_judgement(sid, "judge", {"stages": {}})
        assert log.sessions_without_reflection() == [yes, default]

        # Withdrawing consent covers sessions already logged; the per-session toggle works both ways.
        users.set_consent("yes@example.org", False)
        ScopedStore(log, Viewer("local")).set_learning(default, False)
        assert registry.sessions_in_window(None, window_end) == [] and log.sessions_without_reflection() == []
        users.set_consent("yes@example.org", None)  # back to the deployment default (on)
        ScopedStore(log, Viewer("yes@example.org")).set_learning(toggled, True)
        assert registry.sessions_in_window(None, window_end) == [yes, toggled]
        assert users.consents("no@example.org") is False and users.consents("stranger") is True
    # The deployment default off: people who have not chosen are left out, those who said yes are not.
    with store_target.open(consent_default=False) as log:
        assert Registry(log).sessions_in_window(None, window_end) == []
        Users(log).set_consent("yes@example.org", True)
        assert Registry(log).sessions_in_window(None, window_end) == [yes, toggled]
        assert Users(log).set_consent("local", True).consent is True  # the local user gets a row on first use
        assert Registry(log).sessions_in_window(None, window_end) == [yes, toggled]  # `default` is toggled off


def test_reflection_and_feedback_rubrics_of_a_refusing_person_are_never_used(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        Users(log).add("no@example.org", kind="oidc", consent=False)
        sid = completed(log, "q?", "no@example.org")
        log.record_judgement(sid, "judge", {"stages": {}})  # judged before they said no
        assert log.sessions_without_reflection() == []
        # Their notes would become judge rubrics for everyone's sessions of the question: left out.
        other = completed(log, "Q?", "yes@example.org")
        log.add_feedback(sid, "down", "a refusing person's note")
        log.add_feedback(other, "down", "a consenting person's note")
        assert [f.note for f in log.feedback_for_question("q?")] == ["a consenting person's note"]
