"""Benchmark (not a test): a blind calibration of the citation check (issue 64, item 3, "honest calibration").

The figures in docs/citations.md were taken on 75 claims one reader labelled while seeing the check's verdicts, with
the threshold tuned on the same claims, and without the passages re-attributed claims end up citing. This script
gathers new claims from new sessions, has them labelled blind, and reports the check's errors out of sample.

Steps (each a flag; they run in this order when combined):

1. `--sessions N`: the first N questions of the pool below, each researched once by the product's default policy,
   with the settings of tests/benchmarks/citation_support.py (SmolLM2-135M + the shipped SFT adapter on llama.cpp,
   stage caps 352/128/224/160, 2 tool calls, 3 snippets of 300 characters, temperature 0.8, the learning curve's
   sampling seed of sample 0; the service with `attribute_uncited` and `verify_citations` off, so each report is the
   model's own). N is a total, not an increment: a question already in `<out>/sessions.jsonl` is not run again, and
   each session is appended there as it finishes, so a killed run goes on where it stopped. Each row stores every
   cited claim as the check reads it after the fact (`verify_report`), with the support of every retrieved passage
   for it, every veto of each passage, the passages it cited, and the passage the check would re-attribute it to
   (the best-supported retrieved passage it did not cite and that no veto rules out).
2. `--export`: `<out>/to_label.jsonl`, one row per (claim, passage) pair a labeller must judge, with only a random
   opaque `pair_id`, the claim, the passage title and text (never the check's score, status or veto, whether the
   passage was cited or is a re-attribution candidate, or the session), shuffled with a fixed seed;
   `<out>/pairs_key.jsonl`, the private key; `<out>/LABELLING.md`, the labeller's instructions. A rerun keeps the
   pair ids already issued, so labels made before it still apply.
3. `--report`: Cohen's kappa between the first two labellers, a threshold chosen by k-fold cross-validation on a
   calibration half of the questions, and on the other half (out of sample) the false claims accepted and true
   claims dropped with 95 % Wilson intervals, and the share of cited sentences whose passage does not support them
   before and after the check, re-attributed claims included. `<out>/summary.json`, `<out>/summary.md`.
4. `--smoke`: 2 sessions into `--out` (which must not be the default folder), then the export.

    .venv/bin/python tests/benchmarks/citation_blind.py --sessions 160            # resumable; hours on 2 cores
    .venv/bin/python tests/benchmarks/citation_blind.py --export                  # then label (LABELLING.md)
    .venv/bin/python tests/benchmarks/citation_blind.py --report
    .venv/bin/python tests/benchmarks/citation_blind.py --smoke --out /tmp/blind-smoke

Blindness: a labeller gets the rows of `to_label.jsonl` and `LABELLING.md` only, handed over outside the repository,
and never opens this folder: `pairs_key.jsonl` and `sessions.jsonl` would tell which passage was cited and what the
check made of it. `sessions.jsonl` is committed as sessions accrue (a session's machine does not outlive it, and the
runs take hours); `pairs_key.jsonl` once the labels are in.

Which questions (`question_pool`): new held-out questions, none the project has trained or evaluated on.
- Excluded, by question text after `normalize_question` (NFKC, case folding, whitespace collapsed): the 40
  held-out questions (`load_heldout`: learning/sft/data/heldout), among them the 32 of docs/citations/sessions.jsonl
  (whose questions are excluded by text as well); the training split (learning/sft/data/train, the only question
  files SFT, the learning curve, the memory study and the training dose train on); and every corpus-paired HotpotQA
  and MuSiQue question of <data>/wiki_multihop_corpus (each is in the training split or the held-out set). The
  bundled training pool (`learning.questions.bundled_questions`) is made of fixed shapes around corpus titles and
  matches no dataset question.
- First tier: the 2WikiMultihopQA development sample (<data>/2wikimultihopqa/2wiki_500.jsonl, R1-Searcher's 500
  less the 100 withheld) whose gold answer occurs verbatim (case-sensitive) in the bundled 2WikiMultihopQA passages:
  the rule that chose the 8 held-out 2Wiki questions, so these are the same kind of question, answerable from the
  index the sessions search. 160 questions.
- Second tier, only when N is larger: the HotpotQA and MuSiQue development samples (<data>/hotpotqa/hotpotqa_500.jsonl,
  <data>/musique/musique_500.jsonl), not paired with the bundled corpus, whose gold answer occurs verbatim in some
  bundled passage and is not "yes" or "no" (those occur everywhere).
- Each tier is shuffled with `random.Random(SEED)`; the pool is tier one, then tier two. Ids are "<bench>:<idx>"
  (2WikiMultihopQA, the held-out file's scheme) and "<bench>-dev:<idx>".

Decisions where the issue is silent:
- Pairs. A claim's cited passages are always labelled. Its re-attribution candidate (one passage: the same at every
  threshold, which only decides whether it is used) is labelled when its support reaches the lowest threshold tried
  and, at some threshold tried, the cited passages fail; otherwise no threshold ever asks about it.
- Decisions. At a threshold t the check decides each cited passage (kept or dropped, by `agent.support.decide` over
  the stored supports and vetoes, so the vetoes and GROUP_MIN apply as in a report), and the candidate only when
  every cited passage failed (re-attributed or not). A false claim accepted is a decision to keep or re-attribute a
  pair the labeller says does not support; a true claim dropped is a decision to drop (or not re-attribute to) a
  pair the labeller says does. Pairs labelled "unclear" or not labelled are counted and left out of the rates.
  Passages that are neither cited nor the candidate are not labelled, so a drop the candidate hides is not seen.
- Labels. The figures use the first labeller's labels; the second labeller's are for agreement only. Labellers are
  ordered by how many pairs they labelled, then by name (`--labellers a,b` overrides). Kappa is on the pairs both
  labelled true or false; the counts with "unclear", and a kappa with "unclear" as a third category, are given too.
- Split. The questions with at least one claim are shuffled with `SEED` and cut in two; the first half (the smaller
  when odd) calibrates, the second evaluates. Folds are questions too, dealt round-robin after a shuffle.
- Threshold. Nothing is fitted for a given threshold, so k-fold cross-validation scores each threshold of `GRID` on
  each held-out fold of the calibration half by max(false-accept rate, false-drop rate), and averages over folds;
  the lowest average wins (a tie goes to the threshold nearest the shipped SUPPORT_MIN, then the lower). The mean of
  per-fold maxima rewards a threshold that balances the two errors on every fold, not only on the pool.
- "Cited sentences whose passage does not support them": over claims whose verdict is known both before and after,
  a claim is unsupported before when every passage it cited is labelled false, and after when the check still
  cites it (kept or re-attributed) and every passage it now cites is labelled false; a marked claim cites nothing.
- The shipped SUPPORT_MIN was chosen before this set existed, so its figures on every question are out of sample
  too; they are reported beside the cross-validated threshold's, which are on the evaluation half only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agent.support import SUPPORT_MIN, decide  # noqa: E402
from agent.vetoes import Veto  # noqa: E402
from learning.engines.files import json_lines  # noqa: E402

SEED = 64  # the number: every shuffle here (pool, pair order, split, folds) starts from it
DEFAULT_OUT = ROOT / "docs" / "citations" / "blind"
SHARED_DATA = ROOT.parent / "shared" / "data"
TRAIN_SPLIT = ROOT / "learning" / "sft" / "data" / "train"
CITATION_SESSIONS = ROOT / "docs" / "citations" / "sessions.jsonl"  # the 32 questions of issue 48's figures
GRID: tuple[float, ...] = tuple(round(0.30 + 0.01 * i, 2) for i in range(41))  # thresholds tried: 0.30 … 0.70
FOLDS = 5
Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval
YES_NO = frozenset({"yes", "no"})
Label = bool | str  # True, False or "unclear"

# --- the maths (pure) -------------------------------------------------------------------------------------------------


class Outcome(NamedTuple):
    """One decision of the check about one (claim, passage) pair, with the labeller's verdict on the pair."""

    group: str  # the question (session) the claim comes from: splits and folds never cut a question in two
    accepted: bool  # the check keeps (or re-attributes to) this passage for the claim
    supports: bool  # the labeller says the passage supports the claim


