"""The reflection writer (inference side of the meta-policy, METHOD §6): sample m reflections on a judged session,
score them, store them all for the trainer, and put the best valid one into the rubric bank if it clears a threshold.

Decisions taken here (METHOD open points 16 and 18):
- Safety: only a completed session with an "ok" judgement is reflected on; anything else is refused with
  `NotReflectable` before anything is sampled or written (the store enforces the same rule on its side). So is a
  session whose question is held out (issue 62), with the held-out id named; the bank refuses such items too.
- Prompt: system = `learning/prompts/reflection.md`; user = the question and the trajectory as `render_trajectory`
  shows it to the judges (stage headers, every turn's text, no judge scores; METHOD §6.2). Tool outputs ARE shown,
  each cut in its middle to TOOL_OUTPUT_CHARS (600) characters: the reflection must be able to see what the searches
  returned to diagnose research quality and grounding, but their bulk would crowd out the plan and the answer. The
  whole is cut to `trajectory_chars` (default 8000, about 2-3k tokens) by the water-filling of `render_trajectory`,
  so a long Research stage cannot push out the Answer. Bank items that were injected into the session's prompt are
  not shown (the paper's r(·|q, τ, ℳ) leaves it open; the reflection should judge the attempt, not the memory).
- Closing tag: sampling stops at `</reflection_takeaways>`. vLLM and the in-process client keep the sampled tag in
  the text; the llama.cpp server drops it. Each candidate's text, ids and logprobs are stored exactly as sampled; when
  the generation stopped on that tag and the tag is not at the end of the text, the tag is recorded as the
  candidate's `forced_suffix` (never sampled, never trained). Validation, judging and the bank all see
  text + forced_suffix. A candidate cut by max_tokens gets no suffix, so it is invalid.
- Acceptance: the best valid candidate with a score (highest u, lowest index on ties) is written to the bank when
  u >= `threshold` (default DEFAULT_THRESHOLD = 0.5, i.e. at least middling on D8's scale: it keeps generic or
  off-target reflections out of the bank while most grounded ones pass). Invalid or unscored candidates never are.
- Failures: a policy failure stores nothing and raises. A judge failure still stores the batch (scores None, the
  judge's error on each valid candidate) and banks nothing. A bank failure leaves the batch stored and says why in
  the outcome.
- Deletion wins (issue 46): the batch cannot be stored once the session is deleted (the store refuses it), and after
  the bank write the session is looked up again: if a deletion committed in between, the item is taken out of the
  bank at once (outcome "session_deleted"); a deletion committing later finds the item by its session id itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from agent.prompts import PromptFolder
from agent.protocols import ChatMessage, Generation, PolicyClient
from learning.errors import LearningError
from learning.eval.heldout import heldout_guard
from learning.judge.buffer import BufferPayloadError, load_buffer
from learning.judge.llm import TOOL_OUTPUT_CHARS, render_trajectory
from learning.judge.offline_reflection import block_body
from learning.judge.reflection import BLOCKS, validity_error
from learning.judge.types import Judgement, ReflectionScore, Rubric
from store.errors import SessionNotFound, StoreError
from store.heldout import HeldoutGuard
from store.records import BankItem, PromptRecord, SessionRecord, Trajectory
from store.rubric_bank import RubricBank
from store.session_log import ReflectionCandidate, SessionLog

TEMPLATE = "reflection"
CLOSE_TAG = f"</{BLOCKS[1]}>"
DEFAULT_CANDIDATES = 8  # m (METHOD §6.1)
DEFAULT_TEMPERATURE = 0.7  # METHOD §6.2
DEFAULT_THRESHOLD = 0.5
DEFAULT_MAX_TOKENS = 768  # two short blocks of 1-4 lessons and four rubric lines fit in ~300-500 tokens
DEFAULT_TRAJECTORY_CHARS = 8000
MIN_TRAJECTORY_CHARS = 500
SUFFIX_SLACK = 8  # a sampled token may run a few characters past the stop string (agent/sequence.py does the same)

USER_LAYOUT = (
    "## Question\n\n{question}\n\n"
    "## The attempt (the agent's whole response, stage by stage; tool outputs shortened)\n\n{trajectory}\n\n"
    "Write your post-mortem of this attempt now, as exactly the two blocks."
)

_PROMPTS = PromptFolder("learning.prompts")
_log = logging.getLogger(__name__)

OutcomeReason = Literal[
    "accepted", "below_threshold", "no_valid_candidate", "judge_failed", "bank_write_failed", "bank_kept_newer",
    "session_deleted",
]
Progress = Callable[[str], None]


class ReflectionError(LearningError):
    """The reflection writer could not run."""


class NotReflectable(ReflectionError):
    """The session may not be reflected on (not completed, not judged, or its judgement is unreadable)."""

    def __init__(self, session_id: str, why: str) -> None:
        """Remember the session and the reason."""
        super().__init__(f"session {session_id!r} cannot be reflected on: {why}")
        self.session_id = session_id
        self.why = why


class InvalidReflectionArgs(ReflectionError, ValueError):
    """An argument of `write_reflection` is out of range (nothing was sampled or written)."""


class ReflectionJudgeLike(Protocol):
    """What the writer needs of a reflection judge (`ReflectionJudge` or `OfflineReflectionJudge`)."""

    @property
    def model(self) -> str:
        """The judge id recorded with the scores."""
        ...

    async def score(
        self,
        question: str,
        trajectory: Trajectory,
        judgement: Judgement,
        rubrics: Sequence[Rubric],
        candidates: Sequence[str],
    ) -> list[ReflectionScore]:
        """One score per candidate, in order."""
        ...


@dataclass(frozen=True, slots=True)
class ReflectionOutcome:
    """What one `write_reflection` did."""

    batch_id: str
    session_id: str
    candidates: int  # sampled and stored
    valid: int  # in the two-block format
    scored: int  # valid and given a score u by the judge
    best: int | None  # index of the best valid scored candidate
    best_score: float | None
    accepted: str | None  # the bank item id written, or None
    reason: OutcomeReason
    detail: str = ""


def reflection_prompt_sha() -> str:
    """A short hash of the reflection prompt (system template + user layout), recorded with every candidate."""
    return _PROMPTS.sha((TEMPLATE,), salt=USER_LAYOUT)


def reflection_messages(question: str, trajectory: Trajectory, trajectory_chars: int) -> list[ChatMessage]:
    """The reflection prompt: system instructions, then the question and the trajectory without judge scores."""
    shown = render_trajectory(trajectory, trajectory_chars, tool_output_chars=TOOL_OUTPUT_CHARS)
    user = USER_LAYOUT.replace("{trajectory}", shown).replace("{question}", question.strip(), 1)
    # `{question}` is replaced last and once, so braces inside the trajectory text are never treated as a field.
    return [ChatMessage("system", _PROMPTS.template(TEMPLATE)), ChatMessage("user", user)]


def forced_suffix(gen: Generation) -> str:
    """The closing tag to append when the generation stopped on it but the server dropped it, else ""."""
    tail = gen.text[-(len(CLOSE_TAG) + SUFFIX_SLACK) :]
    return CLOSE_TAG if gen.finish_reason == "stop" and gen.stop == CLOSE_TAG and CLOSE_TAG not in tail else ""


def _check_args(candidates: int, temperature: float, threshold: float, max_tokens: int, trajectory_chars: int,
                seed: int | None) -> None:  # fmt: skip
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    problems = []
    if not is_int(candidates) or candidates < 1:
        problems.append(f"candidates must be an int >= 1, got {candidates!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 10:
        problems.append(f"temperature must be a number in [0, 10], got {temperature!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
        problems.append(f"threshold must be a number in [0, 1], got {threshold!r}")
    if not is_int(max_tokens) or max_tokens < 1:
        problems.append(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    if not is_int(trajectory_chars) or trajectory_chars < MIN_TRAJECTORY_CHARS:
        problems.append(f"trajectory_chars must be an int >= {MIN_TRAJECTORY_CHARS}, got {trajectory_chars!r}")
    if seed is not None and not is_int(seed):
        problems.append(f"seed must be an int or None, got {seed!r}")
    if problems:
        raise InvalidReflectionArgs("; ".join(problems))


def _judgement_and_rubrics(log: SessionLog, rec: SessionRecord) -> tuple[Judgement, tuple[Rubric, ...]]:
    """The latest ok judgement and the question's rubrics; NotReflectable when the session does not qualify."""
    sid = rec.session_id
    if rec.status != "completed":
        raise NotReflectable(sid, f"it is {rec.status!r}; only completed sessions are reflected on")
    ok = [j for j in log.judgements(sid) if j.status == "ok"]
    if not ok:
        raise NotReflectable(sid, "it has no ok judgement yet")
    try:
        judgement = Judgement.model_validate(ok[-1].payload)
    except ValidationError as exc:
        raise NotReflectable(sid, f"its latest judgement payload is not a Judgement: {exc}") from exc
    try:
        rubrics = load_buffer(log, rec.question).all_rubrics()
    except BufferPayloadError as exc:
        raise NotReflectable(sid, f"the question's rubric buffer is unreadable: {exc}") from exc
    return judgement, rubrics


