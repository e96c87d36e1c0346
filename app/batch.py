"""Batch reports: research every question of a JSONL or CSV file through `ResearchService.run`, writing one
Markdown and one JSON file per item and an index; a rerun resumes (finished items are skipped).

Resuming, per item (matched by id, and only while the stored question is the same):
- a `done` record with its Markdown file is skipped;
- a `failed` record of kind `input` (empty or over-long question) is skipped while the question is still refused
  (bad input fails the same way every time, so a rerun does nothing new for it);
- a `failed` record of kind `run` (the policy server died, a time limit, ...) is retried.
An item whose question changed since its record was written is researched again and its files replaced. Changed
run options (format, budgets) do not invalidate a finished item: delete its `<id>.json` to redo it.

Tokens and cost (issue 36): each item's record keeps what its session's policy read and sampled and what that cost
under the price table in force when the item finished (`agent.accounting`; a failed run's session counts too, its
tokens were spent). The index sums them over every item that has them; a cost with an unknown part is unknown.
Batch sessions are judged later (`rubricem judge`, a retraining cycle), so the judge's tokens are not in a batch's
figures: `rubricem sessions show ID` has them per session.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from agent.accounting import PriceTable, SessionUsage, add_costs, format_cost, usage_of
from agent.config import FormatLabel, RunOptions
from agent.errors import InputError
from agent.run import validate_question
from app.service import CITATION_COUNT_FIELDS, ResearchService, RunFailedError, citation_counts, stage_summary

INDEX_MD, INDEX_JSON = "index.md", "index.json"
RECORD_VERSION = 1
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_FORMATS: tuple[str, ...] = get_args(FormatLabel)
_RESERVED_IDS = {"index"}  # index.md / index.json are the batch's own files

ItemStatus = Literal["done", "failed", "skipped"]
ErrorKind = Literal["input", "run"]


class BatchInputError(InputError):
    """The queries file (or the item list) is unusable; the message names the file and line. Nothing was run."""


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One question of a batch. `id` names its output files; `format` overrides the run's answer format."""

    id: str
    question: str
    format: FormatLabel | None = None
    line: int = 0  # line in the queries file (0 when built in code)


@dataclass(frozen=True, slots=True)
class ItemResult:
    """What happened to one item in this run (`skipped`: finished earlier) and what its record says now."""

    id: str
    status: ItemStatus
    recorded: Literal["done", "failed"]
    error: str | None = None
    error_kind: ErrorKind | None = None
    session_id: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """The outcome of `run_batch`. Throughput counts reports completed in this run per wall-clock minute."""

    total: int
    done: int
    failed: int
    skipped: int
    seconds: float
    throughput_per_min: float
    concurrency: int
    policy_version: str
    items: tuple[ItemResult, ...]
    out_dir: Path
    index_md: Path
    index_json: Path
    usage: BatchUsage | None = None  # summed over every item record that has it (this run's and earlier runs')

    @property
    def unfinished(self) -> int:
        """Items whose record is not `done` (failed now or earlier): the batch is incomplete while this is > 0."""
        return sum(1 for r in self.items if r.recorded != "done")


@dataclass(frozen=True, slots=True)
class BatchUsage:
    """The policy's tokens and cost summed over a batch's item records (see the module docstring)."""

    items: int  # records with figures
    policy_calls: int
    prompt_tokens: int
    sampled_tokens: int
    cost_usd: float | None  # None: unknown (an item's model is not in a non-empty price table)


@dataclass(frozen=True, slots=True)
class ItemStarted:
    """A research session for this item is starting (it holds one of the concurrency slots)."""

    item_id: str
    question: str


@dataclass(frozen=True, slots=True)
class ItemFinished:
    """An item is finished for this run; `finished` of `total` items are."""

    result: ItemResult
    finished: int
    total: int


BatchEvent = ItemStarted | ItemFinished
BatchProgress = Callable[[BatchEvent], None]