@dataclass(frozen=True, slots=True)
class Rates:
    """False accepts over the pairs labelled unsupported, and false drops over the pairs labelled supported."""

    false_accepts: int
    negatives: int
    false_drops: int
    positives: int

    @property
    def false_accept_rate(self) -> float | None:
        return self.false_accepts / self.negatives if self.negatives else None

    @property
    def false_drop_rate(self) -> float | None:
        return self.false_drops / self.positives if self.positives else None

    @property
    def objective(self) -> float | None:
        """The larger of the two rates (the issue bounds both); None when neither can be computed."""
        found = [r for r in (self.false_accept_rate, self.false_drop_rate) if r is not None]
        return max(found) if found else None

    def as_dict(self) -> dict[str, Any]:
        def part(k: int, n: int) -> dict[str, Any]:
            lo, hi = wilson(k, n)
            return {"count": k, "of": n, "rate": round(k / n, 4) if n else None,
                    "wilson95": [round(lo, 4), round(hi, 4)] if n else None}

        return {"false_claims_accepted": part(self.false_accepts, self.negatives),
                "true_claims_dropped": part(self.false_drops, self.positives)}


def rates(outcomes: Iterable[Outcome]) -> Rates:
    """Count the check's two errors over labelled decisions."""
    fa = neg = fd = pos = 0
    for o in outcomes:
        if o.supports:
            pos += 1
            fd += not o.accepted
        else:
            neg += 1
            fa += o.accepted
    return Rates(fa, neg, fd, pos)


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials: unlike k/n ± z·se it stays inside [0, 1] and does not
    collapse to a point at 0 or n, which matters for error rates near 0 on a few hundred pairs. (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"k must be within 0..n, got k={k}, n={n}")
    p, z2 = k / n, z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two labellers' labels of the same items (in the same order): observed agreement corrected for
    the agreement their label shares alone would give by chance. None when there are no items, or when chance
    agreement is total (both gave one and the same label to everything: kappa is undefined)."""
    if len(a) != len(b):
        raise ValueError(f"two labellers must label the same items: {len(a)} and {len(b)} labels")
    n = len(a)
    if not n:
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    chance = sum((list(a).count(c) / n) * (list(b).count(c) / n) for c in set(a) | set(b))
    if chance >= 1.0:
        return None
    return (observed - chance) / (1.0 - chance)


def _shuffled(groups: Iterable[str], seed: int) -> list[str]:
    """The distinct groups in a seeded order that does not depend on the order they came in."""
    out = sorted(set(groups))
    random.Random(seed).shuffle(out)
    return out


def split_groups(groups: Iterable[str], seed: int = SEED) -> tuple[frozenset[str], frozenset[str]]:
    """(calibration, evaluation): the distinct groups shuffled with `seed` and cut in half (the calibration half is
    the smaller when the count is odd). Split by question, so no question informs both the threshold and its test."""
    order = _shuffled(groups, seed)
    cut = len(order) // 2
    return frozenset(order[:cut]), frozenset(order[cut:])


def kfold_groups(groups: Iterable[str], k: int, seed: int = SEED) -> list[frozenset[str]]:
    """`k` folds of the distinct groups (shuffled with `seed`, dealt round-robin, so sizes differ by at most one);
    fewer folds when there are fewer groups than `k`."""
    if k < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {k}")
    order = _shuffled(groups, seed)
    k = min(k, len(order))
    return [frozenset(order[i::k]) for i in range(k)]


def cv_objective(outcomes_at: Mapping[float, Sequence[Outcome]],
                 folds: Sequence[frozenset[str]]) -> dict[float, float | None]:
    """For each threshold, the mean over folds of max(false-accept rate, false-drop rate) on that fold's decisions
    (a fold with no labelled decision is left out of the mean); None when no fold has one."""
    out: dict[float, float | None] = {}
    for t, outcomes in outcomes_at.items():
        per_fold = [rates(o for o in outcomes if o.group in fold).objective for fold in folds]
        scored = [x for x in per_fold if x is not None]
        out[t] = statistics.fmean(scored) if scored else None
    return out


def choose_threshold(cv: Mapping[float, float | None], prefer: float = SUPPORT_MIN) -> float | None:
    """The threshold with the lowest cross-validated objective; a tie goes to the one nearest `prefer` (the shipped
    threshold: no move without evidence), then to the lower. None when no threshold could be scored."""
    scored = [(round(v, 12), round(abs(t - prefer), 9), t) for t, v in cv.items() if v is not None]
    return min(scored)[2] if scored else None


# --- the check's decisions, from stored supports and vetoes (pure) ----------------------------------------------------


def _found(claim: Mapping[str, Any]) -> dict[str, tuple[Veto, ...]]:
    return {pid: tuple(Veto(v["kind"], v["detail"], frozenset(v.get("missing", ()))) for v in vs)
            for pid, vs in claim.get("vetoes", {}).items()}


def check_decision(claim: Mapping[str, Any], t: float) -> tuple[str, tuple[str, ...]]:
    """(status, kept ids) the check gives a stored claim at threshold `t`: `agent.support.decide` itself, over the
    support of every retrieved passage and every passage's vetoes, so the vetoes and GROUP_MIN act as in a report."""
    kept, _score, status, _why = decide(tuple(claim["cited"]), claim["scores"], t, _found(claim))
    return status, kept


