"""SFT distillation: questions, the evidence-chain teacher, rejection rules, the exact label mask, training, resume."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from agent.parse import find_citations
from learning.sft import trajectory as tr
from learning.sft.evidence_teacher import (
    CITE_CHARS,
    TEACHER_NAME,
    EvidenceChainTeacher,
    EvidenceMissing,
    answer_window,
)
from learning.sft.generate import generate, kept_examples, read_lines
from learning.sft.questions import QuestionFileError, SFTQuestion, load_questions
from learning.sft.trajectory import Segment, Trajectory, postprocess, rejection_reason

REPO = Path(__file__).resolve().parents[2]
HELDOUT_HOTPOT = REPO / "learning" / "sft" / "data" / "heldout" / "hotpotqa_train.json"
TRAIN_MUSIQUE = REPO / "learning" / "sft" / "data" / "train" / "musique_train.json"
DEMO_Q = "What language were books being translated into during the era of Haymo of Faversham?"
TOOLS = ["local_search"]


@pytest.fixture(scope="module")
def demo_question() -> SFTQuestion:
    return next(q for q in load_questions(HELDOUT_HOTPOT) if q.question == DEMO_Q)


@pytest.fixture(scope="module")
def demo_search(tmp_path_factory: pytest.TempPathFactory, demo_question: SFTQuestion) -> object:
    """The real local_search over the demo question's ten HotpotQA paragraphs (two gold, eight distractors)."""
    from agent.tools.local_search import LocalSearch
    from tests.indexes import passage_index

    record = next(r for r in json.loads(HELDOUT_HOTPOT.read_text()) if r["question"] == DEMO_Q)
    titles = [t for t, _ in record["context"]]
    return LocalSearch(passage_index(tmp_path_factory.mktemp("sft-index"), lambda _c: titles), k=5)


# -- questions -------------------------------------------------------------------------------------------------------


def test_shipped_questions_load_with_gold_hops(demo_question: SFTQuestion) -> None:
    musique = load_questions(TRAIN_MUSIQUE)
    assert len(musique) == 64 and all(len(q.hops) >= 2 for q in musique)
    # A decomposition step that refers to an earlier answer is searched with that answer, planned without it.
    assert all("#" not in h.query for q in musique for h in q.hops)
    assert any("(the answer of step 1)" in h.need for q in musique for h in q.hops)
    assert [h.title for h in demo_question.hops] == ["Haymo of Faversham", "Recovery of Aristotle"]
    assert demo_question.answers == ("Latin",)


