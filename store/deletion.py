"""Deleting a person's data, down to what was derived from it (issue 18).

One database transaction removes their sessions with turns, tool calls, snippets, judgements, feedback, chat-thread
rows and reflection candidates, the judge's rubric buffers of their questions, and (unless kept) their account; it
records the deletion (a SHA-256 of the subject, who asked, when, how many rows per table; never content) and marks
the policy versions whose training window held their learnable sessions, and versions trained from those. A failure
anywhere rolls all of it back: never half-deleted.

Rubric-bank items reflected from their sessions live in Chroma, outside that transaction. Their ids (and the session
ids, random hex, which also find items stored under another id) stay listed on the deletion record until a removal
succeeds; the removal is idempotent, so `resume_deletions` (run again by every later deletion, and by
`rubricem users delete-data`) finishes an interrupted one.

Copies outside the database (issue 34), given as `Copies`: every retraining cycle whose window held their learnable
sessions, or whose `questions.jsonl` names one of their questions, is recorded against the deletion
(`cycle_data_deletions`, same transaction). A finished cycle's whole run folder (questions, the rollouts' log, every
checkpoint's copy of it and of the run bank) and its `<bank>_run_<cycle>` collection are then removed: a run folder
is scratch once its cycle has finished (the adapter it produced was copied to runs/adapters), so removing it whole is
simpler and surer than rewriting three copies of a SQLite file. A cycle still running is left alone; the version it
registers carries the deletion's mark (`Registry.register` copies the rows) and its own clean-up removes its folder
when it ends (`app.retrain.purge_runs`). The judge's answer cache is emptied: its entries are keyed by a hash of the
whole request, so whose they are cannot be told, and it only saves judge calls.

The judge's rubric buffers: a buffer of a question they asked goes (its rubrics were generated from trajectories that
include theirs); in a buffer of a question they only gave feedback on, only rubrics made from feedback notes go
(written there by judges before issue 34; notes now reach the judge of their giver's sessions only and are never
saved in the shared buffer, so other people's notes stay in the feedback table and keep judging their sessions).

Work running when a deletion commits does not undo it (issue 46): the number of deletion records is the store's
deletion epoch (`SessionLog.deletion_epoch`), which a judge reads before the sessions it judges; its rubric-buffer
save writes nothing once the epoch has grown. The reflection writer takes back a bank item whose session is gone.
A judge answer on its way when the judge cache is emptied is not written after it (issue 65): `clear_judge_cache`
first renews the folder's generation, which the cache's write checks under the same lock.

What a trained adapter learned cannot be taken out of it: the marks say which versions that concerns.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from store.db import Connection
from store.records import normalise_question, question_sha, sha256_text
from store.session_log import SessionLog
from store.session_log.codec import mapping_in, text_out
from store.users import UnknownUser, check_user_id

# Child tables first; each keyed by session. feedback also by its giver (their notes on an admin's... own sessions).
_SESSION_TABLES = ("snippets", "tool_calls", "turns", "judgements", "feedback", "chat_threads",
                   "reflection_candidates")
_OWNED = "SELECT session_id FROM sessions WHERE owner = ?"


FEEDBACK_RUBRIC_TITLE = "Address user feedback: "  # learning.judge.feedback.FEEDBACK_TITLE_PREFIX (a test ties them)
_CACHE_DIR = re.compile(r"^[0-9a-f]{2}$")
_CACHE_ENTRY = re.compile(r"^(\.[0-9a-f]{8}-.*\.tmp|[0-9a-f]{64}\.json)$")
# Beside the judge cache's entries (issue 65, finding 12): a lock every process sharing the folder takes, and the
# folder's generation, a random token each clear replaces. A judge call reads the generation before it asks the
# endpoint and writes its answer only if the generation is still the same, under the lock.
JUDGE_CACHE_LOCK = ".lock"
JUDGE_CACHE_GENERATION = ".generation"


class DerivedBank(Protocol):
    """The part of the rubric bank a deletion needs (`store.rubric_bank.RubricBank` has it)."""

    def delete_derived(self, session_ids: Sequence[str], item_ids: Sequence[str] = ()) -> int: ...


class RunBanks(Protocol):
    """Drops a retraining cycle's own bank collection (`store.rubric_bank.RubricBank` has it)."""

    def drop_run_collection(self, cycle_id: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Copies:
    """Where copies of people's data live outside the database, on this host (issue 34).

    Attributes:
        runs_dir: DATA_DIR/runs, one folder per retraining cycle named after it (runs/adapters is never touched).
        judge_cache: The judge's answer cache folder (None: no cache).
        run_banks: What drops a cycle's `<bank>_run_<cycle>` collection (None: the bank is unreachable; the drop
            stays pending and the next deletion or cycle retries it).
        scratch: Files removed whole by every deletion: the promotion gate's probe log and its judge's rubric
            buffers, which hold a team's recent questions (issue 49). The gate starts them afresh when they are gone.
    """

    runs_dir: Path
    judge_cache: Path | None = None
    run_banks: RunBanks | None = None
    scratch: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True)