async def _sample(policy: PolicyClient, messages: list[ChatMessage], m: int, max_tokens: int, temperature: float,
                  seed: int | None) -> tuple[PromptRecord, list[Generation]]:  # fmt: skip
    context = await policy.render_prompt(messages)
    seeds = [None if seed is None else seed + i for i in range(m)]
    group = getattr(policy, "generate_group", None)
    if callable(group):  # the embedded client decodes the m rows of one prompt together (one forward per step)
        gens = await group(context, m, stop=[CLOSE_TAG], max_tokens=max_tokens, temperature=temperature, seeds=seeds)
        return PromptRecord(context.text, tuple(context.token_ids), reflection_prompt_sha()), list(gens)
    # All m requests go out at once (a server batches them, like vLLM's n=8).
    results = await asyncio.gather(
        *(policy.generate(context, stop=[CLOSE_TAG], max_tokens=max_tokens, temperature=temperature, seed=s)
          for s in seeds),
        return_exceptions=True,
    )  # fmt: skip
    for r in results:
        if isinstance(r, BaseException):
            raise r  # nothing is stored for a batch the policy could not finish
    gens = [r for r in results if isinstance(r, Generation)]
    return PromptRecord(context.text, tuple(context.token_ids), reflection_prompt_sha()), gens


def _unit(value: float | None) -> bool:
    return value is not None and 0.0 <= value <= 1.0


