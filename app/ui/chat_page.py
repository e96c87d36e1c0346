"""The research chat page: ask, watch Plan → Research → Review → Answer happen, read the cited answer, give feedback,
export, reopen past sessions and ask follow-ups in the same chat."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import streamlit as st

from agent.accounting import prices_note, usage_of
from agent.config import RunOptions
from agent.errors import IngestError, InputError
from agent.followup import follow_up_question, typed_question
from app import events as ev
from app.export import doc_from_session, to_html, to_markdown, to_pdf
from app.service import RunFailedError
from app.ui import approval, state
from app.ui.runner import LiveRun, RunLimits
from app.ui.view import (
    RunView,
    cited_html,
    error_reference,
    failure_text,
    md_literal,
    references_html,
    support_caption,
    support_rows,
    usage_note,
    usage_summary,
    usage_table,
)
from app.uploads import ingest_uploads, upload_limits
from store.errors import SessionNotFound, StoreError
from store.owner import acting_as
from store.records import HISTORY_SOURCES, BankItem, SessionRecord
from store.threads import ChatThreads

_STATUS_STATE = {"running": "running", "complete": "complete"}
_CSS = """
<style>
a.cite { font-size: 0.8em; vertical-align: super; text-decoration: none; padding: 0 1px; }
ol.refs { list-style: none; padding-left: 0; } li.ref { margin-bottom: 0.5em; } li.ref:target { background: #fff3bf; }
</style>
"""


@dataclass
class Chat:
    """The conversation on screen: a thread id once it has one, and its sessions in order."""

    thread_id: str | None = None
    session_ids: list[str] = field(default_factory=list)


def _chat() -> Chat:
    if "chat" not in st.session_state:
        st.session_state.chat = Chat()
    return st.session_state.chat


# ---- sidebar ------------------------------------------------------------------------------------------------------


def _sidebar_history() -> None:
    svc = state.services()
    scoped = state.scoped()
    threads = ChatThreads(svc.log)
    if st.sidebar.button("➕ New chat", use_container_width=True):
        st.session_state.chat = Chat()
        st.rerun()
    st.sidebar.subheader("History")
    person = None
    if scoped.viewer.admin:
        people = sorted(set(scoped.owners()) | {u.user_id for u in state.users().list()} | {scoped.viewer.user_id})
        picked = st.sidebar.selectbox("Whose sessions", ["everyone", *people], key="history_user")
        person = None if picked == "everyone" else picked
    seen: set[str] = set()
    shown = 0
    # Only the viewer's own sessions (admins: everyone's), never benchmark runs or gate probes.
    for s in scoped.list_sessions(limit=60, sources=HISTORY_SOURCES, user=person):
        thread = threads.thread_of(s.session_id)
        key = thread or s.session_id
        if key in seen:
            continue
        seen.add(key)
        label = md_literal(typed_question(s.question)[:60])  # button labels are Markdown; an admin sees everyone's
        icons = {"completed": "📄", "failed": "⚠️", "running": "🔄", "interrupted": "⏸️"}
        icon = icons.get(s.shown_status, "•")
        if st.sidebar.button(f"{icon} {label}", key=f"hist_{key}", help=f"{s.created_at[:16]} · {s.shown_status}"):
            st.session_state.chat = Chat(thread, scoped.thread_sessions(thread) if thread else [s.session_id])
            st.rerun()
        shown += 1
        if shown >= 25:
            break
    if not shown:
        st.sidebar.caption("No sessions yet.")


def _sidebar_settings() -> tuple[RunOptions, list[str]]:
    """The run settings: search backends, budgets and output format (defaults from the settings object)."""
    svc = state.services()
    defaults = svc.settings.agent.defaults
    with st.sidebar.expander("⚙️ Research settings", expanded=False):
        st.caption(f"Corpus: `{svc.settings.store.docs_collection}` · {_corpus_size()} passages")
        backends = st.multiselect("Search backends", sorted(svc.tools), default=sorted(svc.tools), key="backends")
        # Widget ranges widen to take whatever the settings allow: a default outside a fixed range would make
        # Streamlit refuse to draw the page for everyone.
        # Non-admins get the run-option limits (issue 34; the runner enforces them too, whatever the widgets say).
        limits, admin = _limits(), state.viewer().admin
        top_calls = limits.tool_calls(admin)
        calls = min(defaults.max_tool_calls, top_calls)
        max_calls = st.slider("Max tool calls", 0, top_calls, calls, key="max_calls")
        cap = defaults.token_caps.answer
        answer_tokens = st.slider("Answer tokens", min(16, cap), max(4096, cap), cap, step=8, key="answer_tok")
        top_wall = int(limits.wall_clock_s(admin))
        limit = min(int(defaults.wall_clock_s), top_wall)
        wall = st.number_input("Time limit (s)", min(10, limit), top_wall, limit, step=10, key="wall")
        fmt = st.selectbox("Format", ["long_form", "short_form", "exact_answer"],
                           index=["long_form", "short_form", "exact_answer"].index(defaults.format)
                           if defaults.format in ("long_form", "short_form", "exact_answer") else 0, key="fmt")
        inject = st.toggle("Use rubric-bank reflections", value=defaults.inject_bank, key="inject")
    if st.session_state.get("role") == "admin":
        _sidebar_upload()
    options = defaults.model_copy(update={
        "max_tool_calls": max_calls, "wall_clock_s": float(wall), "format": fmt, "inject_bank": inject,
        "token_caps": defaults.token_caps.model_copy(update={"answer": answer_tokens}),
    })
    return RunOptions.model_validate(options.model_dump()), backends


def _limits() -> RunLimits:
    """The caps on chat runs, from the deployment's `sessions` settings."""
    return RunLimits.from_config(state.settings().sessions)


def _sidebar_upload() -> None:
    """Admins add documents (txt, md, html, pdf, jsonl) to the local index, as `rubricem ingest` does."""
    with st.sidebar.expander("📄 Add documents to the corpus", expanded=False):
        files = st.file_uploader("Files", type=["txt", "md", "html", "htm", "pdf", "jsonl"],
                                 accept_multiple_files=True, key="upload")
        if files and st.button("Index them", key="ingest"):
            svc = state.services()
            try:
                with st.spinner("Indexing…"):
                    # Each file is copied to disk in pieces under the upload caps, never copied whole in memory.
                    result = ingest_uploads([(f.name, f) for f in files], svc.settings.store.data_dir / "uploads",
                                            svc.index, limits=upload_limits(svc.settings.uploads))
                st.success(f"Indexed {result.chunks:,} chunks from {len(result.files)} file(s).")
            except IngestError as exc:  # one bad file refuses the whole upload before the index is touched
                # Written for the uploader (what to change), but it quotes file names and may quote a path under the
                # server's data folder: literal, and the folder shown as `uploads`.
                folder = str(svc.settings.store.data_dir / "uploads")
                st.error(md_literal(str(exc).replace(folder, "uploads")))
            except StoreError as exc:
                st.error(error_reference("The index failed; nothing was added", exc))
            finally:
                _corpus_size_cached.clear()


@st.cache_data(ttl=60, show_spinner=False)
def _corpus_size_cached(collection: str) -> int:  # the argument keys the cache (underscored ones are not hashed)
    return state.services().index.count()


def _corpus_size() -> str:
    try:
        return f"{_corpus_size_cached(state.settings().store.docs_collection):,}"
    except Exception:  # noqa: BLE001 - the count is informational
        return "?"


# ---- drawing ------------------------------------------------------------------------------------------------------


SHARED_NOTE = ("Reflections on other people's questions may also guide the agent, as strategy text only; they are "
               "never shown or counted here.")
MAX_SHOWN_QUESTION = 200  # characters of an own item's question in "Reflections used"


def own_reflections(view: RunView) -> list[tuple[BankItem, float]]:
    """The viewer's own items among the reflections the run put into its prompt, each with its similarity: the only
    ones the chat names (issue 65). Which of anyone else's items were used, or how many, would answer "did someone
    ask a question like mine?", so those are neither listed nor counted; the retrieval takes own items first, so
    which own ones were used does not depend on anyone else's either (`RubricBank.retrieve`)."""
    if not view.bank_items:
        return []
    bank = state.services().bank
    if bank is None:
        return []
    similarity = {i.item_id: i.similarity for i in view.bank_items}
    try:
        own = bank.owned_by(list(similarity), state.viewer().user_id)
    except StoreError as exc:
        error_reference("Could not read the reflections used", exc)  # logged; the page names none
        return []
    return [(item, similarity[item.id]) for item in own]


def bank_caption(view: RunView, own: list[tuple[BankItem, float]]) -> str:
    """What the chat says of the rubric bank for a run: the viewer's own reflections only, then one fixed sentence
    about everyone else's, the same whether any were used or not."""
    if own and view.bank_mode == "within":
        mine = "Used your own reflection from an earlier attempt at this same question (within-episode)."
    elif own:
        mine = f"Used {len(own)} of your own reflection(s) on similar earlier question(s)."
    else:
        mine = "None of your own earlier reflections were used."
    return f"{mine} {SHARED_NOTE}"


def _clipped(text: str) -> str:
    """A question cut to MAX_SHOWN_QUESTION characters on one line (a pasted document stays one line)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_SHOWN_QUESTION else flat[:MAX_SHOWN_QUESTION - 1] + "…"


def draw_run(view: RunView, live: bool) -> None:
    """One run: the four stages (each expandable), the bank reflections used, then the cited answer."""
    who = f"policy `{view.policy_version}`" if view.policy_version else "policy …"
    st.caption(f"{who} · session `{view.session_id or '…'}`")
    own = own_reflections(view)
    st.caption("📚 " + bank_caption(view, own))  # our own words: the count is of the viewer's own items
    if own:
        with st.expander("Reflections used"):
            for item, similarity in own:  # the viewer's own question, still escaped: it may hold markup
                shown = f" (similarity {similarity:.2f})" if view.bank_mode in ("within", "cross") else ""
                st.markdown(f"- {md_literal(item.id)} {md_literal(_clipped(item.question))}{shown}")
    for stage in view.stages.values():
        if stage.state == "waiting":
            continue
        label = stage.title
        if stage.stage == "research" and stage.searches:
            label += f" — {len(stage.searches)} search(es)"
        with st.status(label, state=_STATUS_STATE[stage.state], expanded=live and stage.state == "running"):
            if stage.stage == "plan" and view.checklist:
                st.markdown("**Rubric checklist**\n" + "\n".join(f"- [ ] {md_literal(item)}" for item in view.checklist))
            for search in stage.searches:
                st.markdown(f"🔎 **{md_literal(search.tool)}**: {md_literal(search.query)}")
                if search.error:  # tool-written (a server, a page) or naming a model-written tool: literal
                    st.warning(md_literal(search.error))
                for s in search.sources[:8]:
                    where = s.url or s.id
                    st.caption(f"{md_literal(s.id)} {md_literal(s.title)} — {md_literal(where)}")
            for text in stage.texts[-6:]:
                st.text(text[:3000])
    pending = [v.title for v in view.stages.values() if v.state == "waiting"]
    if pending:
        st.caption(("Next: " if view.status == "running" else "Not reached: ") + ", ".join(pending))
    for note in view.notes:  # notes quote errors (the bank's, the attribution's): literal
        st.info(md_literal(note))
    if view.status == "failed":
        st.error(failure_text(view))
    if view.report is not None:
        st.markdown(_CSS, unsafe_allow_html=True)
        st.markdown("**Answer**")
        st.markdown(cited_html(view.report, view.session_id or "live"), unsafe_allow_html=True)
        if view.report.references:
            st.markdown("**References**")
            if view.report.attributed:
                st.caption("The model cited no sources: each marked sentence was matched, after writing, to the most "
                           "similar retrieved passage. Check them before relying on them.")
            st.markdown(references_html(view.report, view.session_id or "live"), unsafe_allow_html=True)
        elif not view.report.answer_found:
            st.warning("The model produced no answer text.")
        if caption := support_caption(view.report):
            st.caption(caption)
            if rows := support_rows(view.report):
                with st.expander("Citation check: each cited sentence", expanded=False):
                    st.dataframe(rows, hide_index=True, key=f"support_{view.session_id or 'live'}")


def _draw_feedback(session_id: str) -> None:
    log = state.scoped()  # feedback only on the viewer's own sessions (admins: any)
    given = log.feedback(session_id)
    with st.expander(f"Feedback{f' ({len(given)} given)' if given else ''}", expanded=False):
        rating = st.feedback("thumbs", key=f"thumb_{session_id}")
        note = st.text_area("What was missing or wrong?", key=f"note_{session_id}", max_chars=2000)
        if st.button("Send feedback", key=f"send_{session_id}"):
            value = {0: "down", 1: "up"}.get(rating) if rating is not None else None
            if value is None and not note.strip():
                st.warning("Choose 👍/👎 or write a note first.")
            else:
                try:
                    log.add_feedback(session_id, value, note)
                    st.success("Thanks — your feedback is stored with the session; the judge turns notes into "
                               "extra rubrics for this question.")
                except StoreError as exc:
                    st.error(error_reference("Could not store the feedback", exc))
                except ValueError as exc:  # the note refused as written: the message says what to change
                    st.error(f"Could not store the feedback: {md_literal(str(exc))}")


def _draw_usage(session_id: str) -> None:
    """Tokens and cost of a session the viewer may see (issue 36): the policy per stage, the judge, the total."""
    prices = state.settings().prices
    try:
        usage = usage_of(state.services().log, session_id, prices)
    except StoreError as exc:
        st.caption(error_reference("Tokens and cost unavailable", exc))
        return
    if usage is None:
        return
    with st.expander(f"Tokens and cost: {md_literal(usage_summary(usage))}", expanded=False):
        st.dataframe(usage_table(usage), hide_index=True, key=f"usage_{session_id}")
        note = prices_note(prices)
        st.caption(md_literal(f"{note[:1].upper()}{note[1:]}. {usage_note(usage)}".strip()))


def _draw_exports(session_id: str) -> None:
    try:
        doc = doc_from_session(state.scoped().get(session_id))
    except Exception as exc:  # noqa: BLE001 - exporting is optional; say that it is not offered
        st.caption(error_reference("Export unavailable", exc))
        return
    cols = st.columns(3)
    cols[0].download_button("⬇ Markdown", to_markdown(doc), f"{session_id}.md", "text/markdown",
                            key=f"md_{session_id}")
    # HTML and PDF are built when clicked (deferred data), not on every rerun of a page that shows many answers.
    cols[1].download_button("⬇ HTML", lambda: to_html(doc), f"{session_id}.html", "text/html",
                            key=f"html_{session_id}")
    cols[2].download_button("⬇ PDF", lambda: to_pdf(doc), f"{session_id}.pdf", "application/pdf",
                            key=f"pdf_{session_id}")


def _draw_stored(session_id: str) -> None:
    try:
        record = state.scoped().get(session_id)
    except SessionNotFound:  # missing, or someone else's: the same answer, so ids cannot be probed
        st.error("Session not found.")
        return
    except StoreError as exc:
        st.error(error_reference("Could not open the session", exc))
        return
    with st.chat_message("user"):
        st.markdown(md_literal(typed_question(record.question)))
    with st.chat_message("assistant"):
        view = RunView.from_record(record)
        draw_run(view, live=False)
        _draw_usage(session_id)
        if record.status == "completed":
            _draw_exports(session_id)
            _draw_feedback(session_id)
        if record.source not in ("eval", "probe"):
            _draw_learning_toggle(session_id, not record.training_opt_out)
        approval.draw_pending(record, draw_run)  # a paused plan's form (issue 21; app/ui/approval.py)
        if state.services().log.interrupted(session_id):  # the scoped read above checked it is the viewer's
            _offer_resume(record)


def _offer_resume(record: SessionRecord) -> None:
    """A session whose process stopped (its lease expired, issue 34): go on with it from its last checkpoint."""
    st.warning("This session was interrupted: the process running it stopped. It can go on from its last step.")
    if not st.button("Resume it", key=f"resume_{record.session_id}"):
        return
    viewer = state.viewer()
    # The run goes on as the person who resumed it (issue 65), as a question they ask does (`_ask`) and a plan they
    # answer does (approval.py): the research loop's thread would otherwise run it as `local`, the open UI's admin.
    with acting_as(viewer.user_id):
        run = LiveRun(state.services().research, record.question, None,  # type: ignore[arg-type]
                      resume=(record.session_id, None), limits=_limits(), admin=viewer.admin,
                      person=viewer.user_id)
    view, box = RunView.from_record(record), st.empty()
    for event in run.events():
        if event is not None:
            view.apply(event)
            with box.container():
                draw_run(view, live=True)
    ended = run.ended
    if ended is not None and isinstance(ended.error, InputError):  # refused (a cap, or not resumable): nothing changed
        st.error(md_literal(str(ended.error)))
        return
    st.rerun()


def _draw_learning_toggle(session_id: str, learning: bool) -> None:
    """The per-session consent toggle: may this session be judged, trained on and reflected into the bank."""
    on = st.toggle("Allow learning from this session", value=learning, key=f"learn_{session_id}")
    if on != learning:
        try:
            state.scoped().set_learning(session_id, on)
        except SessionNotFound:
            st.error("Session not found.")


def _open_from_url() -> None:
    """`?session=<id>` opens that session, when it is the visitor's (anyone else's reads as not found)."""
    wanted = st.query_params.get("session")
    if not wanted or st.session_state.get("opened_from_url") == wanted:
        return
    st.session_state.opened_from_url = wanted
    scoped = state.scoped()
    try:
        thread = scoped.thread_of(wanted)
    except SessionNotFound:
        st.session_state.chat = Chat()
        st.session_state.url_refused = True
        return
    st.session_state.url_refused = False
    st.session_state.chat = Chat(thread, scoped.thread_sessions(thread) if thread else [wanted])


def _sidebar_privacy() -> None:
    """The person's consent to learn from their sessions, and deleting everything of theirs."""
    from app.durable import purge_checkpoints
    from store.deletion import delete_user_data, owned_sessions
    from store.users import UnknownUser

    svc = state.services()
    me = state.viewer()
    users = state.users()
    with st.sidebar.expander("🔒 Privacy", expanded=False):
        mine = users.consents(me.user_id)
        allow = st.toggle("Let rubricem learn from my sessions", value=mine, key="consent_me",
                          help="Judging, training and the rubric bank use only sessions of people who allow it.")
        if allow != mine:
            if users.find(me.user_id) is None:
                users.ensure(me.user_id, kind="local" if me.user_id == "local" else "oidc",
                             role="admin" if me.admin else "user")
            users.set_consent(me.user_id, allow)
        st.toggle("Learn from my next question", value=allow, key="learn_next", disabled=not allow)
        sure = st.checkbox("I understand: all my sessions, chats and feedback are deleted for good", key="sure")
        if st.button("Delete my data", key="delete_mine", disabled=not sure):
            try:
                purge_checkpoints(state.settings().store, owned_sessions(svc.log, me.user_id))
                from app.retrain import deletion_copies

                result = delete_user_data(svc.log, me.user_id, requested_by=me.user_id, bank=svc.bank,
                                          keep_account=True, copies=deletion_copies(state.settings(), svc.bank))
                st.session_state.chat = Chat()
                st.success(f"Deleted {result.counts.get('sessions', 0)} session(s) and "
                           f"{result.bank_items_removed} rubric-bank item(s).")
            except UnknownUser:
                st.info("There is nothing of yours to delete.")
            except StoreError as exc:
                st.error(f"Deletion failed ({type(exc).__name__}); run it again to finish it.")


