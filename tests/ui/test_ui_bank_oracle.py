"""Issue 65, findings 1 and 3, through the chat: replaying the oracle "did someone ask Q?" on "Reflections used".

Real parts: the research service runs each question with a scripted policy over the real local index and the app's
real shared bank (embedded Chroma, owners from the real SQLite session log); the page is the real chat
(app/ui/main.py through Streamlit's AppTest), signed in as the person who asked, opening each session from the
history. Bob (the victim) asked VICTIM_Q; the attacker asks it exactly, paraphrased (cosine about 0.95, under the
bank's 0.97 "same question"), and a wrong guess. Everything the page shows of the bank must be the same whether or
not bob asked, and, for someone with no reflections of their own, the same for all three guesses. Before, the list
named bob's item by id for the paraphrase and the caption counted everyone's items.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from markdown_it import MarkdownIt
from pydantic import SecretStr
from streamlit.testing.v1 import AppTest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from app.container import Services, open_bank, open_index
from app.service import ResearchService
from app.settings import Settings, UIConfig
from store.config import StoreConfig
from store.owner import acting_as
from store.records import BankItem, PromptRecord
from store.registry import Registry
from store.session_log import SessionLog
from store.users import Users
from tests.agent.scripts import well_formed
from tests.fakes import ScriptedPolicy

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "ui" / "main.py")
TIMEOUT = 120
SHARED = "shared-user-password"
OPTIONS = RunOptions(format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=300,
                     token_caps=StageTokenCaps(plan=40, research=24, review=24, answer=40), context_tokens=8192)
VICTIM_Q = "Which river flows past the town where the poet Ingrid Vasquez grew up?"
GUESSES = {
    "exact": VICTIM_Q,
    "paraphrase": "The poet Ingrid Vasquez grew up in a town on which river?",  # MiniLM cosine 0.955 to VICTIM_Q
    "wrong": "How do glaciers carve a valley?",
}
ALICE_OWN_Q = "What prizes did the poet Ingrid Vasquez win?"  # about 0.8 to the first two guesses
CAROL_QS = ("Who was the poet Ingrid Vasquez?", "Which rivers flow through Paris?",
            "How do you bake sourdough bread at home?")
PASSWORDS = {"alice": "alice-bank-oracle-passphrase-7", "dave": "dave-bank-oracle-passphrase-9"}


@dataclass
class World:
    svc: Services
    bob_item: BankItem | None
    alice_item: BankItem


def _item(question: str, owner: str, sid: str, n: int) -> BankItem:
    """A reflection with the same id in every world (`bank-<owner>-<n>`), so the worlds' pages can be compared."""
    item = BankItem.new(question=question, rubrics=f"RUBRIC-{owner}", takeaways=f"TAKEAWAY-{owner}", score=0.8,
                        judge_model="judge", policy_version="base", session_id=sid)
    return replace(item, id=f"bank-{owner}-{n}")


def _world(folder: Path, local_tools: dict, bob_asked: bool) -> World:  # type: ignore[type-arg]
    """A deployment: carol's reflections, alice's one own reflection and, when `bob_asked`, bob's on VICTIM_Q."""
    settings = Settings(store=StoreConfig(data_dir=folder / "data"), ui=UIConfig(password=SecretStr(SHARED)))
    settings.store.data_dir.mkdir(parents=True, exist_ok=True)
    log = SessionLog(settings.store.sqlite_path)
    users = Users(log)
    for name, password in PASSWORDS.items():
        users.add(name, password=password)
    bank = open_bank(settings, log=log)

    def reflect(question: str, owner: str, n: int = 0) -> BankItem:
        sid = log.create_session(question, PromptRecord("p", (1,), "s"), {}, "base", owner=owner, source="chat")
        log.finish(sid, "completed", report=f"{owner}'s report")
        item = _item(question, owner, sid, n)
        bank.put(item)
        return item

    for n, q in enumerate(CAROL_QS):
        reflect(q, "carol", n)
    alice_item = reflect(ALICE_OWN_Q, "alice")
    bob_item = reflect(VICTIM_Q, "bob") if bob_asked else None
    research = ResearchService(ScriptedPolicy(well_formed()), local_tools, log, AgentConfig(), bank)  # type: ignore[arg-type]
    svc = Services(settings, log, open_index(settings), local_tools, None,  # type: ignore[arg-type]
                   research, bank, Registry(log))
    return World(svc, bob_item, alice_item)


def _ask(world: World, person: str, question: str) -> str:
    with acting_as(person):
        return asyncio.run(world.svc.research.run(question, OPTIONS, lambda _e: None, source="chat")).session_id


def _texts(at: AppTest) -> list[str]:
    """Everything the page renders as Markdown or text (what a browser would be sent)."""
    out: list[str] = []
    for group in (at.markdown, at.caption, at.warning, at.info, at.error, at.success, at.text):
        out += [str(e.value) for e in group]
    return out + [str(e.label) for e in at.expander]