def pair_decisions(claim: Mapping[str, Any], t: float) -> list[tuple[str, str, bool]]:
    """(passage id, role, accepted) for each decision the check makes at `t` about one claim: every cited passage
    (kept or dropped), and the re-attribution candidate only when every cited passage failed."""
    status, kept = check_decision(claim, t)
    out = [(pid, "cited", status == "supported" and pid in kept) for pid in dict.fromkeys(claim["cited"])]
    candidate = claim.get("candidate")
    if status != "supported" and candidate is not None:
        out.append((candidate, "candidate", status == "reattributed"))
    return out


def labelled_pairs(claim: Mapping[str, Any], grid: Sequence[float] = GRID) -> list[tuple[str, str]]:
    """(passage id, role) of the pairs a labeller must judge for this claim: its cited passages, and its candidate
    when the candidate reaches the lowest threshold and some threshold of `grid` fails the cited ones."""
    out = [(pid, "cited") for pid in dict.fromkeys(claim["cited"])]
    candidate = claim.get("candidate")
    if candidate is not None and claim["scores"].get(candidate, 0.0) >= min(grid) \
            and any(check_decision(claim, t)[0] != "supported" for t in grid):
        out.append((candidate, "candidate"))
    return out


def verdict(pids: Iterable[str], label: Callable[[str], Label | None]) -> bool | None:
    """Whether these passages together support a claim: True when any is labelled true, False when all are labelled
    false, None when that is not known (a pair unclear or not labelled, and none true)."""
    seen = [label(p) for p in pids]
    if any(x is True for x in seen):
        return True
    if seen and all(x is False for x in seen):
        return False
    return None


def claim_state(claim: Mapping[str, Any], t: float, label: Callable[[str], Label | None]) -> tuple[bool | None, str]:
    """(supported before, state after) of one claim at `t`. Before: `verdict` of the passages it cited. After:
    "marked" (the check removed its citation), else "supported", "unsupported" or "unknown" by `verdict` of the
    passages it now cites (a re-attributed claim: the candidate's label)."""
    status, kept = check_decision(claim, t)
    if status == "unsupported":
        return verdict(claim["cited"], label), "marked"
    after = verdict(kept, label)
    return verdict(claim["cited"], label), {True: "supported", False: "unsupported", None: "unknown"}[after]


