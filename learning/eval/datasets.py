"""Benchmark loaders: read a benchmark's files from a data folder (given at run time, never ../shared) into typed
`EvalItem`s. A missing folder or file, or a record of the wrong shape, raises `DatasetError` with the path and what
was expected; nothing is guessed."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent.config import FormatLabel
from learning.errors import LearningError

BenchKind = Literal["short_form", "healthbench", "deep_research_bench", "scholarqa_cs", "rubric_pairs"]

# Format labels (METHOD §12.1): short-form QA sets get `exact_answer` (the answer is asked for as \boxed{...}, which
# is what EM/F1 need); HealthBench and DRB get `short_form` (DR Tulu's evaluation convention); ScholarQA gets long_form.
SHORT_FORM_FORMAT: FormatLabel = "exact_answer"

DRB_DIMENSIONS = ("comprehensiveness", "insight", "instruction_following", "readability")


class EvalError(LearningError):
    """Base of the evaluation harness's errors."""


class UnknownBenchmarkError(EvalError):
    """The benchmark name is not one the harness knows."""


class DatasetError(EvalError):
    """A benchmark's data folder or file is missing or not in the expected format."""

    def __init__(self, path: Path, expected: str) -> None:
        super().__init__(f"{path}: {expected}")
        self.path = path
        self.expected = expected


@dataclass(frozen=True, slots=True)
class Criterion:
    """One rubric item or grading criterion of an item.

    `weight` is the benchmark's own number: HealthBench points (-10..10, negative = undesirable), the DRB weight within
    its dimension, or the ScholarQA-CS ingredient weight. `group` is the DRB dimension or the ScholarQA-CS class
    ("must_have" / "nice_to_have"); `name` is the source's key for the criterion where it has one.
    """

    text: str
    weight: float
    group: str = ""
    name: str = ""
    explanation: str = ""
    evidence: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EvalItem:
    """One benchmark item: what the agent is asked, with what it is scored against."""

    id: str
    question: str
    format: FormatLabel
    answers: tuple[str, ...] = ()  # gold answer first, then aliases (short-form sets)
    criteria: tuple[Criterion, ...] = ()
    reference: str = ""  # a reference answer/report where the benchmark has one (DRB: the reference article)
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BenchSpec:
    """A benchmark the harness can run."""

    name: str
    kind: BenchKind
    loader: Callable[[Path], list[EvalItem]]
    needs_judge: bool
    files: str  # what the data folder must hold (for messages and --help)


# ---------------------------------------------------------------------------------------------------------- reading


def _require_dir(data_dir: Path) -> Path:
    path = Path(data_dir)
    if not path.exists():
        raise DatasetError(path, "data folder does not exist")
    if not path.is_dir():
        raise DatasetError(path, "expected a data folder, found a file")
    return path