class CopiesPurged:
    """What a purge of copies did, and what is left (retried by the next deletion and by every cycle's clean-up)."""

    run_folders: int = 0
    run_collections: int = 0
    cache_entries: int = 0
    running: tuple[str, ...] = ()  # cycles still running: their clean-up removes their folder; their version is marked
    failed: tuple[str, ...] = ()  # what could not be removed, and why

    @property
    def done(self) -> bool:
        """Nothing failed (cycles still running are handled by their own clean-up)."""
        return not self.failed


@dataclass(frozen=True, slots=True)
class DeletionResult:
    """What one deletion removed and marked."""

    deletion_id: str
    counts: Mapping[str, int]  # rows removed per table
    bank_items_removed: int
    bank_pending: bool  # the bank part is still to do (no bank given, or it failed): `resume_deletions` retries it
    marked_versions: tuple[str, ...]  # policy versions trained on data now deleted
    cycles: tuple[str, ...] = ()  # retraining cycles that held their data (recorded against the deletion)
    copies: CopiesPurged | None = None  # run folders, run collections, judge cache removed (None: no Copies given)


def subject_sha(user_id: str) -> str:
    """How a deletion record names whose data it was: an auditor holding the id can check it, the row cannot be
    read back into a name."""
    return sha256_text("rubricem-user:" + check_user_id(user_id))


def _learned(conn: Connection, owner: str) -> list[tuple[str, str | None]]:
    """When each of their learnable sessions finished, and its team (what a training window is matched against)."""
    return [(str(r[0]), None if r[1] is None else str(r[1])) for r in conn.execute(
        "SELECT finished_at, team FROM sessions WHERE owner = ? AND status = 'completed' AND training_opt_out = 0 "
        "AND finished_at IS NOT NULL", (owner,)).fetchall()]


def _in_window(learned: Sequence[tuple[str, str | None]], start: str | None, end: str | None,
               team: str | None = None) -> bool:
    """Whether a training window held one of their sessions. A team's window (issue 49) holds only that team's
    sessions; the global policy's window counts every session, a team's included (conservative: the team may have
    shared its sessions with the global policy when that cycle ran)."""
    return end is not None and any((start or "") < f <= end and (team is None or t == team) for f, t in learned)