# ---------------------------------------------------------------- input


MAX_LINE_BYTES = 1 << 20
"""Longest line of a queries file (a question is at most a few thousand characters)."""

MAX_QUESTIONS = 10_000
"""Most questions one queries file may hold by default (`sessions.batch_max_questions`)."""


def load_items(path: Path, max_questions: int = MAX_QUESTIONS) -> list[BatchItem]:
    """Read and check a queries file: `.jsonl` (objects with "question", optional "id" and "format") or `.csv`
    (a header with a "question" column, optional "id" and "format" columns). The file is read line by line (issue
    34: never whole), each line at most MAX_LINE_BYTES, and at most `max_questions` questions.

    Items without an id get their position in the file, zero-padded ("0001", ...). An empty or over-long question is
    not a file error: it is kept, and fails as that item's own recorded failure.

    Raises:
        BatchInputError: the file is missing, unreadable, not UTF-8, has no questions or more than `max_questions`,
            or a line is too long or malformed (not a JSON object, no "question" string, a bad id or format, a
            duplicate id); the message names the line.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".ndjson", ".csv"):
        raise BatchInputError(f"{path}: a queries file must be .jsonl or .csv")
    try:
        with open(path, "rb") as fh:
            lines = _lines(path, fh)
            rows = (_csv_rows(path, lines, max_questions) if suffix == ".csv"
                    else _jsonl_rows(path, lines, max_questions))
    except FileNotFoundError as exc:
        raise BatchInputError(f"{path}: no such file") from exc
    except OSError as exc:
        raise BatchInputError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if not rows:
        raise BatchInputError(f"{path}: has no questions")
    width = max(4, len(str(len(rows))))
    items: list[BatchItem] = []
    seen: dict[str, int] = {}
    for n, (line, fields) in enumerate(rows, start=1):
        raw_id = fields.get("id")
        item_id = f"{n:0{width}d}" if raw_id in (None, "") else _check_id(path, line, raw_id)
        if item_id in seen:
            raise BatchInputError(f"{path}, line {line}: id {item_id!r} is already used on line {seen[item_id]}")
        seen[item_id] = line
        fmt = fields.get("format")
        if fmt in (None, ""):
            fmt = None
        elif fmt not in _FORMATS:
            raise BatchInputError(f"{path}, line {line}: format {fmt!r} is not one of {', '.join(_FORMATS)}")
        items.append(BatchItem(item_id, fields["question"], fmt, line))  # type: ignore[arg-type]
    return items


def _check_id(path: Path, line: int, raw: object) -> str:
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise BatchInputError(f"{path}, line {line}: id must be a string or an integer, not {type(raw).__name__}")
    item_id = str(raw).strip()
    if not _ID_RE.fullmatch(item_id) or item_id.lower() in _RESERVED_IDS:
        raise BatchInputError(
            f"{path}, line {line}: id {item_id!r} cannot name a file: use 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (and not 'index')"
        )
    return item_id


def _lines(path: Path, fh: Any) -> Iterator[str]:
    """The file's lines as text, one at a time (ends kept; split at "\\n" only, so a U+2028 inside a JSON string
    stays in its line); a line over MAX_LINE_BYTES or not UTF-8 is refused, naming it."""
    line = 0
    while raw := fh.readline(MAX_LINE_BYTES + 1):
        line += 1
        if len(raw) > MAX_LINE_BYTES:
            raise BatchInputError(f"{path}, line {line}: longer than {MAX_LINE_BYTES:,} bytes")
        try:
            yield raw.decode("utf-8-sig" if line == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise BatchInputError(f"{path}, line {line}: not UTF-8 text") from exc


def _too_many(path: Path, line: int, max_questions: int) -> BatchInputError:
    return BatchInputError(f"{path}, line {line}: more than {max_questions:,} questions in one file: split it, or "
                           "raise RUBRICEM_SESSIONS__BATCH_MAX_QUESTIONS")


def _jsonl_rows(path: Path, lines: Iterator[str], max_questions: int) -> list[tuple[int, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    for line, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BatchInputError(f"{path}, line {line}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(obj, dict):
            raise BatchInputError(f"{path}, line {line}: expected a JSON object with a \"question\" field")
        if "question" not in obj:
            raise BatchInputError(f"{path}, line {line}: no \"question\" field")
        if not isinstance(obj["question"], str):
            raise BatchInputError(f"{path}, line {line}: \"question\" must be a string")
        try:
            obj["question"].encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate escape ("\\ud800") is valid JSON but not text
            raise BatchInputError(f"{path}, line {line}: \"question\" is not valid Unicode text") from exc
        if len(rows) >= max_questions:
            raise _too_many(path, line, max_questions)
        rows.append((line, obj))
    return rows


def _csv_rows(path: Path, lines: Iterator[str], max_questions: int) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.reader(lines)  # line 1 is decoded as utf-8-sig: a BOM is what spreadsheet programs write
    try:
        header = next(reader, None)
        if header is None:
            raise BatchInputError(f"{path}: is empty (expected a header line with a \"question\" column)")
        names = [h.strip().lower() for h in header]
        if "question" not in names:
            raise BatchInputError(
                f"{path}, line 1: the header has no \"question\" column (found: {', '.join(map(repr, names))})"
            )
        rows: list[tuple[int, dict[str, Any]]] = []
        start = reader.line_num + 1
        for values in reader:
            line, start = start, reader.line_num + 1  # a quoted field may span lines: name the row's first line
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(names):
                raise BatchInputError(f"{path}, line {line}: {len(values)} field(s), the header has {len(names)}")
            if len(rows) >= max_questions:
                raise _too_many(path, line, max_questions)
            rows.append((line, dict(zip(names, values, strict=True))))
    except csv.Error as exc:
        raise BatchInputError(f"{path}, line {reader.line_num}: {exc}") from exc
    return rows


# ---------------------------------------------------------------- output


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename, so a reader (or a rerun
    after a crash) sees either the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_record(out_dir: Path, item: BatchItem) -> dict[str, Any] | None:
    """The stored record of `item`, or None when there is none, it cannot be read, or it is for another question."""
    try:
        record = json.loads((out_dir / f"{item.id}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("question") != item.question:
        return None
    if record.get("status") == "done" and not (out_dir / f"{item.id}.md").is_file():
        return None  # the report went missing: redo it
    return record if record.get("status") in ("done", "failed") else None


def _usage_record(usage: SessionUsage | None) -> dict[str, Any] | None:
    """An item's figures: the policy's calls and tokens, and their cost (None: unknown)."""
    if usage is None:
        return None
    return {"policy_model": usage.policy_model, "policy_calls": usage.policy_calls,
            "prompt_tokens": usage.prompt_tokens, "sampled_tokens": usage.sampled_tokens,
            "cost_usd": usage.policy_cost}


def _usage_of(service: ResearchService, sid: str | None, prices: PriceTable) -> dict[str, Any] | None:
    """The session's figures from the log, or None (no session, or the log cannot say: the report matters more)."""
    if sid is None:
        return None
    try:
        return _usage_record(usage_of(service.log, sid, prices))
    except Exception:  # noqa: BLE001 - figures are an extra; a store hiccup must not fail a finished item
        return None


