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

import contextlib
import os
import re
import socket
import threading
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



class ForgingForwarder:
    """A local TCP forwarder (what `ssh -L` or socat is) run by the attacker: every connection it forwards gets an
    `X-Forwarded-For` header naming a new made-up address (203.0.113.1, .2, ...), added after its request line."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.count = target_port, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            self.count += 1
            threading.Thread(target=self._serve, args=(client, f"203.0.113.{self.count}"), daemon=True).start()

    def _serve(self, client: socket.socket, forged: str) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        head = b""
        while b"\r\n" not in head and (chunk := client.recv(65536)):
            head += chunk
        line, _, rest = head.partition(b"\r\n")
        upstream.sendall(line + f"\r\nX-Forwarded-For: {forged}\r\n".encode() + rest)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)

    def close(self) -> None:
        self.server.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _login_answers(url: str, guesses: int) -> list[str]:
    """Guesses at the login form of the UI at `url`, each from a new browser session (a new page, so a new
    Streamlit session) and a new account name, so only the per-address count can stop them. The pages are loaded
    and filled first, then sent one after another, each as soon as the previous one is answered (well inside the
    first 2 s back-off). Returns what the page answered to each."""
    from playwright.sync_api import sync_playwright

    answer = re.compile("Wrong name or password|Too many failed logins|checking many logins")
    out: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
        try:
            pages = []
            for i in range(guesses):
                page = browser.new_context().new_page()
                page.goto(url)
                page.get_by_label("Name", exact=True).fill(f"sprayed-{i}")
                page.get_by_label("Password", exact=True).fill("a guessed password")
                pages.append(page)
            for page in pages:
                page.get_by_role("button", name="Log in").click()
                shown = page.get_by_text(answer).first
                shown.wait_for(timeout=60_000)
                out.append(shown.inner_text())
        finally:
            browser.close()
    return out


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
def test_a_forged_forwarded_address_gets_no_fresh_login_count(tmp_path: Path) -> None:
    """Issue 46, item 3: Streamlit's uvicorn took X-Forwarded-For from any loopback peer as the client address, so
    through a local forwarder every guess could claim a new address and the per-address limit never began. The real
    `rubricem ui` (a shared password, 3 free attempts, no bcrypt budget in the way) gets 6 guesses through a
    forwarder that forges a new address for each connection: at most 3 passwords may be checked before the address
    is told to wait. With the forwarder named in RUBRICEM_UI__TRUSTED_PROXIES, each forwarded address counts as its
    own client again."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
        "HF_HUB_OFFLINE": "1", "RUBRICEM_UI__PASSWORD": SHARED, "RUBRICEM_UI__LOGIN_FREE_ATTEMPTS": "3",
        "RUBRICEM_UI__LOGIN_CHECKS_PER_S": "1000"}

    def through_forwarder(folder: Path, env: dict[str, str], guesses: int) -> list[str]:
        folder.mkdir(exist_ok=True)
        with running_ui(folder, env | {"RUBRICEM_STORE__DATA_DIR": str(folder / "data")}) as url:
            forwarder = ForgingForwarder(urlsplit(url).port or 0)
            try:
                return _login_answers(f"http://127.0.0.1:{forwarder.port}/", guesses)
            finally:
                forwarder.close()

    forged = through_forwarder(tmp_path / "peer", base, 6)
    checked = [a for a in forged if "Wrong name or password" in a]
    # The old server checked all 6, each forged address with a fresh count.
    assert forged[:3] == ["Wrong name or password."] * 3 and len(checked) < 6, forged
    assert any("Too many failed logins from your address" in a for a in forged[3:]), forged

    trusted = base | {"RUBRICEM_UI__TRUSTED_PROXIES": '["127.0.0.1"]'}
    proxied = through_forwarder(tmp_path / "trusted", trusted, 4)
    assert proxied == ["Wrong name or password."] * 4, proxied  # four clients, one guess each