# ---- asking -------------------------------------------------------------------------------------------------------


def _earlier(chat: Chat) -> list[tuple[str, str]]:
    log = state.scoped()
    out = []
    for sid in chat.session_ids[-2:]:
        try:
            rec = log.get(sid)
        except StoreError:
            continue
        if rec.status == "completed":
            out.append((rec.question, RunView.from_record(rec).report.body if rec.report else ""))  # type: ignore[union-attr]
    return out


def _ask(typed: str, options: RunOptions, backends: list[str], approve_plan: bool = False) -> None:
    svc = state.services()
    chat = _chat()
    question = follow_up_question(typed, _earlier(chat), svc.settings.agent.max_question_chars) \
        if chat.session_ids else typed
    with st.chat_message("user"):
        st.markdown(md_literal(typed))
    with st.chat_message("assistant"):
        box = st.empty()
        view = RunView(question=question)
        started = time.monotonic()
        threads = ChatThreads(svc.log)  # made here: the hook below runs on the research loop's thread

        def file_session(event: object) -> None:
            if isinstance(event, ev.SessionStarted):
                _remember(chat, event.session_id, threads)

        # The session is created for this person (its owner), with their per-chat learning choice.
        with acting_as(state.viewer().user_id, learn=bool(st.session_state.get("learn_next", True))):
            run = LiveRun(svc.research, question, options, backends, on_event=file_session,
                          approve_plan=approve_plan, limits=_limits(), admin=state.viewer().admin,
                          person=state.viewer().user_id)
        st.session_state.live_run = run
        timer = st.empty()
        with box.container():
            st.caption("Starting…")
        for event in run.events():
            # None = nothing new for a moment: only the timer moves (and the page stays stoppable).
            timer.caption(f"⏱ {time.monotonic() - started:.0f} s")
            if event is None:
                continue
            view.apply(event)
            with box.container():
                draw_run(view, live=True)
        ended = run.ended
        assert ended is not None
        st.session_state.pop("live_run", None)
        if ended.outcome is not None:
            _remember(chat, ended.outcome.session_id, threads)
            st.rerun()
        error = ended.error
        if isinstance(error, RunFailedError) and error.session_id:
            _remember(chat, error.session_id, threads)
            st.rerun()
        with box.container():
            if isinstance(error, InputError):  # bad input, nothing written: the message says what to change
                st.error(md_literal(str(error)))
            else:
                st.error(error_reference("The run could not start", error if error is not None else "no error"))


