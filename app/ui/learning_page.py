"""The learning page: policy versions over time, per-stage reward curves, promotion and rejection reasons, bank size,
retraining cycles, and a "retrain now" button for admins (it starts `rubricem retrain --now` in the background)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import streamlit as st

from agent.accounting import UsageTotals, format_cost, prices_note
from app import dashboard
from app.ui import state
from app.ui.view import cycle_reason, md_literal, version_reason
from store.deletion import versions_trained_on_deleted_data


def start_retrain(data_dir: Path) -> Path:
    """Start one retraining cycle in a separate process (the cycle lock keeps it single); returns its log file."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "ui-retrain.log"
    with log_path.open("ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "app.cli", "retrain", "--now"], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)  # same cwd and env: same settings
    return log_path


def retrain_blocker(data_dir: Path) -> str | None:
    """Why a cycle cannot be started from this process (None when it can).

    In the compose deployment the app image has no training packages and mounts the runs folder read-only: there the
    scheduler container trains, and the button would only write a failure to a log nobody reads.
    """
    if importlib.util.find_spec("peft") is None or importlib.util.find_spec("accelerate") is None:
        return "this app's environment has no training packages (peft, accelerate)"
    runs = data_dir / "runs"
    target = runs if runs.exists() else data_dir
    if target.exists() and not os.access(target, os.W_OK):
        return f"`{target}` is read-only here"
    return None


def _curves(points: list[dashboard.StagePoint], by: str) -> pd.DataFrame:
    rows = [asdict(c) for c in dashboard.stage_reward_curve(points, by)]  # type: ignore[arg-type]
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    return frame.pivot_table(index="key", columns="stage", values="mean", sort=False)


def _retrain_box() -> None:
    svc = state.services()
    if st.session_state.get("role") != "admin":
        st.caption("Retraining is started by admins.")
        return
    running = svc.registry.running_cycle()
    if running is not None:
        st.info(f"A retraining cycle is running: {md_literal(running.cycle_id)} ({md_literal(running.stage)}).")
    blocker = retrain_blocker(svc.settings.store.data_dir)
    if blocker is not None:
        st.caption(f"Retraining cannot start from this app: {blocker}. Start a cycle where the trainer runs, e.g. "
                   "`docker compose exec scheduler rubricem retrain --now`.")
        return
    if st.button("🔁 Retrain now", disabled=running is not None, key="retrain_now"):
        path = start_retrain(svc.settings.store.data_dir)
        st.success(f"Retraining started in the background; its log is `{path}`. Reload this page to follow it.")


def _consent_counts() -> None:
    """How many completed sessions learning may use, and how many it skips (no consent, or opted out)."""
    svc = state.services()
    from store.teams import Teams

    now = svc.log.now()
    teams = Teams(svc.log).list()  # the global policy's sessions and each team's (issue 49); a sharing team's
    policies = [None, *(t.name for t in teams)]  # sessions are in the global window too: counted once
    used = len({s for p in policies for s in svc.registry.sessions_in_window(None, now, team=p)})
    skipped = svc.registry.skipped_in_window(None, now) + sum(
        svc.registry.skipped_in_window(None, now, team=t.name) for t in teams if not t.share_global)
    st.caption(f"Learning uses {used:,} completed session(s) and skips {skipped:,} whose owner did not consent or "
               f"that were opted out (default for people who have not chosen: "
               f"{'learn' if svc.log.consent_default else 'do not learn'}).")


def _cost_cells(u: UsageTotals | None) -> dict[str, object]:
    """The cycles table's token and cost cells (blank for a cycle that judged nothing)."""
    if u is None:
        return {"policy tokens": None, "judge tokens": None, "cost": ""}
    return {"policy tokens": u.prompt_tokens + u.sampled_tokens,
            "judge tokens": u.judge_prompt_tokens + u.judge_completion_tokens, "cost": format_cost(u.total_cost)}


def _visible_teams() -> set[str] | None:
    """Whose team versions and cycles this visitor sees (issue 49): admins every team's, a person their own team's
    (SECURITY.md, Teams)."""
    viewer = state.viewer()
    if viewer.admin:
        return None
    from store.teams import Teams

    team = Teams(state.services().log).team_of(viewer.user_id)
    return set() if team is None else {team}


def _shown(version: str, teams: set[str] | None) -> bool:
    """Whether a version name may be shown to this visitor: a team's (`team:<name>@K`) only to its own people."""
    if teams is None or not version.startswith("team:"):
        return True
    return version[len("team:"):].split("@", 1)[0] in teams


def page() -> None:
    """The learning page."""
    svc = state.services()
    st.title("📈 Learning")
    s = dashboard.summary(svc.registry, svc.log, svc.bank)
    cols = st.columns(5)
    cols[0].metric("Live policy", s.live_version)
    cols[1].metric("Versions (promoted / rejected)", f"{s.versions} ({s.promoted} / {s.rejected})")
    cols[2].metric("Sessions judged", f"{s.sessions_judged} / {s.sessions_completed}")
    cols[3].metric("Rubric bank", "unavailable" if s.bank_size is None else f"{s.bank_size:,} reflections")
    cols[4].metric("Last cycle", s.last_cycle_status or "none")
    _consent_counts()
    _retrain_box()

    st.subheader("Per-stage reward")
    by = st.radio("Curve by", ["version", "day"], horizontal=True, key="curve_by")
    teams = _visible_teams()
    points = [p for p in dashboard.stage_reward_points(svc.log) if _shown(p.policy_version, teams)]
    frame = _curves(points, by)
    if frame.empty:
        st.caption("No judged sessions yet: `rubricem judge` (or a retraining cycle) judges logged sessions.")
    else:
        st.line_chart(frame)
        st.caption(f"Mean judge score per stage over {len(points)} judged session(s).")

    st.subheader("Policy versions")
    deleted = versions_trained_on_deleted_data(svc.log)  # what an adapter learned cannot be deleted from it
    admin = state.viewer().admin  # a rejection's detail names server paths: admins only (`view.rejection_text`)
    st.dataframe(pd.DataFrame([{
        "version": v.name, "team": v.team or "", "live": "●" if v.live else "", "status": v.status,
        "parent": v.parent or "",
        "held-out score": v.eval_total, "live score": v.eval_live_total,
        "reason": version_reason(v.status, v.name, v.reason, admin=admin),
        "trained on deleted data": "yes" if v.name in deleted else "",
        "created": v.created_at[:19]} for v in dashboard.version_rows(svc.registry, teams)]), hide_index=True)

    st.subheader("Promotions and rollbacks")
    history = dashboard.alias_history(svc.registry)
    st.dataframe(pd.DataFrame([{"when": a.created_at[:19], "action": a.action, "version": a.version,
                                "previous": a.previous or "", "reason": a.reason} for a in history]),
                 hide_index=True)

    st.subheader("Retraining cycles")
    cycles = dashboard.cycle_rows(svc.registry, teams=teams)
    if not cycles:
        st.caption("No cycles yet.")
    else:
        spent = dashboard.cycle_usage(svc.registry, cycles, svc.settings.prices)
        st.dataframe(pd.DataFrame([{
            "started": c.started_at[:19], "trigger": c.trigger, "status": c.status, "reached": c.stage_reached,
            "candidate": c.candidate or "", "sessions used": c.new_sessions,
            "skipped (no consent)": c.skipped_sessions, "candidate score": c.candidate_score,
            "live score": c.live_score, **_cost_cells(spent.get(c.cycle_id)),
            "reason": cycle_reason(c.status, c.cycle_id, c.reason, admin=admin)}
            for c in cycles]), hide_index=True)
        st.caption(md_literal(
            f"Tokens and cost: the policy serving each cycle's window of sessions and the judge grading them; "
            f"{prices_note(svc.settings.prices)}. Training rollouts and gate probes are logged by the trainer and "
            "not counted. Unknown: a model the price table does not list."))
