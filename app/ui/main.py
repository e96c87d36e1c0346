"""Streamlit entry script of `rubricem ui`: the login gate, then the research chat and the learning pages (and, for
admins, the teams page)."""

from __future__ import annotations

import streamlit as st

from app.ui import state
from app.ui.auth import (
    Identity,
    SHARED_ADMIN,
    SHARED_USER,
    LoginRefused,
    UIAccessError,
    access_policy,
    attempt_password_login,
    oidc_identity,
    open_ui_host_refusal,
    recheck,
)
from store.owner import LOCAL
from store.users import UserError


def _host() -> str:
    """The address this server is bound to, for the login rule.

    `rubricem ui` always passes --server.address. A plain `streamlit run` without it binds every interface, so an
    unset address counts as 0.0.0.0 (a login is required): the gate fails closed, never open.
    """
    try:
        bound = st.get_option("server.address")
    except Exception:  # noqa: BLE001 - old versions may not know the option
        bound = None
    return str(bound) if bound else "0.0.0.0"


def _login() -> bool:
    """True when the visitor may go on; otherwise draws the login form."""
    ui = state.settings().ui
    users = state.users()
    try:
        policy = access_policy(_host(), ui, accounts=state.has_accounts())
    except UIAccessError as exc:
        st.error(str(exc))
        return False
    if not policy.login_required:
        # Open to whoever reaches loopback: refuse a browser that reached it under another name (DNS rebinding).
        refusal = open_ui_host_refusal(dict(st.context.headers))
        if refusal is not None:
            st.error(refusal)
            return False
        _enter(Identity(LOCAL, policy.open_role or "admin", LOCAL))
        return True
    if st.session_state.get("role") and st.session_state.get("user_id"):
        # Every page load, and so every run start, re-checks the login (issue 46): an account removed or made a user,
        # an e-mail taken off the admin list, a shared password unset, take effect at the next click.
        claims = st.user.to_dict() if getattr(st.user, "is_logged_in", False) else None
        who = recheck(str(st.session_state.user_id), ui, policy, users, claims, st.session_state.get("login_key"))
        if who is not None:
            _enter(who)
            return True
        st.session_state.clear()  # nothing of the old login's chat stays for whoever logs in next
        st.warning("Your login is no longer valid here (the account was removed or changed): log in again.")
    if policy.oidc and getattr(st.user, "is_logged_in", False):
        try:
            who = oidc_identity(st.user.to_dict(), ui)
            users.ensure(who.user_id, kind="oidc", role=who.role)  # their consent setting lives on this row
        except (LoginRefused, UserError) as exc:
            st.error(str(exc))
            st.button("Log out", on_click=st.logout, key="oidc_refused_logout")
            return False
        _enter(who)
        return True
    st.title("🔬 rubricem")
    st.subheader("Log in")
    if policy.password:
        with st.form("login"):
            name = st.text_input("Name", help="Your account name" + (
                "; leave it empty for the shared password" if ui.password or ui.admin_password else ""))
            given = st.text_input("Password", type="password")
            if st.form_submit_button("Log in"):
                # Counted per address and per name in the server process (a reload does not reset it), and refused
                # before any password check while either is backing off.
                outcome = attempt_password_login(name, given, ui, users, state.limiter(), st.context.ip_address)
                who = outcome.identity
                if who is None:
                    st.error(outcome.message)
                else:
                    if who.user_id in (SHARED_USER, SHARED_ADMIN):  # its own identity, with its consent row
                        users.ensure(who.user_id, kind="local", role=who.role)
                    _enter(who)
                    st.rerun()
    if policy.oidc:
        st.button("Log in with your identity provider", on_click=st.login)
    return False


def _enter(who: Identity) -> None:
    """Keep only who this is, their role and their account's login key in the browser session (never a password):
    the key ties the session to the account as it was at login (issue 65), not to whoever has the name later."""
    st.session_state.user_id = who.user_id
    st.session_state.role = who.role
    st.session_state.login_key = who.login_key
    st.session_state.user_label = who.label or who.user_id


def _logout_box() -> None:
    role = st.session_state.get("role")
    st.sidebar.caption(f"Signed in as **{st.session_state.get('user_label') or st.session_state.get('user_id')}** "
                       f"({role})")
    if st.sidebar.button("Log out", key="logout") and role:
        st.session_state.clear()  # the next person on this browser sees nothing of this one's chat
        if getattr(st.user, "is_logged_in", False):
            st.logout()
        st.rerun()


def main() -> None:
    """Draw the app."""
    st.set_page_config(page_title="rubricem research", page_icon="🔬", layout="wide")
    if not _login():
        st.stop()
    from app.ui import chat_page, learning_page, teams_page  # after the gate: nothing loads before a login

    if access_policy(_host(), state.settings().ui, accounts=state.has_accounts()).login_required:
        _logout_box()
    pages = [
        st.Page(chat_page.page, title="Research", icon="🔬", url_path="research", default=True),
        st.Page(learning_page.page, title="Learning", icon="📈", url_path="learning"),
    ]
    if state.viewer().admin:  # teams decide whose sessions train which policy: admins only (the page checks too)
        pages.append(st.Page(teams_page.page, title="Teams", icon="👥", url_path="teams"))
    nav = st.navigation(pages)
    nav.run()


main()