def unsupported_share(states: Sequence[tuple[bool | None, str]]) -> dict[str, Any]:
    """Cited sentences whose passage does not support them, before and after the check, over the claims known on
    both sides (re-attributed claims count by their new passage), each with its Wilson interval."""
    known = [(b, a) for b, a in states if b is not None and a != "unknown"]
    before = sum(1 for b, _ in known if b is False)
    after = sum(1 for _, a in known if a == "unsupported")
    n = len(known)

    def part(k: int) -> dict[str, Any]:
        lo, hi = wilson(k, n)
        return {"count": k, "of": n, "share": round(k / n, 4) if n else None,
                "wilson95": [round(lo, 4), round(hi, 4)] if n else None}

    return {"before": part(before), "after": part(after), "marked_after": sum(1 for _, a in known if a == "marked"),
            "claims": len(states), "unknown": len(states) - n}


# --- questions --------------------------------------------------------------------------------------------------------


def excluded_questions(data: Path) -> frozenset[str]:
    """Normalised texts of every question the project trains or evaluates on (the module docstring's rule)."""
    from learning.eval.datasets import bench_spec
    from learning.eval.heldout import load_heldout, normalize_question

    questions = [i.question for i in load_heldout()]
    for name in ("hotpotqa", "musique"):
        questions += [e.question for e in bench_spec(name).loader(TRAIN_SPLIT)]
        questions += [e.question for e in bench_spec(name).loader(data / "wiki_multihop_corpus")]
    questions += [r["question"] for r in json_lines(CITATION_SESSIONS) if "question" in r]
    return frozenset(normalize_question(q) for q in questions)


def _corpus_text(files: Sequence[str]) -> str:
    from agent.ingest import load_demo_corpus

    return "\n".join(f"{d.title}\n{d.text}" for d in load_demo_corpus(files))


def question_pool(data: Path = SHARED_DATA, seed: int = SEED) -> list[Any]:
    """Every question this study may ask, in the order it asks them (the module docstring's tiers), as
    `learning.eval.heldout.HeldoutItem`s without gold passages."""
    from agent.ingest import DEMO_CORPUS_FILES
    from learning.eval.datasets import bench_spec
    from learning.eval.heldout import HeldoutItem, normalize_question

    excluded = set(excluded_questions(data))
    two_wiki, everything = _corpus_text(("2wikimultihopqa_corpus.json",)), _corpus_text(DEMO_CORPUS_FILES)

    def tier(benches: Sequence[str], corpus: str, drop_yes_no: bool, suffix: str) -> list[Any]:
        out = []
        for bench in benches:
            for e in bench_spec(bench).loader(data / bench):
                key = normalize_question(e.question)
                answers = [a for a in e.answers if a.strip()]
                if key in excluded or not any(a in corpus for a in answers):
                    continue
                if drop_yes_no and any(a.strip().casefold() in YES_NO for a in answers):
                    continue
                excluded.add(key)  # a question twice in the pool is asked once
                out.append(HeldoutItem(f"{bench}{suffix}:{e.id}", bench, e.question, tuple(e.answers), (), e.format))
        return out

    rng = random.Random(seed)
    first = tier(("2wikimultihopqa",), two_wiki, False, "")
    second = tier(("hotpotqa", "musique"), everything, True, "-dev")
    rng.shuffle(first)
    rng.shuffle(second)
    return first + second


# --- files ------------------------------------------------------------------------------------------------------------


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append one JSON line; a line torn by an earlier kill is ended first, so it cannot swallow this one."""
    torn = False
    if path.is_file() and path.stat().st_size:
        with path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            torn = fh.read(1) != b"\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(("\n" if torn else "") + json.dumps(row, ensure_ascii=False) + "\n")


def write_lines(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def parse_label(value: Any) -> Label | None:
    """A labeller's `supports`: true, false or "unclear" (also "yes"/"no"); None for a row that gives none."""
    if isinstance(value, bool):
        return value
    text = "" if value is None else str(value).strip().casefold()
    if not text:
        return None
    if text in ("true", "yes"):
        return True
    if text in ("false", "no"):
        return False
    if text == "unclear":
        return "unclear"
    raise ValueError(f"supports must be true, false or \"unclear\", got {value!r}")