def test_heldout_split_never_overlaps_training() -> None:
    for name in ("hotpotqa_train.json", "musique_train.json"):
        train = {q.question for q in load_questions(REPO / "learning/sft/data/train" / name)}
        held = {q.question for q in load_questions(REPO / "learning/sft/data/heldout" / name)}
        assert len(held) == 16 and not train & held
    assert DEMO_Q in {q.question for q in load_questions(HELDOUT_HOTPOT)}


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ('{"question": "a?", "answer": "b"}\n{"question": "c?", "answer": "d"}\n{"question": "e?", "answer": \n',
         "line 3"),
        ('{"question": "a?", "answer": "b"}\n["not an object"]\n', "line 2"),
        ('{"question": "", "answer": "b"}\n', "line 1"),
        ('{"question": "a?", "answer": "b", "format": "poem"}\n', "line 1"),
        ('{"id": "x", "question": "a?", "answer": "b"}\n{"id": "x", "question": "c?", "answer": "d"}\n',
         "appears twice"),
    ],
)
def test_a_malformed_questions_file_names_the_line(tmp_path: Path, content: str, where: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    with pytest.raises(QuestionFileError, match=where):
        load_questions(path)


def test_cli_refuses_a_malformed_questions_file_and_writes_nothing(tmp_path: Path) -> None:
    from app.cli import main

    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question": "a?", "answer": "b"}\nnot json\n')
    out = tmp_path / "out"
    assert main(["sft", "generate", "--questions", str(bad), "--out", str(out)]) == 2
    assert not out.exists()


# -- the evidence-chain teacher ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["exact_answer", "short_form", "long_form"])
def test_evidence_teacher_cites_only_retrieved_gold_snippets(demo_search: object, demo_question: SFTQuestion,
                                                            fmt: str) -> None:
    teacher = EvidenceChainTeacher(demo_search)  # type: ignore[arg-type]
    texts = set()
    for seed in range(4):
        traj = asyncio.run(teacher.write(demo_question, fmt, None, seed))
        assert rejection_reason(traj, TOOLS) is None
        answer = traj.segments[-1].text
        cited = {i for c in find_citations(answer[answer.index("<answer>"):]) for i in c.ids}
        assert cited and cited <= traj.retrieved_ids()
        # Every cited id is one of the gold passages, and every query was written, not copied from the evidence.
        gold_ids = {sid for call in traj.tool_calls for sid in call["snippet_ids"]}
        assert cited <= gold_ids
        for call in traj.tool_calls:
            assert all(h.statement not in call["query"] for h in demo_question.hops)
        assert ("\\boxed{Latin}" in answer) == (fmt == "exact_answer")
        # The answer comes first, before any quote, and every quote is short (a small student copies long ones).
        body = answer[answer.index("<answer>") + len("<answer>"):answer.index("</answer>")]
        assert "Latin" in body[:body.index("<cite")]
        assert fmt != "exact_answer" or body.startswith("\\boxed{Latin}")
        quotes = re.findall(r"<cite id=[^>]*>(.*?)</cite>", body, re.DOTALL)
        assert quotes and all(len(q) <= CITE_CHARS for q in quotes)
        assert traj.teacher == TEACHER_NAME == "evidence-chain/5"
        # The first search is the question itself (the one query a small student copies reliably).
        assert traj.tool_calls[0]["query"] == DEMO_Q.rstrip("?")
        # The answer is grounded: a verbatim window of the retrieved passage holding it is quoted in the review and
        # in the answer's citation, so the student learns to copy the answer from what it read.
        retrieved_text = " ".join(" ".join(seg.text.split()) for seg in traj.segments if seg.kind == "tool")
        assert any("Latin" in q and q in retrieved_text for q in quotes)
        review = answer[answer.index("<review>"):answer.index("</review>")]
        assert re.search(r'"[^"]*Latin[^"]*"[^.]*Latin', review)
        # The state evaluation before the second hop's search names the entity that search is about.
        second = next(c["query"] for c in traj.tool_calls if "Recovery of Aristotle" in c["query"])
        before = next(seg.text for seg in traj.segments if seg.kind == "model" and second in seg.text)
        evaluation = before[before.index("<state_evaluation>"):before.index("</state_evaluation>")]
        assert "Recovery of Aristotle" in evaluation
        texts.add(traj.segments[0].text)
    assert len(texts) > 1  # the wording varies with the seed


def test_evidence_teacher_searches_the_question_first_then_the_hops_written_query(demo_search: object,
                                                                                 demo_question: SFTQuestion) -> None:
    teacher = EvidenceChainTeacher(demo_search)  # type: ignore[arg-type]
    hit = asyncio.run(teacher.write(demo_question, "short_form", None, 0))
    assert [c["query"] for c in hit.tool_calls][:1] == [DEMO_Q.rstrip("?")]
    # A question that does not bring up the first hop's passage: its written query follows, and the miss stays in
    # the trajectory as a recovery.
    vague = replace(demo_question, question="Which language was it?")
    miss = asyncio.run(teacher.write(vague, "short_form", None, 0))
    queries = [c["query"] for c in miss.tool_calls]
    assert queries[:2] == ["Which language was it", demo_question.hops[0].query]
    assert rejection_reason(miss, TOOLS) is None
    first_result = next(seg.text for seg in miss.segments if seg.kind == "model" and "<think>" in seg.text
                        and "<structured_plan>" not in seg.text)
    assert "step 1" in first_result.lower() or "reformulat" in first_result.lower()


@pytest.mark.parametrize(("answer", "limit", "expected"), [
    ("Latin", 120, "During his era many books were translated into Latin from Greek and Arabic."),
    ("english franciscan", 120, "Haymo of Faversham (died 1244) was an English Franciscan."),
    ("Latin", 40, "translated into Latin from Greek and"),  # centred on the answer, whole words
    ("lat", 120, ""),  # inside a word ("trans-lat-ed") is not the answer
    ("yes", 120, ""),  # not in the text: no quote, the review states the answer without one
    ("Haymo of Faversham", 10, ""),  # the answer alone is longer than the quote may be
])
def test_answer_window_is_a_verbatim_piece_holding_the_answer(answer: str, limit: int, expected: str) -> None:
    text = ("Haymo of Faversham (died 1244) was an English Franciscan.  He is known for his work on the liturgy. "
            "During his era many books were translated into Latin from Greek and Arabic.")
    quote = answer_window(text, answer, limit)
    assert quote == expected
    assert len(quote) <= limit and quote in " ".join(text.split())


def test_evidence_teacher_rejects_a_question_whose_evidence_is_not_indexed(demo_search: object) -> None:
    from learning.sft.questions import Hop

    q = SFTQuestion("x", "Who painted the ceiling?", ("Michelangelo",),
                    (Hop("the painter", "Sistine Chapel ceiling painter", "Sistine Chapel ceiling",
                         "The ceiling was painted by Michelangelo.", "painted by Michelangelo"),))
    with pytest.raises(EvidenceMissing, match="not retrieved"):
        asyncio.run(EvidenceChainTeacher(demo_search).write(q, "short_form", None, 0))  # type: ignore[arg-type]


# -- rejection rules and post-processing -------------------------------------------------------------------------------

PLAN = ("<think>t</think>\n<structured_plan>\n<deep_analysis>a</deep_analysis>\n<rubric>r</rubric>\n"
        "<research_plan>p</research_plan>\n</structured_plan>")
CALL = '\n<call_tool name="local_search">q</call_tool>'
OUT = '\n<tool_output>\n<snippet id="00000000-0">\nx\n</snippet>\n</tool_output>\n'
ERR = "\n<tool_output>\nError: rate limited\n</tool_output>\n"
FINAL = ('<think>t</think>\n<state_evaluation>done</state_evaluation>\n<review>\n<rubric_review>r</rubric_review>\n'
         '<writing_plan>w</writing_plan>\n</review>\n<answer><cite id="00000000-0">x</cite></answer>')
MID = "<think>t</think>\n<state_evaluation>more</state_evaluation>" + CALL


def _traj(*parts: tuple[str, str]) -> Trajectory:
    return Trajectory("q", "test", "short_form", 10, [Segment(k, t) for k, t in parts])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("parts", "reason"),
    [
        ((("model", PLAN + CALL), ("tool", OUT), ("model", FINAL)), None),
        ((("model", PLAN + CALL), ("tool", ERR), ("model", MID), ("tool", OUT), ("model", FINAL)), None),
        ((("model", PLAN + CALL), ("tool", OUT), ("model", FINAL.replace("</answer>", ""))), tr.NO_ANSWER),
        ((("model", PLAN + CALL), ("tool", OUT), ("model", MID.replace(CALL, "")), ("tool", OUT), ("model", FINAL)),
         tr.BAD_TOOL_CALL),
        ((("model", PLAN + CALL.replace("local_search", "nosuch")), ("tool", OUT), ("model", FINAL)),
         tr.BAD_TOOL_CALL),
        ((("model", PLAN + CALL), ("model", FINAL)), tr.BAD_TOOL_CALL),
        ((("model", PLAN.replace("<rubric>r</rubric>\n", "") + CALL), ("tool", OUT), ("model", FINAL)),
         tr.MISSING_STRUCTURE),
        ((("model", PLAN + CALL), ("tool", OUT), ("model", FINAL.replace("<state_evaluation>done</state_evaluation>",
                                                                           ""))), tr.MISSING_STRUCTURE),
        ((("model", PLAN + "\n<answer>guess</answer>"),), tr.MISSING_STRUCTURE),
        ((("model", PLAN.replace("</deep_analysis>", "") + CALL), ("tool", OUT), ("model", FINAL)),
         tr.MALFORMED_TAGS),
        ((("model", PLAN + CALL), ("tool", ERR), ("model", MID), ("tool", ERR), ("model", FINAL)), tr.TOOL_ERRORS),
    ],
    ids=["kept", "one-error-then-recovery-kept", "no-answer", "round-without-call", "unknown-tool",
         "two-model-rounds", "no-rubric", "no-state-evaluation", "answer-in-round-1", "unclosed-tag",
         "two-tool-errors"],
)
def test_each_rejection_rule(parts: tuple[tuple[str, str], ...], reason: str | None) -> None:
    assert rejection_reason(_traj(*parts), TOOLS) == reason


