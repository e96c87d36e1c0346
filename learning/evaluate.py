"""The promotion gate: a candidate adapter against the live version on a fixed probe set, scored by a held-out judge
configuration (not the training judge's rubric buffers, optionally another judge model), so a policy that learned to
please the training judge does not pass by that alone.

Both versions answer the same probe questions with the same seeds; the report holds per-stage means and the total
(mean of the four stage scores) for each, and the decision.

A rejection's reason is stored with the version and the cycle, and the Learning page shows it (issue 65, finding 13).
The gate's own sentences hold numbers only (`is_gate_reason` tells them apart). A candidate rejected before the gate
(`adapter_problem`) has a reason that names server paths and exception text: it begins with one fixed sentence and a
short error reference, logged here with the whole reason, so a person who is not an admin is shown the sentence and
the reference alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from learning.judge.types import TrajectoryJudge
from store.records import STAGES, Trajectory
from store.teams import TEAM_NAME_PATTERN

Probe = Callable[[str, int], Awaitable[Trajectory]]
"""Research one probe question with a given seed on one policy version."""

_log = logging.getLogger(__name__)

ADAPTER_REJECTED = "The candidate adapter could not be served"
"""The fixed start of a reason from `adapter_problem`; what follows it is for the operator."""
_REFERENCE = re.compile(r"\(error reference ([0-9a-f]{8})\)")


@dataclass(frozen=True, slots=True)
class VersionScore:
    """Mean probe scores of one version."""

    version: str
    stages: dict[str, float]
    total: float
    runs: int
    failed_runs: int


@dataclass(frozen=True, slots=True)
class GateReport:
    """The gate's evidence and decision."""

    candidate: VersionScore
    live: VersionScore
    tolerance: float
    promote: bool
    reason: str
    judge: str
    general: GateReport | None = None  # a team cycle's second gate, on the global probe set (`team_gate`)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (stored with the version)."""
        return asdict(self)


def adapter_problem(path: Path) -> str | None:
    """Why an adapter folder cannot be served, or None if it looks sound.

    The reason is `ADAPTER_REJECTED`, an error reference, then the detail (missing files, unreadable or non-finite
    weights), which names the folder and the exception. The whole reason is logged under the reference, so the one
    a non-admin is shown (`rejection_reference`) leads the operator to it.
    """
    detail = _adapter_detail(Path(path))
    if detail is None:
        return None
    ref = secrets.token_hex(4)
    _log.error("candidate adapter rejected [error %s]: %s", ref, detail)
    return f"{ADAPTER_REJECTED} (error reference {ref}): {detail}"


def _adapter_detail(path: Path) -> str | None:
    """What is wrong with the adapter folder `path`, in the operator's words (paths, exception text)."""
    from safetensors.torch import load_file

    weights = path / "adapter_model.safetensors"
    if not (path / "adapter_config.json").is_file() or not weights.is_file():
        return f"{path} lacks adapter_config.json or adapter_model.safetensors"
    try:
        tensors = load_file(str(weights))
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a rejection reason, not a crash
        return f"the adapter weights cannot be read: {type(exc).__name__}: {exc}"
    bad = [name for name, t in tensors.items() if not bool(t.float().isfinite().all())]
    if bad:
        return f"non-finite adapter weights in {len(bad)} tensor(s), e.g. {bad[0]}"
    return None


def rejection_reference(reason: str) -> str | None:
    """The error reference an `adapter_problem` reason carries (None: it has none, e.g. stored before issue 65)."""
    found = _REFERENCE.search(reason)
    return found.group(1) if found else None


_NUMBER = r"-?(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)"
_DECISION = (rf"the candidate's probe score is not finite|\d+ failed probe runs against live's \d+|"
             rf"probe score {_NUMBER} (?:<|>=) live {_NUMBER} - tolerance {_NUMBER}")
_GATE_REASON = re.compile(rf"(?:{_DECISION})|team questions: (?:{_DECISION}); general questions: (?:{_DECISION})")


def is_gate_reason(reason: str) -> bool:
    """Whether `reason` is one of the gate's own sentences (`decide`, `team_gate`): numbers and fixed words only,
    safe to show to anyone who may see the version. Anything else may name paths or exception text."""
    return _GATE_REASON.fullmatch(reason) is not None