async def _judge(judge: ReflectionJudgeLike, rec: SessionRecord, judgement: Judgement, rubrics: Sequence[Rubric],
                 texts: list[str]) -> tuple[list[ReflectionScore | None], str | None]:  # fmt: skip
    """Per-candidate scores (None where unusable) and the judge's error, if the whole call failed."""
    try:
        scores = await judge.score(rec.question, rec.trajectory, judgement, rubrics, texts)
    except Exception as exc:  # noqa: BLE001 - any judge failure (endpoint down, bad answer, no model) is recorded
        return [None] * len(texts), f"{type(exc).__name__}: {exc}"
    if len(scores) != len(texts) or [s.candidate for s in scores] != list(range(len(texts))):
        got = [s.candidate for s in scores]
        return [None] * len(texts), f"the judge's scores name candidates {got}, expected 0..{len(texts) - 1} in order"
    return list(scores), None


def _candidate(
    index: int, gen: Generation, suffix: str, seed: int | None, score: ReflectionScore | None, judge_error: str | None
) -> ReflectionCandidate:
    full = gen.text + suffix
    invalid = validity_error(full)
    base: dict[str, Any] = {
        "index": index, "text": gen.text, "token_ids": tuple(gen.token_ids), "logprobs": tuple(gen.logprobs),
        "policy_version": gen.policy_version, "finish_reason": gen.finish_reason, "token_source": gen.token_source,
        "forced_suffix": suffix, "seed": seed,
    }  # fmt: skip
    if invalid is not None:  # our own check decides validity; an invalid candidate never carries scores
        return ReflectionCandidate(**base, valid=False, validity_error=invalid)
    if score is None or not score.valid or score.u is None:
        why = judge_error or (score.error if score is not None and score.error else "the judge did not score it")
        return ReflectionCandidate(**base, valid=True, judge_error=why)
    values = (score.diagnostic_accuracy, score.specificity, score.scope_balance, score.u_within, score.u_cross, score.u)
    if not all(_unit(v) for v in values):
        return ReflectionCandidate(**base, valid=True, judge_error=f"the judge's scores are out of range: {values}")
    return ReflectionCandidate(
        **base, valid=True, diagnostic_accuracy=score.diagnostic_accuracy, specificity=score.specificity,
        scope_balance=score.scope_balance, u_within=score.u_within, u_cross=score.u_cross, u=score.u,
        justification=score.justification, judge_error=score.error,
    )  # fmt: skip


def _best(candidates: Sequence[ReflectionCandidate]) -> ReflectionCandidate | None:
    scored = [c for c in candidates if c.valid and c.u is not None]
    return max(scored, key=lambda c: (c.u, -c.index)) if scored else None