def _run_questions(runs_dir: Path, cycle_id: str) -> set[str]:
    """The normalised questions of a cycle's run folder (none when it has no readable questions.jsonl)."""
    found: set[str] = set()
    try:
        lines = (runs_dir / cycle_id / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return found
    for line in lines:
        try:
            q = json.loads(line).get("question")
        except (ValueError, AttributeError):
            continue
        if isinstance(q, str):
            found.add(normalise_question(q))
    return found


def _affected_cycles(conn: Connection, learned: Sequence[tuple[str, str | None]], questions: set[str],
                     runs_dir: Path | None) -> list[str]:
    """Cycles whose window held their learnable sessions, or whose run folder names one of their questions."""
    hit = []
    for cycle_id, start, end, team in conn.execute(
            "SELECT cycle_id, window_start, window_end, team FROM retrain_cycles WHERE status != 'skipped'").fetchall():
        if _in_window(learned, start, end, team) or (
                runs_dir is not None and questions and questions & _run_questions(runs_dir, str(cycle_id))):
            hit.append(str(cycle_id))
    return sorted(hit)


def _affected_versions(conn: Connection, learned: Sequence[tuple[str, str | None]],
                       cycles: Sequence[str]) -> list[str]:
    versions = conn.execute("SELECT name, parent, data_window_json, training_run, team FROM policy_versions").fetchall()
    # Conservative: a window that held any of their learnable sessions counts, whatever their consent was then; so
    # does a version a cycle that held their data trained (one still running when the deletion commits included).
    hit: set[str] = set()
    for name, _parent, window_json, run, team in versions:
        window = json.loads(window_json or "{}")
        if _in_window(learned, window.get("start"), window.get("end"), team) or (run and str(run) in cycles):
            hit.add(str(name))
    grew = True
    while grew:  # a version trained from a marked one carries what its parent learned (a team's first version
        grew = False  # starts from the global one)
        for name, parent, *_ in versions:
            if parent in hit and name not in hit:
                hit.add(str(name))
                grew = True
    return sorted(hit)


def owned_sessions(log: SessionLog, user_id: str) -> list[str]:
    """Ids of every session `user_id` owns (what a deletion will remove): for purging what lives outside this
    database first, such as the LangGraph checkpoints of their running or paused sessions (`app.durable`)."""
    owner = check_user_id(user_id)
    with log.transaction(write=False) as conn:
        return [str(r[0]) for r in conn.execute(_OWNED, (owner,)).fetchall()]


def delete_user_data(log: SessionLog, user_id: str, *, requested_by: str, bank: DerivedBank | None = None,
                     keep_account: bool = False, copies: Copies | None = None) -> DeletionResult:
    """Delete everything of `user_id` (see the module docstring); returns what was removed.

    Args:
        log: The store.
        user_id: Whose data.
        requested_by: Who asked (an admin's id, or the person themselves; recorded as "self" then).
        bank: The rubric bank; None leaves the bank part pending (a later `resume_deletions` does it).
        keep_account: Keep their `users` row (the UI's "delete my data" keeps the person logged in).
        copies: Where run folders, run collections and the judge cache live on this host; None records the cycles
            that held their data (and marks their versions) but removes no copy (a later deletion or cycle does).

    Raises:
        InvalidInput: not a usable user id.
        UnknownUser: nobody with that id and no data owned by it (nothing written).
    """
    owner = check_user_id(user_id)
    actor = "self" if check_user_id(requested_by) == owner else check_user_id(requested_by)
    deletion_id = f"del-{uuid.uuid4().hex[:16]}"
    with log.transaction(write=True) as conn:
        account = conn.execute("SELECT 1 FROM users WHERE user_id = ?", (owner,)).fetchone() is not None
        sessions = [str(r[0]) for r in conn.execute(_OWNED, (owner,)).fetchall()]
        given = int(conn.execute("SELECT COUNT(*) FROM feedback WHERE owner = ?", (owner,)).fetchone()[0])
        if not account and not sessions and not given:
            raise UnknownUser(owner)
        items = sorted({str(r[0]) for r in conn.execute(
            f"SELECT bank_item_id FROM reflection_candidates WHERE bank_item_id IS NOT NULL AND session_id IN ({_OWNED})",
            (owner,)).fetchall()})
        learned = _learned(conn, owner)
        questions = {normalise_question(text_out(r[0]))
                     for r in conn.execute("SELECT question FROM sessions WHERE owner = ?", (owner,)).fetchall()}
        cycles = _affected_cycles(conn, learned, questions, copies.runs_dir if copies is not None else None)
        marked = _affected_versions(conn, learned, cycles)
        shas = {question_sha(q) for q in questions}
        # Questions they only gave notes on (an admin's notes on someone else's session): their buffers stay, less
        # the rubrics made from notes.
        noted = {question_sha(normalise_question(text_out(r[0]))) for r in conn.execute(
            "SELECT s.question FROM feedback f JOIN sessions s ON s.session_id = f.session_id WHERE f.owner = ?",
            (owner,)).fetchall()} - shas
        counts: dict[str, int] = {}
        for table in _SESSION_TABLES:  # table names are ours, not input
            extra = " OR owner = ?" if table == "feedback" else ""
            cur = conn.execute(f"DELETE FROM {table} WHERE session_id IN ({_OWNED}){extra}",
                               (owner, owner) if extra else (owner,))
            counts[table] = max(cur.rowcount, 0)
        counts["sessions"] = max(conn.execute("DELETE FROM sessions WHERE owner = ?", (owner,)).rowcount, 0)
        counts["rubric_buffers"] = sum(
            max(conn.execute("DELETE FROM rubric_buffers WHERE question_sha = ?", (sha,)).rowcount, 0) for sha in shas)
        counts["rubric_buffers_rewritten"] = sum(_drop_feedback_rubrics(conn, sha, log.now()) for sha in sorted(noted))
        counts["users"] = 0 if keep_account else max(
            conn.execute("DELETE FROM users WHERE user_id = ?", (owner,)).rowcount, 0)
        pending = {"sessions": sessions, "items": items} if sessions or items else {}
        conn.execute(
            "INSERT INTO data_deletions (deletion_id, subject_sha, requested_by, counts_json, pending_bank_json, "
            "created_at, bank_done_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (deletion_id, subject_sha(owner), actor, json.dumps(counts, sort_keys=True), json.dumps(pending),
             log.now(), None if pending else log.now()))
        conn.executemany("INSERT INTO version_data_deletions (version, deletion_id) VALUES (?, ?)",
                         [(v, deletion_id) for v in marked])
        conn.executemany("INSERT INTO cycle_data_deletions (cycle_id, deletion_id) VALUES (?, ?)",
                         [(c, deletion_id) for c in cycles])
    removed, still_pending = 0, bool(pending)
    purged = purge_copies(log, copies, clear_cache=True) if copies is not None else None
    if bank is not None:
        done = resume_deletions(log, bank)
        removed, still_pending = done.get(deletion_id, 0), deletion_id not in done and bool(pending)
    return DeletionResult(deletion_id, counts, removed, still_pending, tuple(marked), tuple(cycles), purged)