def read_labels(out: Path) -> dict[str, dict[str, Label]]:
    """labeller -> pair_id -> label, from every `labels_<labeller>.jsonl` (a later row for a pair wins).

    Raises:
        ValueError: a line that is not a JSON object with a `pair_id` and a readable `supports` (named by file and
            line: a hand-written file is fixed, never silently skipped).
    """
    found: dict[str, dict[str, Label]] = {}
    for path in sorted(out.glob("labels_*.jsonl")):
        mine: dict[str, Label] = {}
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                label = parse_label(row.get("supports"))
                pid = str(row["pair_id"])
            except (json.JSONDecodeError, AttributeError, KeyError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: {exc}") from exc
            if label is not None:
                mine[pid] = label
        found[path.stem.removeprefix("labels_")] = mine
    return found


# --- sessions ---------------------------------------------------------------------------------------------------------


def claim_records(row: Mapping[str, Any], embed: Any) -> list[dict[str, Any]]:
    """Every cited claim of a stored session as the current check reads it, with what the decisions need at any
    threshold: the support of every retrieved passage (unrounded, so `decide` reproduces the check), every veto of
    every passage, and the re-attribution candidate (the best-supported passage it did not cite that no veto rules
    out: the only passage the check could re-attribute it to, whatever the threshold).

    Raises:
        RuntimeError: the check could not run (its note says why).
    """
    from agent.report import Report, verify_report
    from agent.support import support_matrix
    from agent.vetoes import claim_facts, passage_facts, vetoes
    from store.records import PromptRecord, Snippet, ToolCallRecord, Trajectory

    snippets = {i: Snippet(i, v["tool"], v["title"], v["text"], v["url"]) for i, v in row["snippets"].items()}
    traj = Trajectory(session_id=row["item"], question=row["question"],
                      prompt=PromptRecord(text="", token_ids=(), prompt_sha=""), turns=(),
                      tool_calls=(ToolCallRecord(tool="local_search", query="", snippets=tuple(snippets.values())),))
    raw = Report("", row["body"], tuple(snippets[i] for i in row["references"]), 0, row["answer_found"])
    check = verify_report(raw, traj, embed).support
    if check is not None and not check.verified:
        raise RuntimeError(f"the check did not run: {check.note}")
    claims = check.claims if check else ()
    if not claims:
        return []
    passages = list({s.id: s for s in [*raw.references, *traj.snippets.values()]}.values())  # check_support's order
    matrix = support_matrix([c.text for c in claims], passages, embed)
    read = {p.id: passage_facts(p.title, p.text) for p in passages}
    out = []
    for c, supports in zip(claims, matrix, strict=True):
        facts = claim_facts(c.text)
        scores = {p.id: float(x) for p, x in zip(passages, supports, strict=True)}
        found = {p.id: vetoes(facts, read[p.id]) for p in passages}
        clean = [i for i in scores if not found[i] and i not in c.cited]
        out.append({**c.as_dict(), "scores": scores,
                    "vetoes": {i: [{"kind": v.kind, "detail": v.detail, "missing": sorted(v.missing)} for v in vs]
                               for i, vs in found.items() if vs},
                    "candidate": max(clean, key=lambda i: scores[i], default=None)})
    return out


async def run_sessions(out: Path, n: int, data: Path) -> None:
    """Research the first `n` questions of the pool that `<out>/sessions.jsonl` does not hold yet, appending each
    session as it ends."""
    from citation_support import CAPS, _settings, session_row  # the same settings as issue 48's sessions
    from learning_curve import sampling_seed

    from agent.config import RunOptions
    from app.container import build
    from store.embeddings import embed_texts

    pool = question_pool(data)
    if n > len(pool):
        print(f"only {len(pool)} questions qualify; running those", file=sys.stderr)
    path = out / "sessions.jsonl"
    done = {r["item"] for r in json_lines(path)}
    todo = [i for i in pool[:n] if i.id not in done]
    if not todo:
        return
    home = Path(tempfile.mkdtemp(prefix="citation-blind-"))
    services = build(_settings(home), say=lambda *_: None, progress=None)
    try:
        for k, item in enumerate(todo, 1):
            began = time.perf_counter()
            seed = sampling_seed(item.id, 0)
            opts = RunOptions(format=item.format, max_tool_calls=2, temperature=0.8, seed=seed, wall_clock_s=3600,
                              token_caps=CAPS, inject_bank=False)
            try:
                result = await services.research.run(item.question, opts, source="eval")
            except Exception as exc:  # noqa: BLE001 - recorded: the question counts as asked, with no report
                row: dict[str, Any] = {"item": item.id, "question": item.question,
                                       "error": f"{type(exc).__name__}: {exc}"}
            else:
                row = session_row(item, result.trajectory)
                try:
                    row["claims"] = claim_records(row, embed_texts)
                except Exception as exc:  # noqa: BLE001 - the session is kept; --export reads it again
                    row["claims_error"] = f"{type(exc).__name__}: {exc}"
            row.update(source=item.source, answers=list(item.answers), sample=0, seed=seed,
                       seconds=round(time.perf_counter() - began, 1))
            append_row(path, row)
            print(f"[{k}/{len(todo)}] {item.id}: {row['seconds']} s, {len(row.get('claims', []))} claims",
                  file=sys.stderr, flush=True)
    finally:
        await services.policy.aclose()
        shutil.rmtree(home, ignore_errors=True)


def current_claims(out: Path) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], dict[str, int]]:
    """(session, claim) for every claim of every stored session, read again by the current check (so a change to
    the check needs no new sessions), and counts of the sessions."""
    from store.embeddings import embed_texts

    rows = json_lines(out / "sessions.jsonl")
    ok = [r for r in rows if "error" not in r]
    found, unchecked = [], 0
    for r in ok:
        try:
            found += [(r, c) for c in claim_records(r, embed_texts)]
        except RuntimeError as exc:  # the check could not read this report: counted, never labelled
            unchecked += 1
            print(f"{r['item']}: {exc}", file=sys.stderr)
    return found, {"sessions": len(rows), "failed": len(rows) - len(ok), "check_failed": unchecked,
                   "seconds": round(sum(r.get("seconds", 0.0) for r in rows), 1)}


