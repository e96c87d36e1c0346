"""Plan approval in a real browser against a real `rubricem ui` (issue 21): the run pauses after its plan, the form
in the stage view refuses an edit that removes every rubric item (the session stays paused), then applies an edit;
the session completes with the user's plan as a forced span and the decision stored with its owner."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.ui.test_ui_browser import ARGS, ARTIFACTS, CHROMIUM, QUESTION, RUN_TIMEOUT_MS, ui_server  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]


@pytest.mark.timeout(1800)  # as the other browser test: model load, corpus indexing and one session
def test_pause_refuse_an_empty_edit_then_apply_an_edit(ui_server: tuple[str, Path]) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    url, data = ui_server
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            box = page.get_by_test_id("stChatInputTextArea")
            box.wait_for(timeout=RUN_TIMEOUT_MS)
            box.fill(QUESTION)
            box.press("Enter")
            expect(page.get_by_text("The plan waits for your approval")).to_be_visible(timeout=RUN_TIMEOUT_MS)
            page.screenshot(path=str(ARTIFACTS / "approval-01-paused.png"), full_page=True)
            rubric = page.get_by_label("Rubric items (one a line: add, remove or reword)")
            rubric.fill("")
            page.get_by_role("button", name="Apply my edit").click()
            expect(page.get_by_text("an edit must keep at least one rubric item")).to_be_visible(timeout=60_000)
            with sqlite3.connect(data / "rubricem.sqlite3") as db:
                assert db.execute("SELECT state FROM session_runs").fetchall() == [("awaiting_approval",)]
            rubric.fill("Says what the film is about\nNames the studio that made it")
            page.get_by_label("A note to the research plan (optional)").fill("Look for the studio.")
            page.get_by_role("button", name="Apply my edit").click()
            expect(page.get_by_role("button", name="⬇ Markdown")).to_have_count(1, timeout=RUN_TIMEOUT_MS)
            page.screenshot(path=str(ARTIFACTS / "approval-02-done.png"), full_page=True)
        finally:
            browser.close()
    with sqlite3.connect(data / "rubricem.sqlite3") as db:
        (sid, status), = db.execute("SELECT session_id, status FROM sessions").fetchall()
        action, owner, approved = db.execute("SELECT action, owner, approved_json FROM plan_approvals").fetchone()
        forced = [r[0] for r in db.execute(
            "SELECT text FROM turns WHERE session_id = ? AND stage = 'plan' AND kind = 'forced'", (sid,))]
    assert status == "completed" and (action, owner) == ("edit", "local")
    assert json.loads(approved) == {"rubric": ["Says what the film is about", "Names the studio that made it"],
                                    "note": "Look for the studio."}
    assert any(t.startswith("\n<approved_plan>") and "- Names the studio that made it" in t for t in forced)
