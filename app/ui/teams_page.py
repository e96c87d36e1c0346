"""The Teams page (issue 49), for admins only: which team each person is in decides which policy learns from their
sessions and whose research the reflections written from them guide, so creating and removing teams, moving people
and letting a team share (its sessions then also train the global policy, and their reflections guide everyone's
research) are admin decisions, the same ones `rubricem users team ...` makes from the command line.

A non-admin who reaches the page (the navigation lists it only for admins) sees a caption and nothing of the teams:
who is in which team is other people's business. Every change re-draws the page (`st.rerun`), so the table always
shows what the store holds; a refusal (a bad name, a team with sessions still running) is shown as the store worded
it, escaped like any other text on the page.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.ui import state
from app.ui.view import md_literal
from store.errors import InvalidInput
from store.registry import Registry
from store.teams import TeamError, Teams
from store.users import UserError

_NOTICE = "teams_notice"  # the last change's confirmation, shown after the re-draw that follows it

# What a team's sharing (`teams.share_global`) does, as the store applies it: the global cycle's window and the rubric
# bank (`store.people.SessionOwners.unshared_with`) both take a team's session only if the team shared when the session
# was asked and still shares. `rubricem users team share` says the same.
SHARE_LABEL = "Share: its sessions also train the global policy and their reflections guide everyone's research"
SHARE_HELP = ("On: the sessions its people ask from then on also train the global policy, and the reflections "
              "written from them also guide the research of people outside the team (as strategy text, never their "
              "questions). Sessions asked before it shared stay the team's own. Off, at once: none of its sessions "
              "trains the global policy, and their reflections guide only the team's own members.")


def _done(message: str) -> None:
    """Remember what changed and draw the page again, so the table and widgets read the store as it is now."""
    st.session_state[_NOTICE] = message
    st.rerun()


def _table(teams: Teams) -> list[str]:
    """The teams table (name, members, share, the version its people are served); returns the team names."""
    records = teams.list()
    if not records:
        st.caption("No teams yet: everyone is served the global policy, and every consenting session trains it.")
        return []
    global_live = Registry(state.people_log()).live().name
    st.dataframe(pd.DataFrame([{
        "team": t.name, "members": ", ".join(t.members), "people": len(t.members),
        "shares with global": "on" if t.share_global else "off",
        "live version": t.live_version or f"global ({global_live})", "created": t.created_at[:19]}
        for t in records]), hide_index=True)
    return [t.name for t in records]


def _create(teams: Teams) -> None:
    st.subheader("Create a team")
    name = st.text_input("Team name", key="team_new_name", max_chars=40,
                         help="a-z, 0-9, - and _ (it becomes part of version names, e.g. team:law@1)")
    share = st.checkbox(SHARE_LABEL, key="team_new_share", help=SHARE_HELP)
    if st.button("Create team", key="team_create", disabled=not name):
        try:
            record = teams.add(name.strip(), share_global=share)
        except (InvalidInput, TeamError) as exc:  # a bad or taken name: nothing was written
            st.error(md_literal(str(exc)))
            return
        _done(f"Created team {record.name}; it is served the global policy until a version of its own is promoted.")


def _members(teams: Teams, names: list[str]) -> None:
    st.subheader("People")
    people = [u.user_id for u in state.users().list()]
    if not people:
        st.caption("Nobody has an account or has logged in yet.")
        return
    person = st.selectbox("Person", people, key="team_person")
    now = teams.team_of(person)
    st.caption(md_literal(f"{person} is in team {now}." if now else f"{person} is in no team (the global policy)."))
    target = st.selectbox("Team", names, key="team_assign_to")
    cols = st.columns(2)
    try:
        if cols[0].button("Assign to the team", key="team_assign", disabled=target is None or target == now):
            teams.assign(person, str(target))
            _done(f"{person} is in team {target}: their next sessions use its policy (past ones keep their team).")
        if cols[1].button("Take out of their team", key="team_unassign", disabled=now is None):
            teams.unassign(person)
            _done(f"{person} is in no team: their next sessions use the global policy.")
    except (InvalidInput, UserError, TeamError) as exc:  # removed meanwhile (by the CLI, another admin)
        st.error(md_literal(str(exc)))


def _manage(teams: Teams, names: list[str]) -> None:
    st.subheader("Manage a team")
    picked = st.selectbox("Team to manage", names, key="team_pick")
    if picked is None:
        return
    try:
        record = teams.get(picked)
        share = st.toggle(SHARE_LABEL, value=record.share_global, key=f"team_share_{record.name}", help=SHARE_HELP)
        if share != record.share_global:
            teams.set_share(record.name, share)
            _done(f"Team {record.name} shares: from now on its sessions also train the global policy and their "
                  "reflections also guide the research of people outside the team; earlier sessions stay its own."
                  if share else
                  f"Team {record.name} no longer shares: none of its sessions trains the global policy, and their "
                  "reflections guide only its own members.")
        if st.button("Remove team", key="team_remove",
                     help="Its members go back to the global policy; its versions and past sessions stay."):
            teams.remove(record.name)
            _done(f"Removed team {record.name}; its {len(record.members)} member(s) are back on the global policy.")
    except (InvalidInput, TeamError) as exc:  # sessions still running, or removed meanwhile: nothing changed
        st.error(md_literal(str(exc)))


def page() -> None:
    """The Teams page: the table for admins, then creating teams, moving people and managing one team."""
    st.title("👥 Teams")
    if not state.viewer().admin:
        st.caption("Teams are managed by admins.")
        return
    notice = st.session_state.pop(_NOTICE, None)
    if notice:
        st.success(md_literal(str(notice)))
    st.caption("Each team's policy learns only from its own people's consenting sessions, and the reflections "
               "written from them guide only its own people. A team that shares also lets the sessions it asks from "
               "then on train the global policy and guide everyone's research (as strategy text, never their "
               "questions). Promoting or rolling back a team's version is done with `rubricem promote` and "
               "`rubricem rollback`.")
    teams = Teams(state.people_log())
    names = _table(teams)
    _create(teams)
    _members(teams, names)
    if names:
        _manage(teams, names)