def test_postprocess_renames_scratchpad_and_tool_variants() -> None:
    text = '<scratchpad>x</scratchpad><call_tool name="Local-Search">q</call_tool><call name=retrieve>r</call>'
    assert postprocess(text, TOOLS) == ('<think>x</think><call_tool name="local_search">q</call_tool>'
                                        '<call_tool name="local_search">r</call_tool>')


# -- generation: resumable, counted, bounded ---------------------------------------------------------------------------


def test_generate_resumes_without_duplicates_and_rejects_over_long(tmp_path: Path, demo_search: object,
                                                                   demo_question: SFTQuestion) -> None:
    tools = {"local_search": demo_search}
    teacher = EvidenceChainTeacher(demo_search)  # type: ignore[arg-type]
    report = asyncio.run(generate([demo_question], tmp_path, teacher, tools, variants=3))  # type: ignore[arg-type]
    assert report.outcomes == {"kept": 3}
    path = tmp_path / "trajectories.jsonl"
    first = path.read_text()
    whole = first.split("\n")[:2]
    path.write_text("\n".join(whole) + "\n" + first.split("\n")[2][:50])  # a crash cut the third line
    lines: list[str] = []
    report = asyncio.run(generate([demo_question], tmp_path, teacher, tools, variants=3,  # type: ignore[arg-type]
                                  progress=lambda k, o: lines.append(k)))
    assert lines == [f"{demo_question.id}#2"] and report.skipped_done == 2
    records = read_lines(path)
    assert sorted(r["key"] for r in records) == [f"{demo_question.id}#{v}" for v in range(3)]
    assert path.read_text() == first  # the redone line is identical: seeded wording and call ids
    ex = next(kept_examples(tmp_path))
    assert [m["role"] for m in ex["messages"]] == ["system", "user", "assistant"]
    assert ex["messages"][0]["content"].startswith("You are an autonomous research agent")
    long_dir = tmp_path / "long"
    report = asyncio.run(generate([demo_question], long_dir, teacher, tools,  # type: ignore[arg-type]
                                  count_tokens=lambda _m: 9000, context_tokens=8192))
    assert report.outcomes == {"too_long": 1} and not list(kept_examples(long_dir))