def _first_existing(data_dir: Path, names: Sequence[str]) -> Path:
    folder = _require_dir(data_dir)
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise DatasetError(folder, f"expected one of these files in the folder: {', '.join(names)}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DatasetError(path, "file does not exist") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(path, f"expected valid UTF-8 JSON ({exc})") from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise DatasetError(path, "file does not exist") from exc
    except UnicodeDecodeError as exc:
        raise DatasetError(path, f"expected UTF-8 JSONL ({exc})") from exc
    out: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(path, f"line {n}: expected one JSON object per line ({exc})") from exc
        if not isinstance(rec, dict):
            raise DatasetError(path, f"line {n}: expected a JSON object, got {type(rec).__name__}")
        out.append(rec)
    return out


def _read_csv(path: Path) -> list[dict[str, str]]:
    # SimpleQA's metadata column holds long python-dict strings; lift the csv module's 128 KiB field cap.
    csv.field_size_limit(16 * 1024 * 1024)
    try:
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError as exc:
        raise DatasetError(path, "file does not exist") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(path, f"expected a UTF-8 CSV file with a header row ({exc})") from exc


def _records(path: Path) -> list[dict[str, Any]]:
    """JSON list, JSONL or CSV, by extension."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".csv":
        return _read_csv(path)
    if suffix == ".json":
        data = _read_json(path)
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DatasetError(path, "expected a JSON list of objects")
        return data
    raise DatasetError(path, "expected a .jsonl, .json or .csv file")


def _text(rec: Mapping[str, Any], keys: Sequence[str], path: Path, where: str) -> str:
    """The first non-empty string field among `keys`."""
    for key in keys:
        value = rec.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    raise DatasetError(path, f"{where}: expected a non-empty text field {' or '.join(repr(k) for k in keys)}")


def _text_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, str):
        return (value.strip(),) if value.strip() else ()
    if isinstance(value, list | tuple):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return ()


def _question_id(question: str, seen: dict[str, int]) -> str:
    """A stable id for files with no id column: a hash of the question (duplicates get a -2, -3 suffix)."""
    base = "q" + hashlib.sha256(question.encode("utf-8")).hexdigest()[:12]
    seen[base] = seen.get(base, 0) + 1
    return base if seen[base] == 1 else f"{base}-{seen[base]}"


def _check_unique(items: list[EvalItem], path: Path) -> list[EvalItem]:
    ids = [i.id for i in items]
    dupes = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if dupes:
        raise DatasetError(path, f"expected unique item ids; duplicated: {dupes[:5]}")
    if not items:
        raise DatasetError(path, "expected at least one item, found none")
    return items


# ------------------------------------------------------------------------------------------------------- short-form

_QUESTION_KEYS = ("question", "problem", "Prompt", "prompt", "query")
_ANSWER_KEYS = ("answer", "true_answer", "Answer", "answers", "golden_answers", "gold")
_ALIAS_KEYS = ("answer_aliases", "aliases")
_ID_KEYS = ("id", "_id", "idx", "qid")


def _shortform_items(
    records: list[dict[str, Any]], path: Path, extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> list[EvalItem]:
    seen: dict[str, int] = {}
    items = []
    for n, rec in enumerate(records, 1):
        where = f"record {n}"
        question = _text(rec, _QUESTION_KEYS, path, where)
        answers: tuple[str, ...] = ()
        for key in _ANSWER_KEYS:
            answers = _text_list(rec.get(key))
            if answers:
                break
        if not answers:
            raise DatasetError(path, f"{where}: expected an answer field {' or '.join(repr(k) for k in _ANSWER_KEYS)}")
        for key in _ALIAS_KEYS:
            answers += tuple(a for a in _text_list(rec.get(key)) if a not in answers)
        rid = next((str(rec[k]) for k in _ID_KEYS if rec.get(k) not in (None, "")), None)
        items.append(
            EvalItem(
                id=rid if rid is not None else _question_id(question, seen),
                question=question,
                format=SHORT_FORM_FORMAT,
                answers=answers,
                metadata=extra(rec) if extra else {},
            )
        )
    return _check_unique(items, path)


def load_hotpotqa(data_dir: Path) -> list[EvalItem]:
    """HotpotQA: `hotpotqa_train.json` (the corpus-paired questions of wiki_multihop_corpus, with supporting titles)
    or `hotpotqa_500.jsonl` (R1-Searcher's dev sample)."""
    path = _first_existing(data_dir, ("hotpotqa_train.json", "hotpotqa_500.jsonl"))

    def extra(rec: dict[str, Any]) -> dict[str, Any]:
        facts = rec.get("supporting_facts") or []
        titles = list(dict.fromkeys(f[0] for f in facts if isinstance(f, list | tuple) and f))
        meta: dict[str, Any] = {k: rec[k] for k in ("type", "level") if k in rec}
        return {**meta, "supporting_titles": titles} if titles else meta

    return _shortform_items(_records(path), path, extra)


def load_musique(data_dir: Path) -> list[EvalItem]:
    """MuSiQue (answerable only): `musique_train.json` (corpus-paired, with aliases and supporting paragraphs) or
    `musique_500.jsonl`."""
    path = _first_existing(data_dir, ("musique_train.json", "musique_500.jsonl"))
    records = [r for r in _records(path) if r.get("answerable", True) is not False]

    def extra(rec: dict[str, Any]) -> dict[str, Any]:
        paras = rec.get("paragraphs") or []
        titles = list(
            dict.fromkeys(
                p["title"] for p in paras if isinstance(p, dict) and p.get("is_supporting") and p.get("title")
            )
        )
        return {"supporting_titles": titles} if titles else {}

    return _shortform_items(records, path, extra)


def _single_file_loader(names: tuple[str, ...]) -> Callable[[Path], list[EvalItem]]:
    def load(data_dir: Path) -> list[EvalItem]:
        path = _first_existing(data_dir, names)
        return _shortform_items(_records(path), path)

    load.__doc__ = f"Short-form QA from {' or '.join(names)}."
    return load


def _frames_extra(rec: dict[str, Any]) -> dict[str, Any]:
    return {"reasoning_types": rec["reasoning_types"]} if rec.get("reasoning_types") else {}


def load_frames(data_dir: Path) -> list[EvalItem]:
    """FRAMES: `frames_test_set.csv` (question, true_answer, reasoning_types)."""
    path = _first_existing(data_dir, ("frames_test_set.csv",))
    return _shortform_items(_records(path), path, _frames_extra)


def load_shortform(data_dir: Path) -> list[EvalItem]:
    """Any short-form QA set: `data_dir` is a .jsonl/.json/.csv file, or a folder holding exactly one.

    Columns: question (or problem/prompt/query), answer (or true_answer/answers/golden_answers/gold; a list is
    allowed), optional answer_aliases/aliases and id/_id/idx/qid (otherwise the id is a hash of the question).
    """
    path = Path(data_dir)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() in (".jsonl", ".json", ".csv") and p.is_file())
        if len(found) != 1:
            raise DatasetError(path, f"expected exactly one .jsonl/.json/.csv file in the folder, found {len(found)}")
        path = found[0]
    elif not path.is_file():
        raise DatasetError(path, "expected a .jsonl/.json/.csv file or a folder holding one")
    return _shortform_items(_records(path), path)


# -------------------------------------------------------------------------------------------------------- HealthBench


def render_conversation(messages: Sequence[Mapping[str, str]]) -> str:
    """The question text for a HealthBench conversation.

    A single user message is asked as is. A multi-turn conversation is joined into one input with an instruction to
    write the assistant's next reply (DR Tulu's adaptation, METHOD §13), since the agent takes one question.
    """
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"].strip()
    turns = "\n\n".join(f"{m['role'].capitalize()}: {m['content'].strip()}" for m in messages)
    return (
        "The following is a conversation between a user and an AI assistant about a health question. "
        "Write the assistant's next reply to the user's last message.\n\n" + turns
    )


def _healthbench_file(path: Path) -> list[EvalItem]:
    items = []
    for n, rec in enumerate(_read_jsonl(path), 1):
        where = f"line {n}"
        pid = _text(rec, ("prompt_id",), path, where)
        prompt, rubrics = rec.get("prompt"), rec.get("rubrics")
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in prompt
            )
        ):
            raise DatasetError(path, f"{where}: expected 'prompt' to be a non-empty list of {{role, content}} turns")
        if not isinstance(rubrics, list) or not rubrics:
            raise DatasetError(path, f"{where}: expected a non-empty 'rubrics' list")
        criteria = []
        for r in rubrics:
            points = r.get("points") if isinstance(r, dict) else None
            if (
                not isinstance(points, int | float)
                or isinstance(points, bool)
                or not isinstance(r.get("criterion"), str)
            ):
                raise DatasetError(path, f"{where}: expected each rubric to be {{criterion: str, points: number}}")
            criteria.append(Criterion(text=r["criterion"], weight=float(points), tags=tuple(r.get("tags") or ())))
        if not any(c.weight > 0 for c in criteria):
            raise DatasetError(path, f"{where}: expected at least one positive-point rubric (the score's denominator)")
        ideal = rec.get("ideal_completions_data") or {}
        items.append(
            EvalItem(
                id=f"{path.stem}:{pid}",  # the same prompt_id occurs in both shipped files, with different rubrics
                question=render_conversation(prompt),
                format="short_form",
                criteria=tuple(criteria),
                reference=(ideal.get("ideal_completion") or "") if isinstance(ideal, dict) else "",
                metadata={
                    "prompt_id": pid,
                    "subset": path.stem,
                    "messages": prompt,
                    "example_tags": list(rec.get("example_tags") or []),
                },
            )
        )
    return items