async def write_reflection(
    session_id: str,
    *,
    log: SessionLog,
    policy: PolicyClient,
    judge: ReflectionJudgeLike,
    bank: RubricBank,
    candidates: int = DEFAULT_CANDIDATES,
    temperature: float = DEFAULT_TEMPERATURE,
    threshold: float = DEFAULT_THRESHOLD,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    trajectory_chars: int = DEFAULT_TRAJECTORY_CHARS,
    seed: int | None = None,
    heldout: HeldoutGuard | None = None,
) -> ReflectionOutcome:
    """Reflect on one judged, completed session (module docstring for every decision).

    Args:
        session_id: The session.
        log: The session log (read the session and its judgement; store the batch).
        policy: The same policy that ran the session (METHOD §6.1: one backbone, another prompt).
        judge: The reflection judge (LLM or offline).
        bank: Where an accepted reflection goes.
        candidates: m, the number of candidates sampled.
        temperature: Sampling temperature.
        threshold: The minimum u for the best valid candidate to enter the bank.
        max_tokens: Token cap of each candidate.
        trajectory_chars: The trajectory is cut to this many characters in the prompt.
        seed: Candidate i is sampled with seed + i (None: unseeded).
        heldout: The held-out guard (default: the shipped held-out questions, `learning.eval.heldout`).

    Returns:
        The outcome; `reason` says whether the best candidate was banked and, if not, why.

    Raises:
        InvalidReflectionArgs: An argument is out of range (nothing sampled or written).
        SessionNotFound: Unknown session.
        NotReflectable: The session is not completed, not judged, its judgement/buffer is unreadable, or its question
            is a held-out one (issue 62; the message names its id).
        PolicyError: Sampling failed (nothing written).
        StoreError: The batch could not be stored (nothing written).
    """
    _check_args(candidates, temperature, threshold, max_tokens, trajectory_chars, seed)
    rec = await asyncio.to_thread(log.get, session_id)
    found = (heldout if heldout is not None else heldout_guard()).question_id(rec.question)
    if found is not None:  # before anything is sampled: no reflection, stored or banked, of a held-out question
        raise NotReflectable(session_id, f"its question is held-out question {found}; held-out questions are for "
                                         "evaluation only and nothing derived from them may enter the rubric bank")
    judgement, rubrics = await asyncio.to_thread(_judgement_and_rubrics, log, rec)
    messages = reflection_messages(rec.question, rec.trajectory, trajectory_chars)
    prompt, gens = await _sample(policy, messages, candidates, max_tokens, float(temperature), seed)
    suffixes = [forced_suffix(g) for g in gens]
    scores, judge_error = await _judge(judge, rec, judgement, rubrics, [g.text + s for g, s in zip(gens, suffixes,
                                                                                                    strict=True)])
    batch = [
        _candidate(i, g, s, None if seed is None else seed + i, sc, judge_error)
        for i, (g, s, sc) in enumerate(zip(gens, suffixes, scores, strict=True))
    ]
    batch_id = await asyncio.to_thread(
        log.record_reflection_batch, session_id, batch, prompt=prompt, judge_model=judge.model,
        temperature=float(temperature), max_tokens=max_tokens,
    )  # fmt: skip
    n_valid = sum(c.valid for c in batch)
    n_scored = sum(c.valid and c.u is not None for c in batch)
    best = _best(batch)

    def outcome(reason: OutcomeReason, detail: str, accepted: str | None = None) -> ReflectionOutcome:
        return ReflectionOutcome(
            batch_id=batch_id, session_id=session_id, candidates=len(batch), valid=n_valid, scored=n_scored,
            best=None if best is None else best.index, best_score=None if best is None else best.u,
            accepted=accepted, reason=reason, detail=detail,
        )  # fmt: skip

    if n_valid == 0:
        return outcome("no_valid_candidate", "no candidate had exactly the two required blocks")
    if best is None or best.u is None:
        return outcome("judge_failed", judge_error or "the judge scored no valid candidate")
    if best.u < threshold:
        return outcome("below_threshold", f"best u {best.u:.3f} < threshold {threshold:.3f}")
    item = BankItem.new(
        question=rec.question,
        rubrics=block_body(best.full_text, BLOCKS[0]),
        takeaways=block_body(best.full_text, BLOCKS[1]),
        score=best.u,
        judge_model=judge.model,
        policy_version=best.policy_version,
        session_id=session_id,
    )
    try:
        result = await asyncio.to_thread(bank.put, item)
    except Exception as exc:  # noqa: BLE001 - the bank is an external service; the stored batch stays either way
        return outcome("bank_write_failed", f"{type(exc).__name__}: {exc}")
    if not result.stored:
        return outcome("bank_kept_newer", result.reason or "the bank kept a newer item for this question")
    detail = f"u {best.u:.3f} >= threshold {threshold:.3f}" + (
        f"; replaced {', '.join(result.replaced)}" if result.replaced else "")
    try:
        await asyncio.to_thread(log.mark_reflection_accepted, batch_id, best.index, item.id)
    except StoreError as exc:  # the item is in the bank; only the log's link to it is missing
        detail += f"; the log could not mark it accepted: {type(exc).__name__}: {exc}"
    if await asyncio.to_thread(_deleted, log, session_id):
        return outcome("session_deleted", await asyncio.to_thread(_withdraw, bank, session_id, item.id))
    return outcome("accepted", detail, accepted=item.id)


