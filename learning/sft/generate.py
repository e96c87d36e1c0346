"""`rubricem sft generate`: teacher trajectories for a questions file, resumable, with a report per outcome.

One JSONL line per (question, variant) in `DIR/trajectories.jsonl`: `{"key", "question_id", "variant", "outcome",
"teacher", "example"?, "message"?}`. `outcome` is `kept` (the line carries the three-message ChatML example) or a
rejection reason (the line carries only the reason and a short message; rejected trajectories are never written as
training data). A rerun skips every key already in the file, so an interrupted run resumes without duplicates; a
last line cut by a crash is dropped and redone. `DIR/report.json` counts outcomes per reason and per teacher.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.protocols import SearchTool
from learning.sft.questions import FORMATS, SFTQuestion
from learning.sft.trajectory import TEACHER_ERROR, TOO_LONG, Segment, Trajectory, postprocess, rejection_reason, to_example

TRAJECTORIES = "trajectories.jsonl"
REPORT = "report.json"
KEPT = "kept"
# Formats drawn for questions without a fixed one: short answers dominate the bundled questions' use.
FORMAT_DRAW = ("short_form", "exact_answer", "short_form", "long_form")


class Teacher(Protocol):
    """Writes one trajectory (the rules decide whether it is kept)."""

    name: str

    async def write(self, q: SFTQuestion, fmt: str, max_tool_calls: int | None, seed: int) -> Trajectory:
        """One trajectory; raise an exception with a `reason` attribute to reject it outright."""
        ...


CountTokens = Callable[[Sequence[Mapping[str, str]]], int]


@dataclass
class GenerationReport:
    """What one `generate` call did, and the totals of the whole folder."""

    written: int = 0
    skipped_done: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # over the whole folder
    by_teacher: dict[str, Counter[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"written_this_run": self.written, "skipped_done": self.skipped_done,
                "outcomes": dict(self.outcomes), "kept": self.outcomes.get(KEPT, 0),
                "by_teacher": {t: dict(c) for t, c in self.by_teacher.items()}}


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The complete records of a trajectories file; a cut last line (a crash mid-write) is removed from the file."""
    if not path.is_file():
        return []
    raw = path.read_text(encoding="utf-8")
    lines = raw.split("\n")
    records: list[dict[str, Any]] = []
    good = 0
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
            good = sum(len(x.encode("utf-8")) + 1 for x in lines[: n + 1])  # bytes, for truncate()
        except json.JSONDecodeError:
            if n < len(lines) - 2 or raw.endswith("\n"):  # damage before the last line is not a crash: refuse
                raise ValueError(f"{path}, line {n + 1}: not valid JSON; the file was edited or damaged") from None
            with open(path, "r+b") as fh:
                fh.truncate(good)
    return records


def kept_examples(path: Path) -> Iterator[dict[str, Any]]:
    """The training examples of a trajectories file (or of `DIR/trajectories.jsonl`)."""
    path = Path(path)
    if path.is_dir():
        path = path / TRAJECTORIES
    for rec in read_lines(path):
        if rec.get("outcome") == KEPT and rec.get("example"):
            yield rec["example"]


def _plan(questions: Sequence[SFTQuestion], variants: int, seed: int) -> list[tuple[str, SFTQuestion, int, str]]:
    jobs = []
    for q in questions:
        for v in range(variants):
            fmt = q.format or random.Random(f"{seed}/{q.id}/{v}/format").choice(FORMAT_DRAW)
            jobs.append((f"{q.id}#{v}", q, seed * 1000 + v, fmt))
    return jobs


async def generate(
    questions: Sequence[SFTQuestion],
    out_dir: Path,
    teacher: Teacher,
    tools: Mapping[str, SearchTool],
    *,
    variants: int = 1,
    seed: int = 0,
    max_tool_calls: int | None = None,
    concurrency: int = 1,
    count_tokens: CountTokens | None = None,
    context_tokens: int = 8192,
    progress: Callable[[str, str], None] = lambda _key, _outcome: None,
) -> GenerationReport:
    """Write one line per (question, variant) not yet done; see the module docstring.

    Args:
        count_tokens: tokens of a rendered conversation (the student's chat template); longer than
            `context_tokens` is rejected as `too_long`, never truncated.
        progress: called with (key, outcome) after each line is written.
    """
    # Imported here: the graph (LangGraph, the nodes, the report) is only needed to generate, not to read the data.
    from agent.run import scaffold_messages

    if variants < 1 or concurrency < 1:
        raise ValueError("variants and concurrency must be at least 1")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TRAJECTORIES
    existing = list(read_lines(path))
    others = sorted({str(r.get("teacher")) for r in existing} - {teacher.name})
    if others:  # a resumed folder must not mix teachers (e.g. an older version of the evidence-chain teacher)
        raise ValueError(f"{out_dir} holds trajectories written by {', '.join(others)}, not {teacher.name}: "
                         "write to a new --out folder (or remove this one)")
    done = {r["key"] for r in existing}
    jobs = _plan(questions, variants, seed)
    todo = [j for j in jobs if j[0] not in done]
    report = GenerationReport(skipped_done=len(jobs) - len(todo))
    lock, gate = asyncio.Lock(), asyncio.Semaphore(concurrency)
    offered = sorted(tools)

    async def one(key: str, q: SFTQuestion, job_seed: int, fmt: str) -> None:
        async with gate:
            line = await _one(key, q, job_seed, fmt)
        async with lock:  # one writer: every line is whole and flushed before the next
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            report.written += 1
            progress(key, line["outcome"])

    async def _one(key: str, q: SFTQuestion, job_seed: int, fmt: str) -> dict[str, Any]:
        base = {"key": key, "question_id": q.id, "variant": int(key.rsplit("#", 1)[1]), "teacher": teacher.name,
                "format": fmt}
        try:
            traj = await teacher.write(q, fmt, max_tool_calls, job_seed)
        except Exception as exc:  # noqa: BLE001 - a teacher failure is a counted rejection, never a crash
            reason = getattr(exc, "reason", TEACHER_ERROR)
            return {**base, "outcome": reason, "message": f"{type(exc).__name__}: {exc}"[:500]}
        traj.segments = [Segment(s.kind, postprocess(s.text, offered)) if s.kind == "model" else s
                         for s in traj.segments]
        reason = rejection_reason(traj, offered)
        if reason is not None:
            return {**base, "outcome": reason}
        messages = scaffold_messages(q.question, tools, traj.max_tool_calls, fmt)  # type: ignore[arg-type]
        example = to_example(traj, messages)
        if count_tokens is not None:
            example["tokens"] = count_tokens(example["messages"])
            if example["tokens"] > context_tokens:
                return {**base, "outcome": TOO_LONG, "message": f"{example['tokens']} tokens > {context_tokens}"}
        return {**base, "outcome": KEPT, "example": example}

    await asyncio.gather(*(one(*j) for j in todo))
    for rec in read_lines(path):
        report.outcomes[rec["outcome"]] += 1
        report.by_teacher.setdefault(rec.get("teacher", "?"), Counter())[rec["outcome"]] += 1
    (out_dir / REPORT).write_text(json.dumps(report.as_dict(), indent=2), encoding="utf-8")
    return report


__all__ = ["FORMATS", "GenerationReport", "Teacher", "generate", "kept_examples", "read_lines"]