def test_generate_refuses_to_resume_a_folder_another_teacher_wrote(tmp_path: Path, demo_search: object,
                                                                   demo_question: SFTQuestion) -> None:
    tools = {"local_search": demo_search}
    teacher = EvidenceChainTeacher(demo_search)  # type: ignore[arg-type]
    asyncio.run(generate([demo_question], tmp_path, teacher, tools))  # type: ignore[arg-type]
    path = tmp_path / "trajectories.jsonl"
    older = path.read_text().replace(f'"teacher": "{TEACHER_NAME}"', '"teacher": "evidence-chain/1"')
    assert older != path.read_text()
    path.write_text(older)  # as an earlier version of the teacher left it
    with pytest.raises(ValueError, match="evidence-chain/1, not evidence-chain/5"):
        asyncio.run(generate([demo_question], tmp_path, teacher, tools, variants=2))  # type: ignore[arg-type]
    assert path.read_text() == older  # nothing appended


# -- the LLM teacher against an OpenAI-compatible endpoint --------------------------------------------------------------


def _teacher_reply(request: dict) -> str:
    user = request["messages"][1]["content"]
    if "Your research so far" not in user:
        return PLAN.replace("<think>", "<scratchpad>").replace("</think>", "</scratchpad>") + \
            '\n<call_tool name="Search-Local">Haymo of Faversham'
    sid = re.findall(r'<snippet id="([^"]+)"', user)[0]
    return FINAL.replace("00000000-0", sid)


