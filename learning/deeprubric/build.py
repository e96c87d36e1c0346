"""A DeepRubric build on disk: trees, then pairs with their audit, then statistics; resumable at every line.

Files in the build folder:
- `build.json`: the settings (mode, seed or topic, tree limits); a rerun with other settings is refused;
- `trees.jsonl`: one line per seed key — the whole tree (nodes with passages and statements) and its leaves;
- `pairs.jsonl`: one line per kept pair (KEEP, or REVISE with the revised content), in the JSONL shape the SFT
  questions loader reads (`learning/sft/questions.py`) plus `rubrics`, `selection_trace`, `merge_trace`, `leaves`,
  `mode` and the audit's findings;
- `audit.jsonl`: one line per tree key — KEEP / REVISE / DROP (with reason) or SKIP (no pair: reason);
- `stats.json`, `stats.md`: computed from the three JSONL files (written atomically at the end of each run).

Decisions where METHOD §11 is silent:
- A key is done when its line is in the file; a line cut by a crash is removed and redone (`read_lines`). A pair
  line is written before its audit line, so a crash between the two leaves a pair whose audit line is restored from
  the pair on the next run, never a second pair.
- Each pair's `hops` are its selected leaves' best statements with the passage each came from (query: the leaf's
  sub-query), so the evidence-chain SFT teacher can use the pairs as questions.
- In the LLM mode (`llm_components`, `learning/deeprubric/llm.py`) every tree, pair and audit line also carries
  `model`, and every tree and audit line carries `llm`: the requests, tokens, repairs, failures and drops of the
  LLM steps that made it (a snapshot of the components' `Ledger`), so the statistics sum them over the files and a
  resumed build counts each line once. `build.json` records the model, so a folder is never continued with another.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from learning.deeprubric.audit import Auditor, OfflineAuditor, validate_pair
from learning.deeprubric.corpus import SeedPage
from learning.deeprubric.llm import TEMPERATURE, Ledger, llm_steps
from learning.deeprubric.offline import OfflineExtractor, OfflineProposer, page_root
from learning.deeprubric.records import Mode, Pair, Tree, to_json, tree_from_json
from learning.deeprubric.stats import compute_stats, stats_markdown
from learning.deeprubric.synthesis import OfflineSynthesiser, Skip, Synthesiser
from learning.deeprubric.tree import (
    AlwaysExpand,
    Extractor,
    Gate,
    Proposer,
    Retriever,
    TreeConfig,
    build_tree,
    leaves,
    passage_of,
)
from learning.judge.types import JsonJudge
from learning.sft.generate import read_lines

TREES = "trees.jsonl"
PAIRS = "pairs.jsonl"
AUDIT = "audit.jsonl"
MANIFEST = "build.json"

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Components:
    """The steps that an LLM may replace, behind their small interfaces."""

    proposer: Proposer
    extractor: Extractor
    gate: Gate
    synthesiser: Synthesiser
    auditor: Auditor
    mode: Mode
    model: str = ""  # the LLM's name in the LLM mode
    ledger: Ledger | None = None  # what the LLM steps cost and dropped (LLM mode)


def offline_components() -> Components:
    """The deterministic offline pipeline."""
    return Components(OfflineProposer(), OfflineExtractor(), AlwaysExpand(), OfflineSynthesiser(), OfflineAuditor(),
                      "offline")


def llm_components(client: JsonJudge, temperature: float = TEMPERATURE, max_tokens: int | None = None,
                   statements_per_node: int = 6) -> Components:
    """The five steps written by the model behind `client` (a `JudgeClient`), sharing one ledger."""
    proposer, extractor, gate, synthesiser, auditor, ledger = llm_steps(client, temperature, max_tokens,
                                                                        statements_per_node)
    return Components(proposer, extractor, gate, synthesiser, auditor, "llm", client.model, ledger)


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """What a build folder is bound to (build.json)."""

    mode: Mode
    seed: int
    topic: str | None
    tree: TreeConfig = field(default_factory=TreeConfig)
    model: str = ""  # the LLM mode's model (absent from build.json in the offline mode)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tree"]["children"] = list(self.tree.children)
        if not self.model:
            del d["model"]
        return d


def check_folder(out: Path, settings: BuildSettings) -> None:
    """Refuse a folder that is a file, or that an earlier build with other settings wrote (ValueError)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a folder")
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            old = json.loads(manifest.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{manifest}: damaged ({exc.msg}); use another --out") from exc
        if old != settings.as_dict():
            raise ValueError(f"{out} was built with other settings ({old}); use another --out")


def settings_of(out: Path) -> BuildSettings:
    """The settings an existing build folder was made with (ValueError if it has none)."""
    try:
        d = json.loads((Path(out) / MANIFEST).read_text(encoding="utf-8"))
        tree = TreeConfig(**{**d["tree"], "children": tuple(d["tree"]["children"])})
        return BuildSettings(d["mode"], int(d["seed"]), d["topic"], tree, str(d.get("model", "")))
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{out}: no readable {MANIFEST} (run `rubricem deeprubric trees` first)") from exc


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def tree_record(tree: Tree) -> dict[str, Any]:
    """The trees.jsonl line of a tree."""
    return {"key": tree.key, "mode": tree.mode, "seed_title": tree.seed_title, "tree": to_json(tree),
            "leaves": [to_json(x) for x in leaves(tree)]}


def pair_record(pair: Pair, tree: Tree, decision: str, problems: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The pairs.jsonl line of a kept pair (SFT questions shape plus DeepRubric's fields)."""
    hops = []
    for leaf in pair.leaves:
        s = leaf.statements[0]
        passage = passage_of(tree, s.passage_id)
        hops.append({"query": leaf.path[-1], "title": s.title, "text": passage.text if passage else s.text,
                     "statement": s.text, "need": f"{leaf.facet} of {leaf.focus}"})
    d = to_json(pair)
    return {
        "id": pair.id, "question": pair.question, "answer": pair.answer, "format": "long_form",
        "source": "deeprubric", "kind": "deeprubric", "hops": hops, "mode": pair.mode, "tree_id": pair.tree_id,
        "key": pair.key, "root": pair.root, "selected_leaf_ids": d["selected_leaf_ids"], "rubrics": d["rubrics"],
        "selection_trace": d["selection_trace"], "merge_trace": d["merge_trace"], "leaves": d["leaves"],
        "audit": {"decision": decision, "problems": list(problems)},
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What a run did (this run only) and the build's statistics (the whole folder)."""

    trees_built: int
    trees_resumed: int
    pairs_audited: int
    stats: dict[str, Any]


async def build(
    out: Path,
    seeds: Sequence[tuple[str, SeedPage]],
    retriever_for: Callable[[str], Retriever],
    settings: BuildSettings,
    components: Components | None = None,
    say: Say = lambda _m: None,
    stages: Sequence[str] = ("trees", "pairs"),
) -> BuildResult:
    """Build (or resume) the trees of `seeds`, then the pairs of every tree in the folder, then the statistics."""
    components = components or offline_components()
    if (components.mode, components.model) != (settings.mode, settings.model):
        raise ValueError(f"the components ({components.mode} {components.model!r}) do not match the build settings "
                         f"({settings.mode} {settings.model!r})")
    out = Path(out)
    check_folder(out, settings)
    _take(components)  # start counting from zero
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / MANIFEST, json.dumps(settings.as_dict(), indent=2) + "\n")
    built = resumed = audited = 0
    if "trees" in stages:
        done = {r["key"] for r in read_lines(out / TREES)}
        for n, (key, page) in enumerate(seeds, 1):
            if key in done:
                resumed += 1
                continue
            tree = await build_tree(key, page_root(page.title, page.text), retriever_for(key), components.proposer,
                                    components.extractor, components.gate, settings.tree, components.mode)
            record = tree_record(tree) | _llm_fields(components)
            _append(out / TREES, record)
            done.add(key)
            built += 1
            say(f"tree {n}/{len(seeds)} {key} ({page.title}): {len(tree.nodes)} nodes, {len(record['leaves'])} "
                f"leaves")
    if "pairs" in stages:
        audited = await _pairs(out, components, say)
    stats = write_stats(out)
    return BuildResult(built, resumed, audited, stats)


async def _pairs(out: Path, components: Components, say: Say) -> int:
    trees = read_lines(out / TREES)
    audits = read_lines(out / AUDIT)
    pairs = read_lines(out / PAIRS)
    audited = {a["key"] for a in audits}
    for p in pairs:  # a crash between a pair line and its audit line: restore the audit line from the pair
        if p["key"] not in audited:
            _append(out / AUDIT, {"key": p["key"], "tree_id": p["tree_id"], "pair_id": p["id"],
                                  "decision": p["audit"]["decision"], "reason": "",
                                  "problems": p["audit"]["problems"], "mode": p["mode"]})
            audited.add(p["key"])
    n = 0
    for rec in trees:
        if rec["key"] in audited:
            continue
        tree = tree_from_json(rec["tree"])
        line: dict[str, Any] = {"key": tree.key, "tree_id": tree.id, "mode": components.mode}
        try:
            pair = await components.synthesiser.synthesise(tree, leaves(tree))
        except Skip as skip:
            line.update(decision="SKIP", reason=skip.reason, problems=[])
        else:
            verdict = await components.auditor.audit(pair)
            final = pair if verdict.decision == "KEEP" else verdict.revised
            problems = [asdict(p) for p in verdict.problems]
            line.update(pair_id=pair.id, decision=verdict.decision, reason=verdict.reason, problems=problems)
            if final is not None and validate_pair(final):  # never write a half-formed pair
                line.update(decision="DROP", reason="invalid")
                final = None
            if final is not None:
                _append(out / PAIRS, pair_record(final, tree, verdict.decision, problems)
                        | ({"model": components.model} if components.model else {}))
        line.update(_llm_fields(components))
        _append(out / AUDIT, line)
        n += 1
        say(f"pair {tree.key} ({tree.seed_title}): {line['decision']}{' ' + line['reason'] if line['reason'] else ''}")
    return n


def _take(components: Components) -> dict[str, Any] | None:
    return components.ledger.take() if components.ledger is not None else None


def _llm_fields(components: Components) -> dict[str, Any]:
    """`model` and the ledger snapshot for a tree or audit line (nothing in the offline mode)."""
    taken = _take(components)
    out: dict[str, Any] = {"model": components.model} if components.model else {}
    return out | ({"llm": taken} if taken is not None else {})


def write_stats(out: Path) -> dict[str, Any]:
    """Recompute the statistics from the folder's files and write stats.json and stats.md."""
    stats = compute_stats(read_lines(out / TREES), read_lines(out / AUDIT), read_lines(out / PAIRS))
    _write_atomic(out / "stats.json", json.dumps(stats, indent=2) + "\n")
    _write_atomic(out / "stats.md", stats_markdown(stats))
    return stats


__all__ = [
    "AUDIT",
    "MANIFEST",
    "PAIRS",
    "TREES",
    "BuildResult",
    "BuildSettings",
    "Components",
    "build",
    "check_folder",
    "llm_components",
    "offline_components",
    "pair_record",
    "settings_of",
    "tree_record",
    "write_stats",
]