def load_healthbench(data_dir: Path) -> list[EvalItem]:
    """HealthBench: every `*.jsonl` file of original-format records in the folder (sorted by name)."""
    folder = _require_dir(data_dir)
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise DatasetError(folder, "expected HealthBench *.jsonl files (prompt_id, prompt, rubrics) in the folder")
    items = [item for f in files for item in _healthbench_file(f)]
    return _check_unique(items, folder)


# ---------------------------------------------------------------------------------------------- DeepResearch Bench


def _drb_reference_file(folder: Path) -> Path:
    """The official `reference.jsonl` when present; otherwise the single shipped stand-in baseline articles file."""
    if (folder / "reference.jsonl").is_file():
        return folder / "reference.jsonl"
    found = sorted(folder.glob("*cleaned_articles.jsonl"))
    if len(found) == 1:
        return found[0]
    raise DatasetError(
        folder,
        "expected reference articles for RACE: reference.jsonl (official) or exactly one "
        f"*cleaned_articles.jsonl stand-in (found {len(found)})",
    )


def load_deep_research_bench(data_dir: Path) -> list[EvalItem]:
    """DeepResearch Bench: `query.jsonl`, `criteria.jsonl` and a reference-articles file joined by task id."""
    folder = _require_dir(data_dir)
    qpath, cpath = folder / "query.jsonl", folder / "criteria.jsonl"
    for p in (qpath, cpath):
        if not p.is_file():
            raise DatasetError(p, "file does not exist (DRB needs query.jsonl and criteria.jsonl)")
    rpath = _drb_reference_file(folder)
    criteria = {str(r.get("id")): r for r in _read_jsonl(cpath)}
    references = {str(r.get("id")): r for r in _read_jsonl(rpath)}
    items = []
    for n, q in enumerate(_read_jsonl(qpath), 1):
        tid = _text(q, ("id",), qpath, f"line {n}")
        prompt = _text(q, ("prompt",), qpath, f"line {n}")
        if tid not in criteria:
            raise DatasetError(cpath, f"expected criteria for task id {tid}")
        if tid not in references or not str(references[tid].get("article") or "").strip():
            raise DatasetError(rpath, f"expected a non-empty reference 'article' for task id {tid}")
        crit = criteria[tid]
        weights = crit.get("dimension_weight")
        per_dim = crit.get("criterions")
        if not isinstance(weights, dict) or not isinstance(per_dim, dict) or set(weights) != set(DRB_DIMENSIONS):
            raise DatasetError(cpath, f"task {tid}: expected dimension_weight and criterions over {DRB_DIMENSIONS}")
        items_c = []
        for dim in DRB_DIMENSIONS:
            entries = per_dim.get(dim)
            if not isinstance(entries, list) or not entries:
                raise DatasetError(cpath, f"task {tid}: expected a non-empty criterion list for {dim!r}")
            for c in entries:
                if (
                    not isinstance(c, dict)
                    or not isinstance(c.get("criterion"), str)
                    or not isinstance(c.get("weight"), int | float)
                ):
                    raise DatasetError(cpath, f"task {tid}, {dim}: expected {{criterion, explanation, weight}}")
                items_c.append(
                    Criterion(
                        text=c["criterion"],
                        weight=float(c["weight"]),
                        group=dim,
                        explanation=str(c.get("explanation") or ""),
                    )
                )
        items.append(
            EvalItem(
                id=tid,
                question=prompt,
                format="short_form",  # DR Tulu's evaluation convention for DRB (METHOD §12.1)
                criteria=tuple(items_c),
                reference=str(references[tid]["article"]),
                metadata={
                    "language": q.get("language", ""),
                    "topic": q.get("topic", ""),
                    "dimension_weight": {d: float(weights[d]) for d in DRB_DIMENSIONS},
                    "reference_source": rpath.name,
                },
            )
        )
    return _check_unique(items, qpath)