def test_llm_teacher_runs_the_projects_tools_and_is_post_processed(openai_standin: object, demo_search: object,
                                                                   demo_question: SFTQuestion, tmp_path: Path) -> None:
    from learning.sft.llm_teacher import LLMTeacher

    standin = openai_standin
    standin.responder = _teacher_reply  # type: ignore[attr-defined]
    tools = {"local_search": demo_search}
    teacher = LLMTeacher(standin.root, "teacher-x", tools)  # type: ignore[attr-defined,arg-type]
    report = asyncio.run(generate([demo_question], tmp_path, teacher, tools))  # type: ignore[arg-type]
    assert report.outcomes == {"kept": 1}
    ex = next(kept_examples(tmp_path))
    text = ex["messages"][2]["content"]
    assert ex["teacher"] == "llm:teacher-x"
    assert "<scratchpad>" not in text and '<call_tool name="local_search">Haymo of Faversham</call_tool>' in text
    assert "Haymo of Faversham" in text[ex["tool_spans"][0][0]:ex["tool_spans"][0][1]]  # the real tool ran
    first = standin.chat_requests[0].json  # type: ignore[attr-defined]
    assert "research-planning" in first["messages"][0]["content"]


@pytest.mark.parametrize("mode", ["http-500", "empty", "answers-without-searching", "timeout"])
def test_a_failing_teacher_is_counted_never_written(openai_standin: object, demo_search: object,
                                                     demo_question: SFTQuestion, tmp_path: Path, mode: str) -> None:
    from learning.sft.llm_teacher import LLMTeacher
    from tests.judge.openai_standin import Reply

    standin = openai_standin
    held = threading.Event()  # the timeout's reply is sent only after the test: the timeout is certain under load
    replies = {"http-500": Reply(status=500), "empty": Reply(content=""),
               "answers-without-searching": Reply(content="<scratchpad>easy</scratchpad><answer>Latin</answer>"),
               "timeout": Reply(content="late", hold=held)}
    standin.responder = lambda _req: replies[mode]  # type: ignore[attr-defined]
    tools = {"local_search": demo_search}
    teacher = LLMTeacher(standin.root, "t", tools, timeout_s=2.0)  # type: ignore[attr-defined,arg-type]
    try:
        report = asyncio.run(generate([demo_question], tmp_path, teacher, tools))  # type: ignore[arg-type]
    finally:
        held.set()
    expected = "missing_structure" if mode == "answers-without-searching" else "teacher_error"
    assert report.outcomes == {expected: 1}
    assert not list(kept_examples(tmp_path))


# -- the exact label mask ----------------------------------------------------------------------------------------------