def _drop_feedback_rubrics(conn: Connection, sha: str, now: str) -> int:
    """Take the rubrics made from feedback notes out of one saved buffer (learning.judge.buffer's payload, format 1:
    persistent rubrics under "persistent"); returns 1 when the buffer changed. A payload of another shape is left."""
    row = conn.execute("SELECT payload_json FROM rubric_buffers WHERE question_sha = ?", (sha,)).fetchone()
    if row is None:
        return 0
    try:
        payload: Any = json.loads(text_out(row[0]))
        persistent = payload["persistent"]
        kept = [r for r in persistent if not str(r.get("title", "")).startswith(FEEDBACK_RUBRIC_TITLE)]
    except (ValueError, KeyError, TypeError, AttributeError):
        return 0
    if len(kept) == len(persistent):
        return 0
    payload["persistent"] = kept
    conn.execute("UPDATE rubric_buffers SET payload_json = ?, version = version + 1, updated_at = ? "
                 "WHERE question_sha = ?", (mapping_in(payload, "payload"), now, sha))
    return 1


def purge_copies(log: SessionLog, copies: Copies, *, clear_cache: bool = False) -> CopiesPurged:
    """Remove the run folder and run collection of every finished cycle a deletion was recorded against (idempotent:
    what is gone is skipped), and with `clear_cache` every entry of the judge's answer cache.

    Never raises for a copy it cannot remove: the failure is returned (and the record stays, so the next deletion or
    cycle clean-up tries again)."""
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT DISTINCT d.cycle_id, c.status FROM cycle_data_deletions d JOIN retrain_cycles c "
                            "ON c.cycle_id = d.cycle_id ORDER BY d.cycle_id").fetchall()
    folders = collections = entries = 0
    running: list[str] = []
    failed: list[str] = []
    for cycle_id, status in rows:
        cycle_id = str(cycle_id)
        if status == "running":
            running.append(cycle_id)
            continue
        try:
            folders += int(remove_run_folder(copies.runs_dir, cycle_id))
        except OSError as exc:
            failed.append(f"run folder {copies.runs_dir / cycle_id}: {exc}")
        if copies.run_banks is None:
            failed.append(f"run collection of {cycle_id}: the rubric bank is unavailable")
            continue
        try:
            collections += int(copies.run_banks.drop_run_collection(cycle_id))
        except Exception as exc:  # noqa: BLE001 - a Chroma failure is reported and retried, never half-raised
            failed.append(f"run collection of {cycle_id}: {type(exc).__name__}: {exc}")
    if clear_cache and copies.judge_cache is not None:
        entries, cache_failed = clear_judge_cache(copies.judge_cache)
        failed.extend(cache_failed)
    if clear_cache:
        for path in copies.scratch:  # SQLite files: their journal and WAL files too
            for part in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"),
                         path.with_name(path.name + "-journal")):
                try:
                    part.unlink(missing_ok=True)
                except OSError as exc:
                    failed.append(f"gate scratch file {part}: {exc}")
    return CopiesPurged(folders, collections, entries, tuple(running), tuple(failed))


def remove_run_folder(runs_dir: Path, cycle_id: str) -> bool:
    """Remove DATA_DIR/runs/<cycle> whole; False when it was not there. What another process removed meanwhile is
    not an error.

    Raises:
        OSError: the folder could not be removed.
    """
    folder = runs_dir / cycle_id
    if not cycle_id or folder.parent != runs_dir or cycle_id == "adapters" or not folder.is_dir():
        return False

    def gone_already(_fn: Any, _path: str, exc_info: Any) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(folder, onerror=gone_already)
    return True