def batch_usage(records: Sequence[dict[str, Any] | None]) -> BatchUsage:
    """The figures summed over the records that have them."""
    figures = [r["usage"] for r in records if r and isinstance(r.get("usage"), dict)]
    return BatchUsage(
        items=len(figures), policy_calls=sum(int(f.get("policy_calls") or 0) for f in figures),
        prompt_tokens=sum(int(f.get("prompt_tokens") or 0) for f in figures),
        sampled_tokens=sum(int(f.get("sampled_tokens") or 0) for f in figures),
        cost_usd=add_costs(*(f.get("cost_usd") for f in figures)),
    )  # fmt: skip


def _write_failure(out_dir: Path, item: BatchItem, kind: ErrorKind, error: str, sid: str | None, s: float,
                   usage: dict[str, Any] | None = None) -> None:
    (out_dir / f"{item.id}.md").unlink(missing_ok=True)  # a report left from an earlier question would mislead
    record = {
        "record_version": RECORD_VERSION, "id": item.id, "status": "failed", "question": item.question,
        "format": item.format, "error": error, "error_kind": kind, "session_id": sid, "seconds": round(s, 3),
        "usage": usage, "finished_at": _now(),
    }  # fmt: skip
    write_atomic(out_dir / f"{item.id}.json", json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def _write_done(out_dir: Path, item: BatchItem, outcome: Any, options: RunOptions,
                usage: dict[str, Any] | None = None) -> None:
    report = outcome.report
    record = {
        "record_version": RECORD_VERSION,
        "id": item.id,
        "status": "done",
        "session_id": outcome.session_id,
        "question": item.question,
        "format": options.format,
        "report": report.markdown,
        "citations": [{"id": s.id, "tool": s.tool, "title": s.title, "text": s.text, "url": s.url}
                      for s in report.references],
        "support": report.support.as_dict() if report.support else None,  # each cited claim, checked
        # `invented_citations` (issue 64): the counts `ask --json` gives, from the same helper, so a batch record
        # and `ask --json` agree field for field. A record written before this field existed lacks it.
        **citation_counts(report),
        "stages": stage_summary(outcome.trajectory),
        "tool_calls": len(outcome.trajectory.tool_calls),
        "policy_version": outcome.policy_version,
        "seconds": round(outcome.seconds, 3),
        "usage": usage,
        "finished_at": _now(),
    }
    # The Markdown first: the JSON is the completion marker a rerun looks for.
    write_atomic(out_dir / f"{item.id}.md", report.markdown.rstrip("\n") + "\n")
    write_atomic(out_dir / f"{item.id}.json", json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def _cell(text: str, n: int) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 1] + "…"


def write_index(out_dir: Path, items: Sequence[BatchItem]) -> tuple[Path, Path]:
    """Rebuild index.json and index.md from the item records on disk (items without one are `pending`)."""
    rows: list[dict[str, Any]] = []
    records = [read_record(out_dir, item) for item in items]
    for item, found in zip(items, records, strict=True):
        rec = found or {}
        status = rec.get("status", "pending")
        usage = rec.get("usage") if isinstance(rec.get("usage"), dict) else {}
        rows.append({
            "id": item.id, "status": status, "question": item.question, "line": item.line,
            "error": rec.get("error"), "error_kind": rec.get("error_kind"), "session_id": rec.get("session_id"),
            "policy_version": rec.get("policy_version"), "seconds": rec.get("seconds"),
            "prompt_tokens": usage.get("prompt_tokens"), "sampled_tokens": usage.get("sampled_tokens"),
            "cost_usd": usage.get("cost_usd"), "cost": format_cost(usage.get("cost_usd")) if usage else None,
            "report": f"{item.id}.md" if status == "done" else None,
            "json": f"{item.id}.json" if rec else None,
            "support": rec.get("support"),  # the support check of each cited claim (None: not checked)
            # `invented_citations` (issue 64): the record's counts, the ones `ask --json` gives (None: a failed or
            # pending item, or a record written before the count existed)
            **{k: rec.get(k) for k in CITATION_COUNT_FIELDS},
        })  # fmt: skip
    counts = {k: sum(1 for r in rows if r["status"] == k) for k in ("done", "failed", "pending")}
    total = batch_usage(records)
    usage_total = {"items": total.items, "policy_calls": total.policy_calls, "prompt_tokens": total.prompt_tokens,
                   "sampled_tokens": total.sampled_tokens, "cost_usd": total.cost_usd,
                   "cost": format_cost(total.cost_usd)}
    index = {"updated_at": _now(), "total": len(rows), "counts": counts, "usage": usage_total, "items": rows}
    json_path, md_path = out_dir / INDEX_JSON, out_dir / INDEX_MD
    write_atomic(json_path, json.dumps(index, indent=2, ensure_ascii=False) + "\n")
    lines = [
        "# Batch reports", "",
        (f"{len(rows)} item(s): {counts['done']} done, {counts['failed']} failed, {counts['pending']} pending "
         f"(updated {index['updated_at']})."), "",
        (f"Policy tokens over {total.items} item(s): {total.prompt_tokens:,} read, {total.sampled_tokens:,} sampled; "
         f"cost {format_cost(total.cost_usd)} (the judge's tokens are per session: `rubricem sessions show`)."), "",
        "| id | status | question | seconds | tokens read / sampled | cost | citations supported / re-attributed / "
        "unsupported | report or error |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in rows:
        what = f"[{r['report']}]({r['report']})" if r["report"] else _cell(
            f"{r['error_kind'] or ''} error: {r['error']}" if r["error"] else "", 120)
        seconds = "" if r["seconds"] is None else f"{r['seconds']:.1f}"
        question = _cell(r["question"], 80) or "*(empty)*"
        tokens = "" if r["cost"] is None else f"{r['prompt_tokens'] or 0:,} / {r['sampled_tokens'] or 0:,}"
        lines.append(f"| {r['id']} | {r['status']} | {question} | {seconds} | {tokens} | {r['cost'] or ''} "
                     f"| {_support_cell(r['support'])} | {what} |")
    write_atomic(md_path, "\n".join(lines) + "\n")
    return md_path, json_path


def _support_cell(support: object) -> str:
    """"2 / 1 / 0" from a stored support check; "not verified" or "" (none ran, or an older record)."""
    if not isinstance(support, dict):
        return ""
    if not support.get("verified"):
        return "not verified"
    return " / ".join(str(int(support.get(k, 0) or 0)) for k in ("supported", "reattributed", "unsupported"))


# ---------------------------------------------------------------- the run


async def run_batch(
    service: ResearchService,
    items: Sequence[BatchItem],
    out_dir: Path,
    *,
    concurrency: int = 1,
    options: RunOptions | None = None,
    progress: BatchProgress | None = None,
    prices: PriceTable | None = None,
) -> BatchSummary:
    """Research every item that is not finished yet, at most `concurrency` sessions at a time, and rebuild the index.

    All sessions share the service's one policy client: an HTTP server (vLLM, llama.cpp) receives up to
    `concurrency` requests at once; the embedded client runs one generation at a time (its lock) while the others
    wait, search or write. A failing item is recorded (`<id>.json`, status failed) and never stops the others.
    The index is rebuilt even when the batch is interrupted.

    Args:
        service: The research service (one policy, tool set and session log).
        items: The questions (ids must be unique), e.g. from `load_items`.
        out_dir: Output folder (created if missing).
        concurrency: Sessions running at once (>= 1).
        options: Run options for every item (default: the service's defaults); an item's format overrides.
        progress: Receives ItemStarted / ItemFinished events.
        prices: The price table (`Settings.prices`) the items' costs are figured under; None: an empty one.

    Raises:
        BatchInputError: concurrency < 1, duplicate or unusable ids, or `out_dir` is not a folder.
    """
    if concurrency < 1:
        raise BatchInputError(f"concurrency must be at least 1, not {concurrency}")
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        raise BatchInputError("item ids must be unique: " + ", ".join(sorted({i for i in ids if ids.count(i) > 1})))
    for it in items:
        if not _ID_RE.fullmatch(it.id) or it.id.lower() in _RESERVED_IDS:
            raise BatchInputError(f"item id {it.id!r} cannot name a file")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BatchInputError(f"{out_dir}: exists and is not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    base = options or service.config.defaults
    emit = progress or (lambda _e: None)
    slots = asyncio.Semaphore(concurrency)
    total, finished = len(items), 0
    results: dict[str, ItemResult] = {}
    started = time.monotonic()

    def finish(result: ItemResult) -> None:
        nonlocal finished
        finished += 1
        results[result.id] = result
        emit(ItemFinished(result, finished, total))

    async def one(item: BatchItem) -> None:
        finish(await _process(service, item, out_dir, base, slots, emit, prices or {}))

    try:
        async with asyncio.TaskGroup() as group:  # an unexpected error cancels the other sessions (marked failed)
            for it in items:
                group.create_task(one(it))
    finally:  # also on Ctrl-C: the index then shows what is finished and what is pending
        md_path, json_path = write_index(out_dir, items)
    seconds = time.monotonic() - started
    ordered = tuple(results[i] for i in ids)
    done = sum(1 for r in ordered if r.status == "done")
    return BatchSummary(
        total=total, done=done, failed=sum(1 for r in ordered if r.status == "failed"),
        skipped=sum(1 for r in ordered if r.status == "skipped"), seconds=seconds,
        throughput_per_min=60.0 * done / seconds if done and seconds > 0 else 0.0, concurrency=concurrency,
        policy_version=service.policy.policy_version, items=ordered, out_dir=out_dir, index_md=md_path,
        index_json=json_path, usage=batch_usage([read_record(out_dir, it) for it in items]),
    )  # fmt: skip


async def _process(
    service: ResearchService, item: BatchItem, out_dir: Path, base: RunOptions, slots: asyncio.Semaphore,
    emit: BatchProgress, prices: PriceTable,
) -> ItemResult:
    record = read_record(out_dir, item)
    if record is not None and record["status"] == "done":
        return ItemResult(item.id, "skipped", "done", session_id=record.get("session_id"),
                          seconds=float(record.get("seconds") or 0.0))
    try:
        validate_question(item.question, service.config.max_question_chars)
    except InputError as exc:  # permanent: recorded once, skipped on reruns while the question is still refused
        if record is not None and record.get("error_kind") == "input" and record.get("error") == str(exc):
            return ItemResult(item.id, "skipped", "failed", str(exc), "input")
        return _fail(out_dir, item, "input", str(exc), None, 0.0)
    opts = base if item.format is None or item.format == base.format else base.model_copy(
        update={"format": item.format})
    async with slots:
        emit(ItemStarted(item.id, item.question))
        t0 = time.monotonic()
        try:
            outcome = await service.run(item.question, opts, source="batch")
        except InputError as exc:
            return _fail(out_dir, item, "input", str(exc), None, time.monotonic() - t0)
        except RunFailedError as exc:  # the failed session spent tokens too
            return _fail(out_dir, item, "run", str(exc), exc.session_id, time.monotonic() - t0,
                         _usage_of(service, exc.session_id, prices))
        except Exception as exc:  # noqa: BLE001 - a store or policy error before the session existed: this item only
            return _fail(out_dir, item, "run", f"{type(exc).__name__}: {exc}", None, time.monotonic() - t0)
    usage = _usage_of(service, outcome.session_id, prices)
    try:
        _write_done(out_dir, item, outcome, opts, usage)
    except OSError as exc:
        return _fail(out_dir, item, "run", f"could not write the report: {exc}", outcome.session_id, outcome.seconds,
                     usage)
    return ItemResult(item.id, "done", "done", session_id=outcome.session_id, seconds=outcome.seconds)


def _fail(out_dir: Path, item: BatchItem, kind: ErrorKind, error: str, sid: str | None, seconds: float,
          usage: dict[str, Any] | None = None) -> ItemResult:
    try:
        _write_failure(out_dir, item, kind, error, sid, seconds, usage)
    except OSError as exc:  # the failure is still reported in this run's summary
        error = f"{error} (and its record could not be written: {exc})"
    return ItemResult(item.id, "failed", "failed", error, kind, sid, seconds)
