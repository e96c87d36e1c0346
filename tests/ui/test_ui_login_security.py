"""Issue 34, identity and login, attacked through the real login page (Streamlit's AppTest on app/ui/main.py, a real
SQLite store) and, for DNS rebinding, a real `rubricem ui` reached by Chromium under a foreign host name.

- The shared password is its own identity (`shared:user`), never `local`, the operator who owns the CLI's sessions.
- OIDC logins are keyed on issuer and subject: an unverified e-mail claim opens nobody's sessions and makes no admin.
- Failed logins are counted in the server process, per address and per name: a reload does not reset them.
- The open loopback UI answers only to a loopback Host header.

The pages after the login get the real session log, index and bank; the policy is never built (nobody asks a
question here), so these tests load no model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pydantic import SecretStr
from streamlit.testing.v1 import AppTest

from app.container import Services, open_bank, open_index
from app.service import ResearchService
from app.settings import Settings, UIConfig
from app.ui.auth import oidc_user_id
from store import PromptRecord, SessionLog, StoreConfig
from store.people import ScopedStore, Viewer
from store.registry import Registry
from store.errors import InvalidInput
from store.users import UserError, Users, hash_password
from tests.ui.test_ui_browser import CHROMIUM, running_ui

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "ui" / "main.py")
TIMEOUT = 120
SHARED = "shared-user-password"  # RUBRICEM_UI__PASSWORD in these tests (>= 12 characters)
ISSUER = "https://id.example.org"


@pytest.fixture
def light(tmp_path: Path, put_services: Callable[[Services, str | None], Services]) -> object:
    """Install services for the page built from `ui`: real store, index and bank; no policy (nothing is asked)."""

    def make(ui: UIConfig) -> Services:
        settings = Settings(store=StoreConfig(data_dir=tmp_path / "data"), ui=ui)
        settings.store.data_dir.mkdir(parents=True, exist_ok=True)
        log = SessionLog(settings.store.sqlite_path)
        bank = open_bank(settings)
        research = ResearchService(None, {}, log, settings.agent, bank)  # type: ignore[arg-type]
        svc = Services(settings, log, open_index(settings), {}, None,  # type: ignore[arg-type]
                       research, bank, Registry(log))
        return put_services(svc, ui.host)

    return make


def _session(log: SessionLog, question: str, owner: str, source: str = "cli") -> str:
    sid = log.create_session(question, PromptRecord("p", (1,), "s"), {}, "base", owner=owner, source=source)
    log.finish(sid, "completed", report=f"report on {question}")
    return sid


def _log_in(at: AppTest, name: str, password: str) -> AppTest:
    at.text_input[0].input(name)
    at.text_input[1].input(password)
    at.button[0].click().run()
    return at


def test_the_shared_password_is_not_the_operator(light: object) -> None:
    """Finding 1: the low-privilege shared password used to log in as `local`, the owner of every CLI, batch, eval
    and MCP session, with its consent and "Delete my data"."""
    svc: Services = light(UIConfig(password=SecretStr(SHARED)))  # type: ignore[operator]
    operator = _session(svc.log, "the operator's CLI question?", "local")
    at = _log_in(AppTest.from_file(MAIN, default_timeout=TIMEOUT).run(), "", SHARED)
    assert not at.exception, at.exception
    assert at.session_state["user_id"] == "shared:user" and at.session_state["role"] == "user"
    me = ScopedStore(svc.log, Viewer(at.session_state["user_id"]))
    assert operator not in [s.session_id for s in me.list_sessions()]
    assert Users(svc.log).get("shared:user").kind == "local"  # its consent lives on its own row

    # "Delete my data" as the shared user deletes nothing of the operator's.
    at.sidebar.checkbox(key="sure").check().run()
    at.sidebar.button(key="delete_mine").click().run()
    assert not at.exception, at.exception
    assert [s.session_id for s in svc.log.list_sessions()] == [operator]


def _oidc_page(claims: dict[str, object]) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.user = {"is_logged_in": True, **claims}
    return at.run()


def test_an_unverified_email_claim_opens_nobodys_sessions_and_makes_no_admin(light: object) -> None:
    """Finding 2: the OIDC identity was the e-mail claim even when the provider had not verified it, so whoever
    could set the victim's address at the provider got the victim's sessions (and admin, if the address was listed)."""
    svc: Services = light(UIConfig(oidc=True, admin_emails=["boss@example.org"]))  # type: ignore[operator]
    real = _oidc_page({"iss": ISSUER, "sub": "boss-subject", "email": "Boss@Example.org", "email_verified": True})
    assert not real.exception, real.exception
    boss = real.session_state["user_id"]
    assert real.session_state["role"] == "admin" and real.session_state["user_label"] == "boss@example.org"
    boss_session = _session(svc.log, "the boss's question?", boss, source="chat")
    legacy = _session(svc.log, "written before issue 34 under the e-mail?", "boss@example.org", source="chat")

    for verified in (False, "false", None):  # None: the provider sends no email_verified claim at all
        claims = {"iss": ISSUER, "sub": "mallory", "email": "boss@example.org"}
        if verified is not None:
            claims["email_verified"] = verified
        at = _oidc_page(claims)
        assert not at.exception, at.exception
        uid = at.session_state["user_id"]
        seen = [s.session_id for s in ScopedStore(svc.log, Viewer(uid)).list_sessions()]
        assert uid != boss and boss_session not in seen and legacy not in seen
        assert at.session_state["role"] == "user" and uid == oidc_user_id(ISSUER, "mallory")
    # The same subject at another provider is another person.
    other = _oidc_page({"iss": "https://evil.example", "sub": "boss-subject", "email": "boss@example.org",
                        "email_verified": True})
    assert other.session_state["user_id"] != boss
    assert boss == oidc_user_id(ISSUER, "boss-subject")  # keyed on issuer and subject


def test_an_oidc_login_never_lands_on_a_password_account(light: object) -> None:
    """Finding 2: password account names could contain '@', and an OIDC login with that address became the account
    (its sessions, its consent). New names with '@' are refused; an old one is never reached by a login."""
    svc: Services = light(UIConfig(oidc=True))  # type: ignore[operator]
    users = Users(svc.log)
    # An account named like an address before issue 34 (written directly, as the old code allowed).
    with svc.log.transaction(write=True) as conn:
        conn.execute("INSERT INTO users (user_id, kind, role, password_hash, consent, created_at) VALUES "
                     "('alice@example.org', 'password', 'admin', ?, NULL, 'x')", (hash_password("alice's pw"),))
    alice = _session(svc.log, "alice's question?", "alice@example.org", source="chat")
    at = _oidc_page({"iss": ISSUER, "sub": "x", "email": "alice@example.org", "email_verified": True})
    assert not at.exception, at.exception
    assert at.session_state["user_id"] != "alice@example.org"
    seen = ScopedStore(svc.log, Viewer(at.session_state["user_id"])).list_sessions()
    assert alice not in [s.session_id for s in seen]
    with pytest.raises(UserError, match="is a password account"):
        users.ensure("alice@example.org", kind="oidc", role="user")
    assert users.get("alice@example.org").kind == "password"
    with pytest.raises(InvalidInput, match="no '@'"):
        users.add("carol@example.org", password="carol's password")
    assert users.find("carol@example.org") is None


def test_failed_logins_survive_a_reload_and_lock_the_name(light: object) -> None:
    """Finding 6: the failure count lived in the browser session, so a reload (a new AppTest here) reset it."""
    svc: Services = light(UIConfig(password=SecretStr(SHARED)))  # type: ignore[operator]
    Users(svc.log).add("alice", password="alice's password")
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    for _ in range(5):
        _log_in(at, "alice", "a wrong guess")
        assert any("Wrong name or password" in e.value for e in at.error)
    reloaded = _log_in(AppTest.from_file(MAIN, default_timeout=TIMEOUT).run(), "alice", "alice's password")
    assert any("Too many failed logins" in e.value for e in reloaded.error)
    assert "user_id" not in reloaded.session_state  # refused before the password was checked: nothing changed


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
def test_dns_rebinding_reaches_no_open_ui(tmp_path: Path) -> None:
    """Finding 9: the open loopback UI made every visitor the local admin whatever Host they named, so a web page
    whose name re-resolves to 127.0.0.1 could drive it from the victim's browser. Chromium maps rebind.test to
    127.0.0.1 (as the attacker's DNS would) and opens the real `rubricem ui` under that name."""
    from playwright.sync_api import sync_playwright

    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
        "HF_HUB_OFFLINE": "1", "RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data")}
    with running_ui(tmp_path, env) as url:
        port = urlsplit(url).port
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--host-resolver-rules=MAP rebind.test 127.0.0.1"])
            try:
                page = browser.new_page()
                page.goto(f"http://rebind.test:{port}/")
                page.get_by_text("answers only to localhost").wait_for(timeout=60_000)
                assert page.get_by_test_id("stChatInputTextArea").count() == 0
                # The owner's own browser, under a loopback name, passes the gate (and starts loading the services).
                mine = browser.new_page()
                mine.goto(f"http://localhost:{port}/")
                mine.get_by_text("Loading the policy").wait_for(timeout=60_000)
                assert mine.get_by_text("answers only to localhost").count() == 0
            finally:
                browser.close()