def clear_judge_cache(root: Path) -> tuple[int, list[str]]:
    """Remove every judge-cache entry under `root` (`learning.judge.cache.JudgeCache`'s layout: `<key[:2]>/<key>.json`
    and its temporary files); anything else in the folder is left. Returns (entries removed, failures).

    First, under the cache's lock, the folder gets a new generation (the folder is made if it is not there yet): a
    judge call already waiting on the endpoint when this runs may hold a deleted person's text, and its write, which
    checks the generation under the same lock, is then dropped instead of landing after the clear (issue 65)."""
    try:
        with judge_cache_lock(root):
            _new_generation(root)
    except OSError as exc:
        return 0, [f"judge cache generation in {root}: {exc}"]
    removed, failed = 0, []
    for sub in root.iterdir():
        if not (sub.is_dir() and _CACHE_DIR.match(sub.name)):
            continue
        for entry in sub.iterdir():
            if not _CACHE_ENTRY.match(entry.name):
                continue
            try:
                entry.unlink()
                removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                failed.append(f"judge cache entry {entry}: {exc}")
    return removed, failed


@contextlib.contextmanager
def judge_cache_lock(root: Path) -> Iterator[None]:
    """Hold the judge cache folder's lock (an advisory `flock` on `root/.lock`, made with the folder if missing).

    Every process sharing the folder takes it: the app (deletions), `rubricem judge` and the retraining cycle's judge
    (writes). The lock is per open file, so threads of one process exclude each other too.

    Raises:
        OSError: the folder or its lock file cannot be made or opened.
    """
    root.mkdir(parents=True, exist_ok=True)
    with open(root / JUDGE_CACHE_LOCK, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def judge_cache_generation(root: Path) -> str | None:
    """The judge cache folder's generation: "" before any clear, the token the last clear wrote, or None when it
    cannot be read (a write is then never allowed: whether a clear came in between cannot be told)."""
    try:
        return (root / JUDGE_CACHE_GENERATION).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return ""
    except (OSError, ValueError):
        return None


def _new_generation(root: Path) -> None:
    """Replace the folder's generation by a fresh random token, atomically (temp file + rename). Call under the lock."""
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".generation-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(secrets.token_hex(16))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, root / JUDGE_CACHE_GENERATION)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def resume_deletions(log: SessionLog, bank: DerivedBank) -> dict[str, int]:
    """Finish the bank part of every deletion still pending; returns {deletion id: items removed} for those done.

    A bank error propagates and leaves the rest pending (retried next time)."""
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT deletion_id, pending_bank_json FROM data_deletions WHERE bank_done_at IS NULL "
                            "ORDER BY created_at").fetchall()
    done: dict[str, int] = {}
    for deletion_id, pending_json in rows:
        pending = json.loads(pending_json or "{}")
        removed = bank.delete_derived(pending.get("sessions", []), pending.get("items", []))
        with log.transaction(write=True) as conn:
            conn.execute("UPDATE data_deletions SET pending_bank_json = '{}', bank_done_at = ? WHERE deletion_id = ?",
                         (log.now(), deletion_id))
        done[str(deletion_id)] = removed
    return done


@dataclass(frozen=True, slots=True)
class DeletionRecord:
    """A recorded deletion, as an admin may list it (no content, no identity)."""

    deletion_id: str
    subject_sha: str
    requested_by: str
    counts: Mapping[str, int]
    created_at: str
    bank_done: bool
    versions: tuple[str, ...]


def deletions(log: SessionLog) -> list[DeletionRecord]:
    """Every recorded deletion, oldest first, with the versions it marked."""
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT deletion_id, subject_sha, requested_by, counts_json, created_at, bank_done_at "
                            "FROM data_deletions ORDER BY created_at").fetchall()
        marks = conn.execute("SELECT deletion_id, version FROM version_data_deletions ORDER BY version").fetchall()
    by: dict[str, list[str]] = {}
    for deletion_id, version in marks:
        by.setdefault(str(deletion_id), []).append(str(version))
    return [DeletionRecord(str(r[0]), str(r[1]), str(r[2]), json.loads(r[3]), str(r[4]), r[5] is not None,
                           tuple(by.get(str(r[0]), ()))) for r in rows]


def versions_trained_on_deleted_data(log: SessionLog) -> dict[str, int]:
    """{policy version: how many deletions touched its training data}."""
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT version, COUNT(*) FROM version_data_deletions GROUP BY version").fetchall()
    return {str(v): int(n) for v, n in rows}