def _plain(text: str) -> str:
    """Markdown text less its backslash escapes (how it reads on the page)."""
    return text.replace("\\", "")


def _bank_shown(at: AppTest) -> tuple[list[str], list[str]]:
    """(the bank caption, the lines of "Reflections used") of the session on the page."""
    captions = [str(c.value) for c in at.caption if str(c.value).startswith("📚")]
    used = [str(m.value) for e in at.expander if e.label == "Reflections used" for m in e.markdown]
    return captions, used


def _pages(person: str, sids: dict[str, str]) -> dict[str, tuple[list[str], list[str], list[str]]]:
    """Per guess: what the chat shows `person` of that session's bank use, and all of the page's text."""
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    at.text_input[0].input(person)
    at.text_input[1].input(PASSWORDS[person])
    at.button[0].click().run()
    assert at.session_state["user_id"] == person and not at.exception, at.exception
    out = {}
    for guess, sid in sids.items():
        at.sidebar.button(key=f"hist_{sid}").click().run()
        assert not at.exception, at.exception
        captions, used = _bank_shown(at)
        out[guess] = (captions, used, _texts(at))
    return out


def test_replaying_the_oracle_in_the_chat_tells_nothing_of_someone_elses_question(
        local_tools: dict, tmp_path: Path,  # type: ignore[type-arg]
        put_services: Callable[[Services, str | None], Services]) -> None:
    shown: dict[str, dict[str, tuple[list[str], list[str], list[str]]]] = {}
    for name, bob_asked in (("asked", True), ("not-asked", False)):
        world = _world(tmp_path / name, local_tools, bob_asked)
        put_services(world.svc, world.svc.settings.ui.host)
        alice = {g: _ask(world, "alice", q) for g, q in GUESSES.items()}
        shown[name] = _pages("alice", alice)
        if bob_asked:
            assert world.bob_item is not None
            # The attacker with no reflections of her own: the three guesses look alike.
            dave = _pages("dave", {g: _ask(world, "dave", q) for g, q in GUESSES.items()})
            assert dave["exact"][:2] == dave["paraphrase"][:2] == dave["wrong"][:2], dave
            assert dave["exact"][1] == [] and "None of your own" in dave["exact"][0][0]
            log = world.svc.log
            for sid in alice.values():
                prompt = log.get(sid).trajectory.prompt.text
                # bob's reflection may reach the prompt as strategy text, never with its question or its id
                assert "grew up" not in prompt.split("<reference_examples>")[-1].split("</reference_examples>")[0]
                assert world.bob_item.id not in prompt
            for captions, used, texts in [*shown[name].values(), *dave.values()]:
                assert not any(world.bob_item.id in _plain(t) for t in texts)
                assert not any("river" in t.lower() for t in captions + used)
            # alice's own reflection is named, with her own question, on the guesses near it
            assert any(world.alice_item.id in _plain(line) and "prizes" in line
                       for line in shown[name]["paraphrase"][1]), \
                shown[name]["paraphrase"][:2]
    for guess in GUESSES:  # whether or not bob asked, alice is shown the same of the bank
        assert shown["asked"][guess][:2] == shown["not-asked"][guess][:2], (guess, shown["asked"][guess][:2],
                                                                             shown["not-asked"][guess][:2])


def test_an_own_reflections_hostile_question_is_shown_escaped_and_short(
        local_tools: dict, tmp_path: Path,  # type: ignore[type-arg]
        put_services: Callable[[Services, str | None], Services]) -> None:
    """The list names the viewer's own items by their question, text the person once typed (or pasted): it stays
    literal and one bounded line, whatever markup or length it holds."""
    world = _world(tmp_path, local_tools, bob_asked=False)
    put_services(world.svc, world.svc.settings.ui.host)
    hostile = ("What prizes did the poet Ingrid Vasquez win? <img src=x onerror=alert(1)> "
               "![leak](https://attacker.example/p.png) [click](javascript:alert(1)) " + "Which prizes did she win? " * 60)
    log, bank = world.svc.log, world.svc.bank
    sid = log.create_session(hostile, PromptRecord("p", (1,), "s"), {}, "base", owner="alice", source="chat")
    log.finish(sid, "completed", report="r")
    mine = _item(hostile, "alice", sid, 1)
    bank.put(mine)
    asked = _ask(world, "alice", "Which awards did the poet Ingrid Vasquez receive?")
    page = _pages("alice", {"q": asked})["q"]
    lines = [line for line in page[1] if mine.id in _plain(line)]
    assert len(lines) == 1, page[1]
    line = lines[0]
    assert len(line) < 600 and "…" in line and "\n" not in line
    tokens = MarkdownIt("commonmark").parseInline(line)
    kinds = {c.type for t in tokens for c in (t.children or [])}
    assert not kinds & {"image", "link_open", "html_inline"}, kinds
    assert "https://" not in line and "\\<img" in line  # the markup is there, escaped: literal on the page