# The team gate's refusal to gate a team candidate when no question of the team's own is left in its window (issue 65,
# finding 4). One template serves the writer (`learning.pipeline`) and the reader (`app.ui.view.rejection_text`, which
# shows it as it is because it holds fixed words and a team's name only), so a change of wording cannot leave the
# Learning page hiding the refusal behind the fixed "rejected" sentence, or passing something else as it is.
_NO_TEAM_QUESTIONS = ("team {team} has no question of its own left in the cycle's window to gate on (its sessions "
                      "were deleted or opted out of learning since training); a team's version is promoted only when "
                      "it does at least as well on the team's own questions")
_NO_TEAM_QUESTIONS_REASON = re.compile(
    TEAM_NAME_PATTERN.join(re.escape(part) for part in _NO_TEAM_QUESTIONS.split("{team}")))


def no_team_questions_reason(team: str) -> str:
    """The rejection reason of a team candidate with no question of the team's own left to be gated on."""
    return _NO_TEAM_QUESTIONS.format(team=team)


def is_no_team_questions_reason(reason: str) -> bool:
    """Whether `reason` is exactly `no_team_questions_reason` of a valid team name (`store.teams`): fixed words and
    the name, nothing a viewer must not see. Kept apart from `is_gate_reason`, which means the gate's numeric
    sentences."""
    return _NO_TEAM_QUESTIONS_REASON.fullmatch(reason) is not None


async def score_version(version: str, probe: Probe, judge: TrajectoryJudge, questions: Sequence[str],
                        samples: int, seed: int, *, concurrent: bool = False) -> VersionScore:
    """Run every probe question `samples` times and judge each question's runs as one group. `concurrent`: all the
    runs at once (a server that batches them, `RetrainParts.concurrent_probes`), else one after another; the same
    runs with the same seeds either way."""
    per_stage: dict[str, list[float]] = {s: [] for s in STAGES}
    totals: list[float] = []

    async def attempt(question: str, run_seed: int) -> Trajectory | None:
        try:
            return await probe(question, run_seed)
        except Exception:  # noqa: BLE001 - a failed probe run counts against the version, it does not stop the gate
            return None

    runs = [(qi, q, seed + 1000 * qi + k) for qi, q in enumerate(questions) for k in range(samples)]
    if concurrent:
        done = list(await asyncio.gather(*(attempt(q, s) for _, q, s in runs)))
    else:
        done = [await attempt(q, s) for _, q, s in runs]
    failed = sum(1 for t in done if t is None)
    for qi, question in enumerate(questions):
        trajs = [t for (i, _, _), t in zip(runs, done, strict=True) if i == qi and t is not None]
        if not trajs:
            continue
        for j in await judge.judge_group(question, trajs):
            scores = j.stage_scores()
            answer = scores.get("answer")
            values = [v if v is not None else (answer if answer is not None else 0.0) for v in scores.values()]
            for s, v in zip(STAGES, values, strict=True):
                per_stage[s].append(float(v))
            totals.append(sum(values) / len(values))
    n_runs = len(totals) + failed
    total = (sum(totals) / n_runs) if n_runs else 0.0  # a failed run scores 0
    stages = {s: round(sum(v) / len(v), 4) if v else 0.0 for s, v in per_stage.items()}
    return VersionScore(version, stages, round(total, 4), n_runs, failed)


def team_gate(own: GateReport, general: GateReport) -> GateReport:
    """A team candidate's decision (issue 49): it must pass on the team's own recent questions (`own`, against the
    version the team is served now) and must not get worse on the global probe set beyond the same tolerance
    (`general`). The report's scores are the team's; the general gate is kept inside it."""
    promote = own.promote and general.promote
    reason = f"team questions: {own.reason}; general questions: {general.reason}"
    return GateReport(own.candidate, own.live, own.tolerance, promote, reason, own.judge, general)


def decide(candidate: VersionScore, live: VersionScore, tolerance: float, judge: str) -> GateReport:
    """Promote when the candidate's total is at least live's minus the tolerance and it failed no more runs."""
    if not math.isfinite(candidate.total):
        return GateReport(candidate, live, tolerance, False, "the candidate's probe score is not finite", judge)
    if candidate.failed_runs > live.failed_runs:
        return GateReport(candidate, live, tolerance, False,
                          f"{candidate.failed_runs} failed probe runs against live's {live.failed_runs}", judge)
    if candidate.total + tolerance < live.total:
        return GateReport(candidate, live, tolerance, False,
                          f"probe score {candidate.total:.4f} < live {live.total:.4f} - tolerance {tolerance}", judge)
    return GateReport(candidate, live, tolerance, True,
                      f"probe score {candidate.total:.4f} >= live {live.total:.4f} - tolerance {tolerance}", judge)
