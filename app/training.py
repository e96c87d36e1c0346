"""Composition of a training run: the run's own session log and bank, the research service that rolls out, the
judges and the reflection writer, handed to `learning.grpo.train` (which knows nothing about the app)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.container import Say, build_judge, build_policy, build_reflection_judge, ensure_corpus, open_index
from app.service import ResearchService
from app.settings import Settings
from learning.grpo import TrainerParts
from learning.train_config import TrainConfig
from store.records import Trajectory
from store.rubric_bank import RubricBank
from store.session_log import SessionLog


def run_dir(settings: Settings, cfg: TrainConfig) -> Path:
    """The run folder: the config's out_dir, else DATA_DIR/runs/NAME."""
    return cfg.out_dir or settings.store.data_dir / "runs" / cfg.name


def load_pairs_pool(cfg: TrainConfig) -> list[Any] | None:
    """The query-rubric pairs when `cfg.questions` is a DeepRubric pairs.jsonl, else None.

    Raises:
        PairsFileError: a malformed pairs file (the message names the line); also when reward = "deeprubric" and the
            question file is not a pairs file.
    """
    from learning.deeprubric.pairs import PairsFileError, is_pairs_file, load_pairs

    if cfg.questions is None:
        return None
    if is_pairs_file(cfg.questions):
        return load_pairs(cfg.questions, minimum=2)
    if cfg.reward == "deeprubric":
        raise PairsFileError(f"{cfg.questions}: reward = 'deeprubric' needs a pairs.jsonl (records with 'question' "
                             "and 'rubrics'), as `rubricem deeprubric build` writes")
    return None


def question_pool(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """(training questions, held-out questions): the last `heldout_questions` of the pool are held out."""
    from learning.questions import bundled_questions, load_questions

    pairs = load_pairs_pool(cfg)
    if pairs is not None:
        pool = [p.question for p in pairs]
    else:
        pool = load_questions(cfg.questions) if cfg.questions else bundled_questions(cfg.n_questions, cfg.seed)
    if cfg.heldout_questions >= len(pool) - 1:
        raise ValueError(f"heldout_questions={cfg.heldout_questions} leaves fewer than 2 training questions")
    cut = len(pool) - cfg.heldout_questions
    return pool[:cut], pool[cut:]


def rubric_reward(settings: Settings, pairs: list[Any], judge: Any, say: Say = lambda _m: None) -> Any:
    """The DeepRubric reward over the pairs: criteria scored through the LLM judge's client (same endpoint, cache and
    cost accounting) when the run's judge is the LLM judge, else by the offline MiniLM approximation (said once)."""
    from learning.deeprubric.scorer import LLMCriterionScorer, OfflineCriterionScorer, RubricReward

    if judge.kind == "llm":
        scorer: Any = LLMCriterionScorer(judge.client)
    else:
        say("DeepRubric reward without a judge endpoint: criteria are scored by MiniLM similarity (approximate).")
        scorer = OfflineCriterionScorer(settings.store.embedding_model)
    return RubricReward({p.question: p for p in pairs}, scorer)


def verifiable_judge(judge: Any, cfg: TrainConfig, questions: list[str], say: Say = lambda _m: None) -> Any:
    """`judge` with the verifiable Answer-stage term (learning/judge/verifiable.py) for the pool's questions that
    carry a gold answer in the question file; says how many do (none: every judgement records why nothing was
    added)."""
    from learning.eval.heldout import normalize_question
    from learning.judge.verifiable import VerifiableJudge, load_golds

    golds = load_golds(cfg.questions) if cfg.questions is not None else {}
    have = sum(1 for q in questions if normalize_question(q) in golds)
    say(f"verifiable reward term (weight {cfg.verifiable_weight:g}): {have} of {len(questions)} training questions "
        "carry a gold answer" + ("; the others are judged as before" if have < len(questions) else ""))
    return VerifiableJudge(judge, golds, cfg.verifiable_weight)


def build_trainer(settings: Settings, cfg: TrainConfig, say: Say = lambda _m: None) -> tuple[TrainerParts, Path]:
    """Everything `learning.grpo.train` needs, and the run folder."""
    from learning.engines.weights import ensure_converted
    from learning.reflection.writer import write_reflection

    from learning.eval.heldout import heldout_guard, heldout_index, load_heldout, refuse_heldout

    train_q, _held = question_pool(cfg)  # a bad question or pairs file fails here, before any model is loaded
    heldout = heldout_index(load_heldout())
    refuse_heldout(train_q, heldout, "the training question pool")  # the project's held-out split never trains
    pairs = load_pairs_pool(cfg)
    folder = run_dir(settings, cfg)
    folder.mkdir(parents=True, exist_ok=True)
    if cfg.judge == "offline":
        settings = settings.model_copy(update={"learning": settings.learning.model_copy(update={
            "judge": settings.learning.judge.model_copy(update={"base_url": None})})})
    policy = build_policy(settings, say)
    log = SessionLog(folder / "rollouts.sqlite3")
    index = open_index(settings)
    ensure_corpus(index, say)
    from agent.tools.registry import build_tools

    tools = build_tools(settings.agent, index)
    # The run's reflections live in a bank of their own: they reach the app's bank only with a promoted policy.
    store = settings.store.model_copy(update={"bank": settings.store.bank.model_copy(update={
        "collection": f"{settings.store.bank.collection}_run_{cfg.name}"})})
    bank = RubricBank(store, heldout=heldout_guard())  # issue 62: held-out questions never enter a bank
    service = ResearchService(policy, tools, log, settings.agent, bank)
    judge = build_judge(settings, log, say)
    if cfg.judge == "llm" and judge.kind != "llm":
        raise ValueError("judge = 'llm' needs RUBRICEM_LEARNING__JUDGE__BASE_URL and __MODEL")
    plain_judge = judge  # the DeepRubric scorer reads the LLM judge's client, which the wrapper below does not have
    if cfg.verifiable_weight > 0:
        judge = verifiable_judge(judge, cfg, train_q, say)
    reflection_judge = build_reflection_judge(settings, say)

    async def run_session(question: str, options: Any) -> tuple[str, Trajectory]:
        out = await service.run(question, options, source="rollout")
        return out.session_id, out.trajectory

    async def reflect(session_id: str, seed: int) -> str | None:
        outcome = await write_reflection(
            session_id, log=log, policy=policy, judge=reflection_judge, bank=bank,
            candidates=cfg.reflection_candidates, threshold=cfg.reflection_threshold,
            max_tokens=cfg.reflection_tokens, seed=seed)
        return outcome.batch_id if outcome.candidates else None

    model_dir = cfg.model_dir or settings.agent.embedded_model_path or ensure_converted(settings.store.model_cache)
    parts = TrainerParts(policy=policy, run_session=run_session, log=log, judge=judge, model_dir=Path(model_dir),
                         questions=train_q, reflect=reflect if cfg.reflection else None, bank=bank,
                         concurrent_rollouts=settings.agent.policy_backend != "embedded", heldout=heldout)
    if pairs is not None:
        from learning.deeprubric.pairs import persistent_by_question

        parts.persistent = persistent_by_question(pairs)
        if cfg.reward == "deeprubric":
            parts.rubric_reward = rubric_reward(settings, pairs, plain_judge, say)
    return parts, folder