def test_label_mask_trains_exactly_the_model_written_tokens(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    from learning.sft.train import IGNORE, encode

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    model_1 = '<think>plan</think>\n<call_tool name="local_search">Haymo</call_tool>'
    tool = '\n<tool_output>\n<snippet id="ab12cd34-0">\nSECRET TOOL TEXT\n</snippet>\n</tool_output>\n'
    model_2 = '<think>ok</think>\n<answer><cite id="ab12cd34-0">Latin</cite></answer>'
    content = model_1 + tool + model_2
    example = {"id": "m", "messages": [{"role": "system", "content": "SYSTEM WORDS"},
                                       {"role": "user", "content": "USER WORDS"},
                                       {"role": "assistant", "content": content}],
               "tool_spans": [[len(model_1), len(model_1) + len(tool)]]}
    enc = encode(tok, example)
    text = tok.apply_chat_template(example["messages"], tokenize=False)
    start = text.index(content)
    written = set(range(start, start + len(model_1))) | set(range(start + len(model_1) + len(tool),
                                                                  start + len(content) + len("<|im_end|>")))
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert len(offsets) == len(enc.labels) == len(enc.input_ids)
    for i, (a, b) in enumerate(offsets):
        expected = b > a and set(range(a, b)) <= written
        assert (enc.labels[i] != IGNORE) == expected, (i, text[a:b])
        assert enc.labels[i] in (IGNORE, enc.input_ids[i])
    trained = tok.decode([t for t in enc.labels if t != IGNORE])
    assert "SYSTEM" not in trained and "USER" not in trained and "SECRET" not in trained
    assert trained.startswith("<think>plan</think>") and trained.endswith("</answer><|im_end|>")
    assert "Haymo</call_tool" in trained and '<cite id="ab12cd34-0">Latin</cite>' in trained


# -- training: LoRA only, exact resume ---------------------------------------------------------------------------------


def _tiny_examples() -> list[dict]:
    out = []
    for n, (q, a) in enumerate([("Capital of France?", "Paris"), ("Colour of the sky?", "blue")]):
        content = (f'<think>{q}</think>\n<call_tool name="local_search">{q}</call_tool>'
                   f'\n<tool_output>\nnoise {n}\n</tool_output>\n<answer>{a}</answer>')
        s = content.index("\n<tool_output>")
        e = content.index("</tool_output>\n") + len("</tool_output>\n")
        out.append({"id": str(n), "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": q},
                                               {"role": "assistant", "content": content}], "tool_spans": [[s, e]]})
    return out


