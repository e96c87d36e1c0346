"""Plan approval (issue 21): what a paused plan shows the user, what the user may answer, and the forced span an
edit puts into the token sequence.

The user sees the plan's deep analysis, rubric items and research plan, and answers accept, edit (rubric items
added, removed or reworded, and a note to the research plan) or reject. An edit enters the trajectory as a FORCED
turn after the policy's own `</structured_plan>` (no gradient, like the graph's forced tags): the policy's plan stays
in the sequence as it sampled it, and the research that follows reads the user's plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from store.records import Turn

Action = Literal["accept", "edit", "reject"]
ACTIONS: tuple[str, ...] = ("accept", "edit", "reject")
MAX_ITEMS = 20
MAX_ITEM_CHARS = 500
MAX_NOTE_CHARS = 2000
_BULLET = re.compile(r"(?:^|\s)(?:[-*\u2022]|\d+[.)])\s+")


class ApprovalError(ValueError):
    """An approval answer that cannot be applied; the session stays paused."""


def _block(text: str, *names: str) -> str:
    for name in names:
        # An unclosed block (the plan hit its token cap) ends at the next tag.
        m = re.search(rf"<{name}\b[^>]*>(.*?)(?:</{name}\s*>|(?=</?[A-Za-z_]+>)|$)", text, re.IGNORECASE | re.DOTALL)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return ""


def rubric_items(rubric: str) -> list[str]:
    """Checklist items of a `<rubric>` body: one per bullet or line; headings ("Knowledge Checklist:") dropped."""
    items: list[str] = []
    for line in rubric.splitlines():
        for part in _BULLET.split(line):
            part = part.strip()
            if part and not part.endswith(":"):
                items.append(part)
    return items


@dataclass(frozen=True, slots=True)
class PlanForApproval:
    """What the paused session exposes: the policy's plan, read from its plan-stage turns."""

    plan_text: str
    deep_analysis: str
    rubric: tuple[str, ...]
    research_plan: str

    @classmethod
    def from_turns(cls, turns: Sequence[Turn]) -> PlanForApproval:
        text = "".join(t.text for t in turns if t.stage == "plan")
        return cls(
            plan_text=text,
            deep_analysis=_block(text, "deep_analysis", "analysis"),
            rubric=tuple(rubric_items(_block(text, "rubric", "rubrics"))),
            research_plan=_block(text, "research_plan"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"plan_text": self.plan_text, "deep_analysis": self.deep_analysis, "rubric": list(self.rubric),
                "research_plan": self.research_plan}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanForApproval:
        return cls(str(data.get("plan_text", "")), str(data.get("deep_analysis", "")),
                   tuple(str(r) for r in data.get("rubric", ())), str(data.get("research_plan", "")))


@dataclass(frozen=True, slots=True)
class PlanDecision:
    """The user's answer. `rubric` is the whole edited list (items added, removed, reworded); `note` goes to the
    research plan."""

    action: Action
    rubric: tuple[str, ...] = ()
    note: str = ""
    owner: str = "local"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The `Command(resume=...)` value (plain data, so the checkpoint stores it as is)."""
        return {"action": self.action, "rubric": list(self.rubric), "note": self.note, "owner": self.owner}

    @classmethod
    def parse(cls, data: object) -> PlanDecision:
        """Check an answer; raises ApprovalError with a message for the user (the session stays paused)."""
        if not isinstance(data, Mapping):
            raise ApprovalError("the answer must be accept, edit or reject")
        action = data.get("action")
        if action not in ACTIONS:
            raise ApprovalError(f"unknown action {action!r}: use accept, edit or reject")
        owner = str(data.get("owner") or "local")
        if action != "edit":
            return cls(action, owner=owner)
        raw = data.get("rubric")
        if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
            raise ApprovalError("an edit gives the rubric as a list of items")
        items = tuple(" ".join(str(r).split()) for r in raw if str(r).strip())
        note = str(data.get("note") or "").strip()
        if not items:
            raise ApprovalError("an edit must keep at least one rubric item (to stop the session, reject the plan)")
        if len(items) > MAX_ITEMS:
            raise ApprovalError(f"at most {MAX_ITEMS} rubric items, got {len(items)}")
        if any(len(i) > MAX_ITEM_CHARS for i in items):
            raise ApprovalError(f"a rubric item is longer than {MAX_ITEM_CHARS} characters")
        if len(note) > MAX_NOTE_CHARS:
            raise ApprovalError(f"the note is longer than {MAX_NOTE_CHARS} characters")
        if any("<" in x or ">" in x for x in (*items, note)):
            raise ApprovalError("rubric items and the note cannot contain < or > (they are placed inside tags)")
        return cls("edit", items, note, owner)


def approved_plan_text(decision: PlanDecision) -> str:
    """The forced span an edit inserts after the policy's `</structured_plan>`."""
    rubric = "\n".join(f"- {item}" for item in decision.rubric)
    note = f"\n<research_plan>{decision.note}</research_plan>" if decision.note else ""
    return f"\n<approved_plan>\n<rubric>\n{rubric}\n</rubric>{note}\n</approved_plan>\n"