# --- export -----------------------------------------------------------------------------------------------------------

LABELLING = """# Labelling the citation pairs (issue 64, blind)

Each row of `to_label.jsonl` is one sentence (`claim`) from a research report and one passage (`title`, `text`)
a search returned. You see no question, no score and no verdict, and you are not told whether the report cited
this passage; please do not look at `pairs_key.jsonl`, `sessions.jsonl` or any other file of this folder, do not
run the citation check, and do not compare notes with another labeller until both of you are done.

For each row, answer one question: **does the passage support the sentence?**

- `true`: the passage states what the sentence says, in its own words or others. When the sentence joins two facts
  and the passage states one of them, answer `true` (the citation can be for that part) and say so in the note.
- `false`: the passage does not say it: it is on the same topic but says something else, contradicts the sentence
  (another number, date, name, place; "not" on one side only; who did what to whom swapped; increase for decrease;
  all for some), or says only part of a single fact. A sentence about the source itself rather than the world
  ("this source answers the question", "Step 1 is covered by X") is `false`.
- `"unclear"`: you cannot tell what the sentence claims (garbled words), or the passage is cut where it matters.
  Say why in the note.

Judge from the passage alone, not from what you know: a true sentence the passage does not state is `false`. The
passage is cut at about 300 characters, as the model saw it. Rows come in a random order; a sentence may appear
with more than one passage, and each pair is judged on its own.

Write one line per row to `labels_<your name>.jsonl` in this folder (a JSON object a line):

    {"pair_id": "3f9c0a1b2c4d", "supports": true, "note": ""}
    {"pair_id": "a07e5d61e2f0", "supports": false, "note": "passage says 1956, sentence 1965"}
    {"pair_id": "0b1c2d3e4f50", "supports": "unclear", "note": "sentence has no verb"}

The first labeller labels every row. The second labels at least the first 60 rows in file order (a random sample,
since the rows are shuffled) without seeing the first labeller's file. Then run
`.venv/bin/python tests/benchmarks/citation_blind.py --report`.
"""


def pair_rows(claims: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
              old: Mapping[tuple[str, str, str], str]) -> list[dict[str, Any]]:
    """One key row per distinct (question, claim, passage) pair to label, with its roles; a pair already in the key
    keeps its id."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for session, claim in claims:
        status, kept = check_decision(claim, SUPPORT_MIN)
        for pid, role in labelled_pairs(claim):
            key = (session["item"], claim["text"], pid)
            passage = session["snippets"][pid]
            row = rows.setdefault(key, {
                "pair_id": old.get(key), "item": session["item"], "question": session["question"],
                "claim": claim["text"], "passage_id": pid, "title": passage["title"], "text": passage["text"],
                "roles": [], "score": round(claim["scores"][pid], 4),
                "vetoes": [v["kind"] + ": " + v["detail"] for v in claim["vetoes"].get(pid, [])],
                "status_at_support_min": status, "kept_at_support_min": pid in kept})
            if role not in row["roles"]:
                row["roles"].append(role)
    taken = {r["pair_id"] for r in rows.values() if r["pair_id"]} | set(old.values())
    for row in rows.values():
        while not row["pair_id"]:
            pid = secrets.token_hex(6)
            if pid not in taken:
                taken.add(pid)
                row["pair_id"] = pid
    return list(rows.values())


def blind_order(rows: Sequence[Mapping[str, Any]], seed: int = SEED) -> list[dict[str, Any]]:
    """What a labeller sees: only the id, the claim and the passage, in a seeded random order."""
    out = [{"pair_id": r["pair_id"], "claim": r["claim"], "title": r["title"], "text": r["text"]}
           for r in sorted(rows, key=lambda r: r["pair_id"])]
    random.Random(seed).shuffle(out)
    return out


def export(out: Path) -> dict[str, Any]:
    """Write to_label.jsonl, pairs_key.jsonl and LABELLING.md; ids already issued are kept."""
    claims, counts = current_claims(out)
    key_path = out / "pairs_key.jsonl"
    previous = json_lines(key_path)
    old = {(r["item"], r["claim"], r["passage_id"]): r["pair_id"] for r in previous}
    rows = pair_rows(claims, old)
    current = {r["pair_id"] for r in rows}
    stale = [{**r, "current": False} for r in previous if r["pair_id"] not in current]  # kept: labels may name it
    write_lines(key_path, [{**r, "current": True} for r in rows] + stale)
    write_lines(out / "to_label.jsonl", blind_order(rows))
    (out / "LABELLING.md").write_text(LABELLING, encoding="utf-8")
    roles = [role for r in rows for role in r["roles"]]
    return {**counts, "claims": len(claims), "pairs": len(rows), "cited_pairs": roles.count("cited"),
            "candidate_pairs": roles.count("candidate"), "stale_pairs": len(stale)}


# --- report -----------------------------------------------------------------------------------------------------------


def labeller_order(labels: Mapping[str, Mapping[str, Label]], chosen: Sequence[str] = ()) -> list[str]:
    """Labellers, first the one the figures use: `chosen` first if given, then by labels made, then by name."""
    rest = sorted((n for n in labels if n not in chosen), key=lambda n: (-len(labels[n]), n))
    return [n for n in chosen if n in labels] + rest


def agreement(first: Mapping[str, Label], second: Mapping[str, Label]) -> dict[str, Any]:
    """Cohen's kappa on the pairs both labelled true or false, with the 2x2 table, and the three-label kappa."""
    both = sorted(set(first) & set(second))
    binary = [p for p in both if isinstance(first[p], bool) and isinstance(second[p], bool)]
    a, b = [first[p] for p in binary], [second[p] for p in binary]
    table = {f"{x}_{y}": sum(1 for p in binary if first[p] is x and second[p] is y)
             for x in (True, False) for y in (True, False)}
    kappa = cohen_kappa(a, b)
    three = cohen_kappa([str(first[p]) for p in both], [str(second[p]) for p in both])
    return {"both_labelled": len(both), "both_true_or_false": len(binary), "table_first_second": table,
            "agree": sum(x == y for x, y in zip(a, b, strict=True)),
            "kappa": round(kappa, 4) if kappa is not None else None,
            "kappa_with_unclear": round(three, 4) if three is not None else None}


