"""Eval fixtures: the shared benchmark data (skipped when absent), a small real index over the bundled passages of the
first two corpus-paired HotpotQA questions, a scripted policy service and an OpenAI-compatible judge stand-in.

Only tests that read the shared benchmark files ask for `shared_data` or `wiki_dir`; the index and the scripted service
are built from the demo corpus bundled in the repository, so the runner's failure, resume and judge paths run on a
fresh clone too."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.tools.local_search import LocalSearch
from app.service import ResearchService
from store.doc_index import DocIndex
from store.session_log import SessionLog
from tests.eval.support import answering
from tests.fakes import ScriptedPolicy
from tests.indexes import passage_index
from tests.judge.openai_standin import OpenAIStandIn

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
WIKI = SHARED_DATA / "wiki_multihop_corpus"
# The context titles of the first two questions in wiki_multihop_corpus/hotpotqa_train.json ("If Gallu is a demon Lilu
# is what?", "Are Christopher Nolan and Sathish Kalathil both film directors?"); all are in the bundled demo corpus.
HOTPOT_TITLES = (
    "Demon Dice", "Demon algorithm", "Maha Sona", "Wangliang", "The Hythrun Chronicles", "Lilu (mythology)",
    "Leyenda de Azul", "Lilu (ancient China)", "Arthur? Arthur!", "Alû",
    "Christopher Nolan", "The Prestige (film)", "The Dark Knight Rises", "Veena Vaadanam", "Jalachhayam",
    "Sathish Kalathil", "Bangladesh Film Directors Association", "Influence of Stanley Kubrick",
    "Laloorinu Parayanullathu", "Zeitgeist Films",
)  # fmt: skip


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """/work/shared/data (located relative to the repo); the test is skipped when it is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(
            f"reads the shared benchmark files, not found at {SHARED_DATA} (only tests read them; the project "
            "never needs them)"
        )
    return SHARED_DATA


@pytest.fixture(scope="session")
def wiki_dir(shared_data: Path) -> Path:
    """The wiki_multihop_corpus folder (HotpotQA/MuSiQue questions paired with the bundled corpus)."""
    if not (WIKI / "hotpotqa_train.json").is_file():
        pytest.skip(f"{WIKI / 'hotpotqa_train.json'} not found")
    return WIKI


@pytest.fixture(scope="session")
def hotpot_index(tmp_path_factory: pytest.TempPathFactory) -> DocIndex:
    """A real index (Chroma + MiniLM + BM25) over the bundled demo-corpus passages of the first two HotpotQA questions
    (needs no shared data)."""
    return passage_index(tmp_path_factory.mktemp("eval-index"), lambda corpus: HOTPOT_TITLES)


@pytest.fixture
def hotpot_tools(hotpot_index: DocIndex) -> dict[str, LocalSearch]:
    """The real local_search tool over the small index."""
    return {"local_search": LocalSearch(hotpot_index, k=3, snippet_chars=300)}


@pytest.fixture
def scripted_service(hotpot_tools: dict, tmp_path: Path):  # type: ignore[type-arg]
    """make(answers, **agent_config) -> a real ResearchService over a ScriptedPolicy, the small index and a real
    SessionLog in tmp."""

    def make(answers: dict[str, str], **config: object) -> ResearchService:
        policy = ScriptedPolicy(answering(answers))
        log = SessionLog(tmp_path / f"sessions-{uuid.uuid4().hex[:8]}.sqlite3")
        return ResearchService(policy, hotpot_tools, log, AgentConfig(**config))  # type: ignore[arg-type]

    return make


@pytest.fixture
def standin() -> Iterator[OpenAIStandIn]:
    """A fresh OpenAI-compatible judge stand-in on 127.0.0.1."""
    server = OpenAIStandIn(model="standin-judge")
    try:
        yield server
    finally:
        server.close()