# ------------------------------------------------------------------------------------------------------ ScholarQA-CS

SQA_STATIC_WEIGHTS = ("length_weight", "expertise_weight", "citations_weight", "excerpts_weight")


def load_scholarqa_cs(data_dir: Path) -> list[EvalItem]:
    """ScholarQA-CS: `test_configs_snippets.json` (ScholarQABench rubric configs, one case per annotator)."""
    path = _first_existing(data_dir, ("test_configs_snippets.json",))
    data = _read_json(path)
    if not isinstance(data, list):
        raise DatasetError(path, "expected a JSON list of test cases")
    items = []
    for n, case in enumerate(data, 1):
        where = f"case {n}"
        if not isinstance(case, dict):
            raise DatasetError(path, f"{where}: expected an object")
        cid = _text(case, ("case_id",), path, where)
        question = _text(case, ("initial_prompt",), path, where)
        cfg = (case.get("metric_config") or {}).get("config") if isinstance(case.get("metric_config"), dict) else None
        if not isinstance(cfg, dict) or not isinstance(cfg.get("other_properties"), list):
            raise DatasetError(path, f"{where}: expected metric_config.config with other_properties")
        criteria = []
        for p in cfg["other_properties"]:
            if not isinstance(p, dict) or not isinstance(p.get("weight"), int | float) or not p.get("name"):
                raise DatasetError(path, f"{where}: expected each property to have name, criterion and weight")
            name = str(p["name"])
            criteria.append(
                Criterion(
                    text=str(p.get("criterion") or ""),
                    weight=float(p["weight"]),
                    name=name,
                    group="must_have" if name.startswith("most_important") else "nice_to_have",
                    evidence=tuple(str(e) for e in p.get("evidence") or ()),
                )
            )
        meta: dict[str, Any] = {
            "low_length": int(cfg.get("low_length", 300)),
            "high_length": int(cfg.get("high_length", 600)),
            **{k: float(cfg.get(k, 0.0)) for k in SQA_STATIC_WEIGHTS},
            "annotator": case.get("annotator", ""),
            "agreement": case.get("agreement"),
        }
        total = sum(meta[k] for k in SQA_STATIC_WEIGHTS) + sum(c.weight for c in criteria)
        if abs(total - 1.0) > 1e-6:
            raise DatasetError(path, f"{where}: expected the component weights to sum to 1, got {total:.4f}")
        if meta["high_length"] <= meta["low_length"]:
            raise DatasetError(path, f"{where}: expected high_length > low_length")
        items.append(EvalItem(id=cid, question=question, format="long_form", criteria=tuple(criteria), metadata=meta))
    return _check_unique(items, path)


