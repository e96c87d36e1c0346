"""The promotion gate: a candidate adapter against the live version on a fixed probe set, scored by a held-out judge
configuration (not the training judge's rubric buffers, optionally another judge model), so a policy that learned to
please the training judge does not pass by that alone.

Both versions answer the same probe questions with the same seeds; the report holds per-stage means and the total
(mean of the four stage scores) for each, and the decision.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from learning.judge.types import TrajectoryJudge
from store.records import STAGES, Trajectory

Probe = Callable[[str, int], Awaitable[Trajectory]]
"""Research one probe question with a given seed on one policy version."""


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
    """Why an adapter folder cannot be served (missing files, non-finite weights), or None if it looks sound."""
    from safetensors.torch import load_file

    weights = Path(path) / "adapter_model.safetensors"
    if not (Path(path) / "adapter_config.json").is_file() or not weights.is_file():
        return f"{path} lacks adapter_config.json or adapter_model.safetensors"
    try:
        tensors = load_file(str(weights))
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a rejection reason, not a crash
        return f"the adapter weights cannot be read: {type(exc).__name__}: {exc}"
    bad = [name for name, t in tensors.items() if not bool(t.float().isfinite().all())]
    if bad:
        return f"non-finite adapter weights in {len(bad)} tensor(s), e.g. {bad[0]}"
    return None


async def score_version(version: str, probe: Probe, judge: TrajectoryJudge, questions: Sequence[str],
                        samples: int, seed: int) -> VersionScore:
    """Run every probe question `samples` times and judge each question's runs as one group."""
    per_stage: dict[str, list[float]] = {s: [] for s in STAGES}
    totals: list[float] = []
    failed = 0
    for qi, question in enumerate(questions):
        trajs: list[Trajectory] = []
        for k in range(samples):
            try:
                trajs.append(await probe(question, seed + 1000 * qi + k))
            except Exception:  # noqa: BLE001 - a failed probe run counts against the version, it does not stop the gate
                failed += 1
        if not trajs:
            continue
        for j in await judge.judge_group(question, trajs):
            scores = j.stage_scores()
            answer = scores.get("answer")
            values = [v if v is not None else (answer if answer is not None else 0.0) for v in scores.values()]
            for s, v in zip(STAGES, values, strict=True):
                per_stage[s].append(float(v))
            totals.append(sum(values) / len(values))
    runs = len(totals) + failed
    total = (sum(totals) / runs) if runs else 0.0  # a failed run scores 0
    stages = {s: round(sum(v) / len(v), 4) if v else 0.0 for s, v in per_stage.items()}
    return VersionScore(version, stages, round(total, 4), runs, failed)


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