def outcomes_at(claims: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], t: float,
                label: Callable[[str, str, str], Label | None]) -> tuple[list[Outcome], dict[str, int]]:
    """The check's labelled decisions at `t` over these claims, and the decisions left out (unclear, unlabelled)."""
    found, skipped = [], {"unclear": 0, "unlabelled": 0}
    for session, claim in claims:
        for pid, _role, accepted in pair_decisions(claim, t):
            lab = label(session["item"], claim["text"], pid)
            if isinstance(lab, bool):
                found.append(Outcome(session["item"], accepted, lab))
            else:
                skipped["unclear" if lab == "unclear" else "unlabelled"] += 1
    return found, skipped


def figures_at(claims: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], t: float,
               label: Callable[[str, str, str], Label | None]) -> dict[str, Any]:
    """The check's errors and the unsupported share at one threshold over these claims."""
    found, skipped = outcomes_at(claims, t, label)
    states = [claim_state(c, t, lambda pid, s=s, c=c: label(s["item"], c["text"], pid)) for s, c in claims]
    return {"threshold": t, "questions": len({s["item"] for s, _ in claims}), "claims": len(claims),
            **rates(found).as_dict(), "decisions_left_out": skipped,
            "unsupported_cited_sentences": unsupported_share(states)}


def report(out: Path, chosen: Sequence[str] = (), folds: int = FOLDS) -> dict[str, Any]:
    """Read the sessions, the key and every labels file; write summary.json and summary.md."""
    claims, counts = current_claims(out)
    key = {r["pair_id"]: (r["item"], r["claim"], r["passage_id"]) for r in json_lines(out / "pairs_key.jsonl")}
    labels = read_labels(out)
    order = labeller_order(labels, chosen)
    by_pair = {name: {key[p]: v for p, v in labels[name].items() if p in key} for name in order}
    primary = by_pair[order[0]] if order else {}

    def label(item: str, claim: str, pid: str) -> Label | None:
        return primary.get((item, claim, pid))

    needed = {(s["item"], c["text"], pid) for s, c in claims for pid, _ in labelled_pairs(c)}
    calibration, evaluation = split_groups(s["item"] for s, _ in claims)
    cal = [(s, c) for s, c in claims if s["item"] in calibration]
    ev = [(s, c) for s, c in claims if s["item"] in evaluation]
    cv: dict[float, float | None] = {}
    fold_sets = kfold_groups(calibration, folds) if len(calibration) >= 2 else []
    if fold_sets:
        cv = cv_objective({t: outcomes_at(cal, t, label)[0] for t in GRID}, fold_sets)
    best = choose_threshold(cv)
    summary: dict[str, Any] = {
        **counts, "claims": len(claims), "pairs_needed": len(needed), "pairs_in_key": len(key),
        "pairs_needed_not_in_key": len(needed - set(key.values())),
        "pairs_needed_unlabelled": sum(1 for k in needed if k not in primary),
        "labellers": {n: {"labels": len(labels[n]), "true": sum(v is True for v in labels[n].values()),
                          "false": sum(v is False for v in labels[n].values()),
                          "unclear": sum(v == "unclear" for v in labels[n].values()),
                          "ids_not_in_key": sum(1 for p in labels[n] if p not in key)} for n in order},
        "figures_use": order[0] if order else None,
        "agreement": ({"labellers": order[:2], **agreement(labels[order[0]], labels[order[1]])}
                      if len(order) >= 2 else None),
        "split": {"seed": SEED, "calibration_questions": len(calibration), "evaluation_questions": len(evaluation),
                  "calibration_claims": len(cal), "evaluation_claims": len(ev)},
        "calibration": {"folds": len(fold_sets), "grid": [GRID[0], GRID[-1], 0.01],
                        "cv_objective": {str(t): (round(v, 4) if v is not None else None) for t, v in cv.items()},
                        "chosen": best, "shipped_support_min": SUPPORT_MIN,
                        "in_sample_at_chosen": figures_at(cal, best, label) if best is not None else None},
        "evaluation": {"at_chosen": figures_at(ev, best, label) if best is not None else None,
                       "at_support_min": figures_at(ev, SUPPORT_MIN, label)},
        "all_questions_at_support_min": figures_at(claims, SUPPORT_MIN, label),
        "check_reproduced": sum(1 for _, c in claims
                                if check_decision(c, SUPPORT_MIN) == (c["status"], tuple(c["kept"]))),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(summary), encoding="utf-8")
    return summary