# ------------------------------------------------------------------------------------------------ DeepRubric pairs


def load_rubric_pairs(data: Path) -> list[EvalItem]:
    """DeepRubric query-rubric pairs: a pairs.jsonl file, or a build folder holding one (`rubricem deeprubric build`).

    Each criterion keeps its type (`group`), id (`name`), weight in [-1, 1] and evidence; the item is asked long-form.
    """
    from learning.deeprubric.pairs import PairsFileError, load_pairs

    path = Path(data)
    if path.is_dir():
        path = path / "pairs.jsonl"
    if not path.is_file():
        raise DatasetError(path, "expected a DeepRubric pairs.jsonl (or a build folder holding one)")
    try:
        pairs = load_pairs(path)
    except PairsFileError as exc:
        raise DatasetError(path, f"expected one query-rubric pair per line: {exc}") from exc
    items = [
        EvalItem(id=p.id, question=p.question, format="long_form", reference=p.answer,
                 criteria=tuple(Criterion(text=c.description, weight=c.weight, group=c.type, name=c.id,
                                          evidence=c.evidence) for c in p.criteria))
        for p in pairs
    ]  # fmt: skip
    return _check_unique(items, path)


# --------------------------------------------------------------------------------------------------------- registry

BENCHMARKS: dict[str, BenchSpec] = {
    s.name: s
    for s in (
        BenchSpec("hotpotqa", "short_form", load_hotpotqa, False, "hotpotqa_train.json or hotpotqa_500.jsonl"),
        BenchSpec("musique", "short_form", load_musique, False, "musique_train.json or musique_500.jsonl"),
        BenchSpec("2wikimultihopqa", "short_form", _single_file_loader(("2wiki_500.jsonl",)), False, "2wiki_500.jsonl"),
        BenchSpec("bamboogle", "short_form", _single_file_loader(("bamboogle.jsonl",)), False, "bamboogle.jsonl"),
        BenchSpec(
            "simpleqa", "short_form", _single_file_loader(("simple_qa_test_set.csv",)), False, "simple_qa_test_set.csv"
        ),
        BenchSpec("frames", "short_form", load_frames, False, "frames_test_set.csv"),
        BenchSpec(
            "shortform", "short_form", load_shortform, False, "one .jsonl/.json/.csv with question and answer columns"
        ),
        BenchSpec("healthbench", "healthbench", load_healthbench, True, "HealthBench *.jsonl files"),
        BenchSpec(
            "deep_research_bench",
            "deep_research_bench",
            load_deep_research_bench,
            True,
            "query.jsonl, criteria.jsonl and reference.jsonl (or a *cleaned_articles.jsonl stand-in)",
        ),
        BenchSpec("scholarqa_cs", "scholarqa_cs", load_scholarqa_cs, True, "test_configs_snippets.json"),
        BenchSpec("rubric-pairs", "rubric_pairs", load_rubric_pairs, False,
                  "a DeepRubric pairs.jsonl (or its build folder); scored offline (approximate) without a judge"),
    )
}
ALIASES = {"rubric_pairs": "rubric-pairs", "2wiki": "2wikimultihopqa", "drb": "deep_research_bench", "sqa_cs": "scholarqa_cs"}


def bench_spec(bench: str) -> BenchSpec:
    """The spec of a benchmark by name (or alias).

    Raises:
        UnknownBenchmarkError: the name is not known (the message lists the known ones).
    """
    name = ALIASES.get(bench, bench)
    if name not in BENCHMARKS:
        raise UnknownBenchmarkError(f"unknown benchmark {bench!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def load_benchmark(bench: str, data_dir: Path, limit: int | None = None) -> list[EvalItem]:
    """Load a benchmark's items from `data_dir`, in file order, the first `limit` of them if given.

    Raises:
        UnknownBenchmarkError: unknown benchmark name.
        DatasetError: missing folder/file or a record of the wrong shape.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    items = bench_spec(bench).loader(Path(data_dir))
    return items[:limit] if limit is not None else items