@pytest.mark.slow
def test_tiny_sft_changes_every_lora_parameter_and_no_base_parameter(smollm2_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from learning.model import load_trainable
    from learning.sft.train import preset, train_sft

    cfg = preset("tiny", gradient_checkpointing=False, dtype="float32")
    base, _ = load_trainable(smollm2_dir, lora=None, dtype="float32", gradient_checkpointing=False)
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    result = train_sft(_tiny_examples(), smollm2_dir, tmp_path, cfg, max_steps=2)
    assert result.steps == 2 and (result.adapter / "rubricem.json").is_file()
    assert json.loads((result.adapter / "rubricem.json").read_text())["kind"] == "sft"
    fresh, _ = load_trainable(smollm2_dir, lora=cfg.lora, dtype="float32", gradient_checkpointing=False, seed=0)
    init = {n: p.detach().clone() for n, p in fresh.named_parameters() if p.requires_grad}
    saved = load_file(str(result.adapter / "adapter_model.safetensors"))
    assert len(saved) == len(init) > 0
    for name, value in saved.items():
        key = next(n for n in init if n.replace(".default", "") == name)
        assert not torch.equal(value, init[key].to(value.dtype)), f"LoRA parameter {name} did not change"
    assert all("lora_" in k for k in saved)  # the adapter holds LoRA weights only
    trained = {n.replace("base_model.model.", "", 1).replace(".base_layer", ""): p
               for n, p in result.model.named_parameters() if "lora_" not in n}
    assert trained.keys() == before.keys()
    for n, p in trained.items():
        assert torch.equal(p, before[n]), f"base parameter {n} changed"


@pytest.mark.slow
def test_resume_after_an_interruption_takes_the_same_next_step(smollm2_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from learning.sft.train import preset, train_sft

    cfg = preset("tiny", gradient_checkpointing=False, dtype="float32", epochs=2.0)
    straight = train_sft(_tiny_examples(), smollm2_dir, tmp_path / "a", cfg, max_steps=3)
    train_sft(_tiny_examples(), smollm2_dir, tmp_path / "b", cfg, max_steps=2)  # "killed" after step 2
    messages: list[str] = []
    resumed = train_sft(_tiny_examples(), smollm2_dir, tmp_path / "b", cfg, max_steps=3,
                        on_step=lambda r: messages.append(str(r.get("message", ""))))
    assert "resumed from checkpoint step 2" in messages
    assert [r["step"] for r in resumed.metrics] == [1, 2, 3]
    assert resumed.metrics[2]["loss"] == straight.metrics[2]["loss"]
    a = load_file(str(straight.adapter / "adapter_model.safetensors"))
    b = load_file(str(resumed.adapter / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_second_stage_continues_from_the_shipped_adapter_and_provenance_lists_both(smollm2_dir: Path,
                                                                                     tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from learning.sft.ship import ship, shipped_stages
    from learning.sft.train import preset, train_sft

    data = tmp_path / "data"
    data.mkdir()
    (data / "report.json").write_text(json.dumps({"outcomes": {"kept": 2}}))
    dest = tmp_path / "shipped"
    cfg = preset("tiny", gradient_checkpointing=False, dtype="float32")
    train_sft(_tiny_examples(), smollm2_dir, tmp_path / "run", cfg, max_steps=1)
    stage1 = load_file(str(ship(data, dest, [tmp_path / "run"]) / "adapter_model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in stage1.values())
    second = train_sft(_tiny_examples(), smollm2_dir, tmp_path / "run-2", replace(cfg, seed=1), init_adapter=dest,
                       max_steps=1)
    assert second.meta["init_adapter"] == str(dest)
    shipped = ship(data, dest, [tmp_path / "run", tmp_path / "run-2"])
    final = load_file(str(shipped / "adapter_model.safetensors"))
    trained = load_file(str(second.adapter / "adapter_model.safetensors"))
    assert final.keys() == stage1.keys() == trained.keys()
    assert all(torch.equal(final[k], trained[k].to(torch.bfloat16)) for k in final)
    assert any(not torch.equal(final[k], stage1[k]) for k in final)  # stage 2 moved on from stage 1
    provenance = (shipped / "PROVENANCE.md").read_text()
    assert "- stage 1:" in provenance and "- stage 2:" in provenance and "--init-adapter" in provenance
    assert json.loads((shipped / "rubricem.json").read_text())["stages"] == 2
    # No path of the training machine ships: the base model is named by its public id.
    assert json.loads((shipped / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    # A later stage ships on a machine without the earlier runs: their recorded blocks are kept, numbered on.
    before = shipped_stages(dest)
    assert [b.split(":")[0] for b in before] == ["- stage 1", "- stage 2"]
    with pytest.raises(ValueError, match="not from the shipped adapter"):  # stage 1 started from the base model
        ship(data, dest, [tmp_path / "run"], after_shipped=True)
    with pytest.raises(ValueError, match="records no stage"):
        ship(data, tmp_path / "empty", [tmp_path / "run-2"], after_shipped=True)
    assert shipped_stages(dest) == before and not (tmp_path / "empty").exists()  # refused: nothing written
    train_sft(_tiny_examples(), smollm2_dir, tmp_path / "run-3", replace(cfg, seed=2), init_adapter=dest,
              max_steps=1)
    shutil.rmtree(tmp_path / "run")  # the earlier runs are gone, as on another machine
    third = ship(data, dest, [tmp_path / "run-3"], after_shipped=True)
    provenance = (third / "PROVENANCE.md").read_text()
    assert shipped_stages(third)[:2] == before
    assert "- stage 3:" in provenance and "- stage 4:" not in provenance
    assert json.loads((third / "rubricem.json").read_text())["stages"] == 3