def _rate(part: Mapping[str, Any] | None, key: str = "rate") -> str:
    if not part or not part["of"]:
        return "no labelled pairs"
    lo, hi = part["wilson95"]
    return f"{part['count']}/{part['of']}, {100 * part[key]:.1f} % [{100 * lo:.0f}, {100 * hi:.0f}]"


def summary_markdown(s: Mapping[str, Any]) -> str:
    """The summary for people: what was measured, on which half, with intervals."""
    lines = ["# Blind calibration of the citation check (issue 64)", "",
             f"{s['sessions']} sessions ({s['failed']} failed), {s['claims']} cited claims, {s['pairs_needed']} "
             f"pairs to label ({s['pairs_needed_unlabelled']} not labelled by the figures' labeller, "
             f"{s['pairs_needed_not_in_key']} not exported yet). Labels: "
             + (", ".join(f"{n} {v['labels']}" for n, v in s["labellers"].items()) or "none") + ".", ""]
    a = s["agreement"]
    if a:
        lines += [f"**Agreement** ({' vs '.join(a['labellers'])}): Cohen's kappa {a['kappa']} on "
                  f"{a['both_true_or_false']} pairs both labelled true or false ({a['agree']} agree; "
                  f"{a['both_labelled']} both labelled, kappa {a['kappa_with_unclear']} with \"unclear\" as a label).",
                  ""]
    c, sp = s["calibration"], s["split"]
    chosen = (f"**Threshold** by {c['folds']}-fold cross-validation on the calibration half (mean over folds of "
              f"max(false-accept, false-drop rate)): **{c['chosen']}** (shipped SUPPORT_MIN "
              f"{c['shipped_support_min']})." if c["chosen"] is not None else
              "**Threshold**: none chosen (the calibration half has too few questions or no labelled decisions).")
    lines += [f"**Split** by question (seed {sp['seed']}): calibration {sp['calibration_questions']} questions "
              f"({sp['calibration_claims']} claims), evaluation {sp['evaluation_questions']} "
              f"({sp['evaluation_claims']} claims).", "", chosen,
              "", "| threshold | where | false claims accepted | true claims dropped | unsupported cited, before | "
              "after |", "|---|---|---|---|---|---|"]
    rows = [("chosen, in sample", c["in_sample_at_chosen"]), ("chosen, evaluation half", s["evaluation"]["at_chosen"]),
            ("SUPPORT_MIN, evaluation half", s["evaluation"]["at_support_min"]),
            ("SUPPORT_MIN, all questions", s["all_questions_at_support_min"])]
    for where, f in rows:
        if f is None:
            continue
        u = f["unsupported_cited_sentences"]
        lines.append(f"| {f['threshold']} | {where} | {_rate(f['false_claims_accepted'])} | "
                     f"{_rate(f['true_claims_dropped'])} | {_rate(u['before'], 'share')} | "
                     f"{_rate(u['after'], 'share')} |")
    lines += ["", f"The stored supports and vetoes reproduce the check's verdict at SUPPORT_MIN on "
              f"{s['check_reproduced']} of {s['claims']} claims.", "",
              "Rates are over labelled decisions (count/of, 95 % Wilson interval); \"unsupported cited\" counts "
              "re-attributed claims by their new passage's label. The chosen threshold's in-sample row is not an "
              "acceptance figure; the evaluation-half rows are out of sample. SUPPORT_MIN predates this set, so "
              "its all-questions row is out of sample too.", ""]
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared benchmark data (../shared/data)")
    ap.add_argument("--sessions", type=int, default=0, help="research the first N questions of the pool (a total)")
    ap.add_argument("--export", action="store_true", help="write to_label.jsonl, pairs_key.jsonl, LABELLING.md")
    ap.add_argument("--report", action="store_true", help="kappa, cross-validated threshold, out-of-sample figures")
    ap.add_argument("--labellers", default="", help="comma-separated: the first is the one the figures use")
    ap.add_argument("--folds", type=int, default=FOLDS)
    ap.add_argument("--smoke", action="store_true", help="2 sessions into --out (not the default), then --export")
    a = ap.parse_args()
    if a.smoke:
        if a.out.resolve() == DEFAULT_OUT.resolve():
            ap.error("--smoke writes into a folder of its own: give --out (e.g. /tmp/blind-smoke)")
        a.sessions, a.export = 2, True
    if not (a.sessions or a.export or a.report):
        ap.error("nothing to do: give --sessions N, --export, --report or --smoke")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.sessions:
        began = time.perf_counter()
        asyncio.run(run_sessions(a.out, a.sessions, a.data))
        print(f"sessions: {time.perf_counter() - began:.0f} s", file=sys.stderr)
    if a.export:
        print(json.dumps({"export": export(a.out)}, indent=1))
    if a.report:
        chosen = [n.strip() for n in a.labellers.split(",") if n.strip()]
        print(json.dumps(report(a.out, chosen, a.folds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
