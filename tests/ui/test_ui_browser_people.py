"""Two people and an admin in a real browser against a real `rubricem ui` (Debian's Chromium via Playwright, the
embedded default on 127.0.0.1, SQLite): named accounts make the loopback UI ask who you are; each person's history
shows only their own sessions; opening someone else's session URL reads "Session not found." exactly like a made-up
id; the admin sees everyone's. Screenshots go to test-artifacts/ui/people-*.png."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import PromptRecord, SessionLog
from store.users import Users
from tests.ui.test_ui_browser import ARGS, ARTIFACTS, CHROMIUM, RUN_TIMEOUT_MS, ui_server  # noqa: F401 - fixture

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]

ALICE_Q = "What is ALICE-ONLY-QUESTION about?"
BOB_Q = "What is BOB-ONLY-QUESTION about?"


@pytest.fixture
def people(tmp_path: Path) -> dict[str, str]:
    """Accounts and one finished chat session each, written before the UI starts (in the data dir it will use)."""
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    with SessionLog(data / "rubricem.sqlite3") as log:
        users = Users(log)
        users.add("alice", password="alice password")
        users.add("bob", password="bob password")
        users.add("root", password="root password", role="admin")
        out = {}
        for who, question in (("alice", ALICE_Q), ("bob", BOB_Q)):
            sid = log.create_session(question, PromptRecord("p", (1,), "s"), {}, "base", owner=who, source="chat")
            log.finish(sid, "completed", report=f"An answer for {who}.")
            out[who] = sid
    return out


def test_two_people_see_only_their_own_history_and_the_admin_sees_both(
        people: dict[str, str], ui_server: tuple[str, Path]) -> None:  # noqa: F811 - the imported fixture
    from playwright.sync_api import expect, sync_playwright

    url, _data = ui_server
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            def log_in(name: str, password: str, path: str = "") -> object:
                page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                page.goto(url + path)
                page.get_by_label("Name", exact=True).fill(name)
                page.get_by_label("Password", exact=True).fill(password)
                page.get_by_role("button", name="Log in").click()
                page.get_by_test_id("stChatInputTextArea").wait_for(timeout=RUN_TIMEOUT_MS)  # services load once
                return page

            sidebar = "[data-testid='stSidebar']"
            alice = log_in("alice", "alice password")
            expect(alice.locator(sidebar).get_by_text("ALICE-ONLY-QUESTION").first).to_be_visible(timeout=60_000)
            expect(alice.locator(sidebar).get_by_text("BOB-ONLY-QUESTION")).to_have_count(0)
            alice.screenshot(path=str(ARTIFACTS / "people-1-alice.png"), full_page=True)

            bob = log_in("bob", "bob password")
            expect(bob.locator(sidebar).get_by_text("BOB-ONLY-QUESTION").first).to_be_visible(timeout=60_000)
            expect(bob.locator(sidebar).get_by_text("ALICE-ONLY-QUESTION")).to_have_count(0)
            # Bob opens alice's session by URL: refused with the words a made-up id gets, and nothing of hers shows.
            bob.goto(f"{url}/?session={people['alice']}")
            bob.get_by_label("Name", exact=True).fill("bob")  # a new page load is a new browser session: log in again
            bob.get_by_label("Password", exact=True).fill("bob password")
            bob.get_by_role("button", name="Log in").click()
            expect(bob.get_by_text("Session not found.").first).to_be_visible(timeout=RUN_TIMEOUT_MS)
            expect(bob.get_by_text("ALICE-ONLY-QUESTION")).to_have_count(0)
            expect(bob.get_by_text(people["alice"])).to_have_count(0)
            bob.screenshot(path=str(ARTIFACTS / "people-2-bob-refused.png"), full_page=True)
            made_up = log_in("bob", "bob password", path="/?session=" + "0" * 32)
            expect(made_up.get_by_text("Session not found.").first).to_be_visible(timeout=60_000)
            # ... while his own session's URL opens it.
            own = log_in("bob", "bob password", path=f"/?session={people['bob']}")
            expect(own.get_by_text(people["bob"]).first).to_be_visible(timeout=60_000)  # the session's caption
            expect(own.get_by_text("BOB-ONLY-QUESTION").first).to_be_visible()

            wrong = browser.new_context().new_page()
            wrong.goto(url)
            wrong.get_by_label("Name", exact=True).fill("alice")
            wrong.get_by_label("Password", exact=True).fill("bob password")
            wrong.get_by_role("button", name="Log in").click()
            expect(wrong.get_by_text("Wrong name or password.")).to_be_visible(timeout=30_000)

            root = log_in("root", "root password")
            expect(root.locator(sidebar).get_by_text("ALICE-ONLY-QUESTION").first).to_be_visible(timeout=60_000)
            expect(root.locator(sidebar).get_by_text("BOB-ONLY-QUESTION").first).to_be_visible()
            root.goto(f"{url}/?session={people['alice']}")
            root.get_by_label("Name", exact=True).fill("root")
            root.get_by_label("Password", exact=True).fill("root password")
            root.get_by_role("button", name="Log in").click()
            expect(root.get_by_text(people["alice"]).first).to_be_visible(timeout=60_000)
            root.screenshot(path=str(ARTIFACTS / "people-3-admin.png"), full_page=True)
        finally:
            browser.close()