def _deleted(log: SessionLog, session_id: str) -> bool:
    """Whether the session is gone (a deletion committed since the batch was stored). Asked after the bank write:
    a deletion committing after this answer runs its bank part after the write, and removes the item itself."""
    try:
        log.get(session_id)
    except SessionNotFound:
        return True
    return False


def _withdraw(bank: RubricBank, session_id: str, item_id: str) -> str:
    """Take back an item written for a session deleted meanwhile (deletion wins, issue 46); says what happened."""
    try:
        bank.delete_derived([session_id], [item_id])
    except Exception as exc:  # noqa: BLE001 - the bank is an external service; say so rather than raise
        _log.error("reflection %s of deleted session %s could not be removed from the bank: %s: %s", item_id,
                   session_id, type(exc).__name__, exc)
        return f"the session was deleted meanwhile, and its item {item_id} could not be removed from the bank " \
               f"({type(exc).__name__}); `rubricem bank delete {item_id}` removes it"
    return "the session was deleted meanwhile; its item was taken out of the bank again"


_WRITE_OPTIONS = frozenset({"candidates", "temperature", "threshold", "max_tokens", "trajectory_chars", "seed",
                            "heldout"})


@dataclass
class ReflectSummary:
    """What one `reflect_pending` call did."""

    sessions: int = 0
    accepted: int = 0
    stored: int = 0  # batches written (accepted or not)
    refused: int = 0  # not reflectable (NotReflectable)
    failed: int = 0  # sampling or storing failed; nothing written for that session
    reasons: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, ReflectionOutcome] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


async def reflect_pending(
    log: SessionLog,
    policy: PolicyClient,
    judge: ReflectionJudgeLike,
    bank: RubricBank,
    *,
    limit: int | None = None,
    progress: Progress | None = None,
    **kw: Any,
) -> ReflectSummary:
    """Reflect on every judged, completed session without a reflection batch yet (oldest first).

    One session's failure is recorded in the summary and the batch goes on.

    Args:
        log, policy, judge, bank: As for `write_reflection`.
        limit: At most this many sessions (None: all).
        progress: Called with one line per session.
        **kw: Passed to `write_reflection` (candidates, temperature, threshold, max_tokens, trajectory_chars, seed).

    Raises:
        InvalidReflectionArgs: A keyword argument is unknown or out of range (checked before any session is touched).
    """
    say = progress or (lambda _m: None)
    unknown = set(kw) - _WRITE_OPTIONS
    if unknown:
        raise InvalidReflectionArgs(f"unknown option(s) {sorted(unknown)}; known: {sorted(_WRITE_OPTIONS)}")
    _check_args(kw.get("candidates", DEFAULT_CANDIDATES), kw.get("temperature", DEFAULT_TEMPERATURE),
                kw.get("threshold", DEFAULT_THRESHOLD), kw.get("max_tokens", DEFAULT_MAX_TOKENS),
                kw.get("trajectory_chars", DEFAULT_TRAJECTORY_CHARS), kw.get("seed"))  # fmt: skip
    summary = ReflectSummary()
    for sid in await asyncio.to_thread(log.sessions_without_reflection, limit):
        summary.sessions += 1
        try:
            out = await write_reflection(sid, log=log, policy=policy, judge=judge, bank=bank, **kw)
        except NotReflectable as exc:
            summary.refused += 1
            summary.errors.append(str(exc))
            say(f"{sid}: refused ({exc.why})")
            continue
        except Exception as exc:  # noqa: BLE001 - one session failing (policy down, store busy) must not stop the rest
            summary.failed += 1
            summary.errors.append(f"{sid}: {type(exc).__name__}: {exc}")
            say(f"{sid}: failed ({type(exc).__name__}: {exc})")
            continue
        summary.stored += 1
        summary.accepted += out.reason == "accepted"
        summary.reasons[out.reason] = summary.reasons.get(out.reason, 0) + 1
        summary.outcomes[sid] = out
        best = "-" if out.best_score is None else f"{out.best_score:.2f}"
        say(f"{sid}: {out.valid}/{out.candidates} valid, best u {best}: {out.reason}")
    return summary