def _remember(chat: Chat, session_id: str, threads: ChatThreads) -> None:
    """Put a session in the chat's thread (the thread starts with the chat's first session); idempotent.

    Called when the session starts (from the research loop's thread), so a page rerun mid-run keeps it in the chat,
    and again when it ends.
    """
    if session_id in chat.session_ids:
        return
    if chat.thread_id is None and chat.session_ids:
        chat.thread_id = threads.thread_of(chat.session_ids[0]) or threads.new_id()
        for sid in chat.session_ids:
            if threads.thread_of(sid) is None:
                threads.add(chat.thread_id, sid)
    if chat.thread_id is not None:
        threads.add(chat.thread_id, session_id)
    chat.session_ids.append(session_id)


def page() -> None:
    """The research chat."""
    options, backends = _sidebar_settings()
    _sidebar_history()
    _sidebar_privacy()
    _open_from_url()
    if st.session_state.get("url_refused") and not _chat().session_ids:
        st.error("Session not found.")  # missing, or someone else's: the same answer
    chat = _chat()
    approve_plan = approval.toggle(chat)
    if not chat.session_ids:
        st.title("🔬 rubricem research")
        st.caption("Ask a question: the agent plans with its own rubric, searches, reviews its evidence against the "
                   "rubric, then writes a cited answer.")
    for sid in chat.session_ids:
        _draw_stored(sid)
    live = st.session_state.get("live_run")
    busy = live is not None and live.running
    if busy:  # the page was rerun mid-run: the run goes on, and its session is already in the chat above
        st.info("A research run is still in progress; it is shown above as far as it has got.")
        st.button("Refresh", key="refresh_live")
    prompt = "Ask a follow-up" if chat.session_ids else "Ask a research question"
    if typed := st.chat_input(prompt, max_chars=state.settings().agent.max_question_chars, disabled=busy):
        _ask(typed, options, backends, approve_plan)
