"""Composition root: builds the real clients once from Settings and wires them together.

The in-process torch backend is imported lazily, only when `policy_backend = "embedded"`, so the HTTP-backed
deployment never loads torch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from chromadb.api import ClientAPI

from agent import telemetry
from agent.config import SHIPPED_SFT_ADAPTER
from agent.errors import AgentError, ToolConfigError
from agent.ingest import DEMO_SOURCE_PREFIX, ensure_demo_corpus
from agent.policy import LlamaCppPolicyClient, ReplicaSet, VLLMPolicyClient
from agent.protocols import PolicyClient, SearchTool
from agent.tools.mcp_client import discover_sync
from agent.tools.registry import BUILTIN_TOOL_NAMES, build_tools
from app.durable import LeaseTiming, sweep_leases
from app.service import ResearchService, adapter_version
from app.settings import Settings
from store.doc_index import DocIndex, open_index_client
from store.embeddings import embed_texts
from store.registry import Registry
from store.rubric_bank import RubricBank
from store.session_log import SessionLog

Say = Callable[[str], None]
Progress = Callable[[int, int], None]


log = logging.getLogger(__name__)

class ConfigurationError(AgentError):
    """The settings cannot produce a working setup (the message says what to change)."""


def enable_tracing(settings: Settings) -> bool:
    """Export this process's spans by OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set (issue 36); off and free otherwise.

    Called wherever a process builds what runs sessions, judges or cycles (`build`, `build_policy`, `build_judge`,
    `build_judge_client`, and so every entry point: the CLI, the UI, the scheduler, the MCP server, batch); the
    first call configures the process, later ones do nothing. Whether it is on is said once through the log.
    """
    return telemetry.configure_tracing(settings.tracing_options())


def build_policy(settings: Settings, say: Say = lambda _m: None) -> PolicyClient:
    """The policy client the settings ask for: one vLLM or llama.cpp server, or a `ReplicaSet` over several vLLM
    replicas (`policy_base_urls` with more than one URL)."""
    enable_tracing(settings)
    cfg = settings.agent
    key = cfg.policy_api_key.get_secret_value() if cfg.policy_api_key else None
    urls = cfg.policy_urls
    if len(urls) > 1 and cfg.policy_backend == "llamacpp":
        raise ConfigurationError(
            f"{len(urls)} policy URLs are set (RUBRICEM_AGENT__POLICY_BASE_URLS), but only the vllm backend serves "
            "replicas: set RUBRICEM_AGENT__POLICY_BACKEND=vllm, or give one URL")
    if cfg.policy_backend == "vllm":
        if len(urls) > 1:
            return ReplicaSet.from_config(cfg)
        return VLLMPolicyClient(urls[0], cfg.policy_model, api_key=key, timeout_s=cfg.policy_timeout_s,
                                max_retries=cfg.policy_max_retries)
    if cfg.policy_backend == "llamacpp":
        return LlamaCppPolicyClient(urls[0], cfg.policy_model, api_key=key,
                                    timeout_s=cfg.policy_timeout_s, max_retries=cfg.policy_max_retries)
    try:
        from learning.engines.local_policy import TransformersPolicyClient
        from learning.engines.weights import ensure_converted, ensure_tokenizer
    except ImportError as exc:  # the [local] extra is not installed
        raise ConfigurationError(
            f"the embedded backend needs the [local] extra (torch, transformers, peft): {exc}. "
            "Run `make install`, or set RUBRICEM_AGENT__POLICY_BACKEND=vllm|llamacpp."
        ) from exc
    model_dir = cfg.embedded_model_path
    adapter = base_adapter(settings)
    version = adapter_version(adapter) if adapter is not None else "base"
    if cfg.embedded_engine == "llamacpp":
        # llama.cpp decodes the GGUF itself: the tokenizer and config are all it needs from the folder (issue 47)
        tokenizer_dir = model_dir or ensure_tokenizer(settings.store.model_cache)
        llama = _llamacpp_policy(settings, tokenizer_dir, adapter, version, say)
        if llama is not None:
            return llama
    if model_dir is None:
        say("Preparing the bundled SmolLM2-135M-Instruct for torch (converted once to safetensors, then cached)...")
        model_dir = ensure_converted(settings.store.model_cache)
    return TransformersPolicyClient(model_dir, dtype=cfg.embedded_dtype, adapter_path=adapter, version=version,
                                    decode_attention=cfg.embedded_decode_attention,
                                    decode_matmul=cfg.embedded_decode_matmul,
                                    merge_adapter=cfg.embedded_merge_adapter,
                                    threads=cfg.embedded_threads or None, compile=cfg.embedded_compile)


def llamacpp_installed() -> bool:
    """Whether llama-cpp-python is installed, found without importing it (issue 65).

    `import llama_cpp` loads libllama at once (its module calls `load_shared_library` on import), so asking "is it
    there?" by importing would load the library before `LlamaCppEngine` checks it against its recorded digest
    (`llamacpp_build.verify_installed`); a spec lookup reads only the package's location. A package that is there but
    does not import fails where the engine first imports it, as PolicyUnavailable naming the import error."""
    import importlib.util

    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):  # a broken or half-removed install: treated as absent, and said so
        return False


def _llamacpp_policy(settings: Settings, model_dir: Path, adapter: Path | None, version: str,
                     say: Say) -> PolicyClient | None:
    """The embedded policy with llama.cpp decoding (`learning.engines.llamacpp_engine`): the tokenizer from
    `model_dir`, the weights from its GGUF (`embedded_gguf_path`, else the bundled GGUF when `model_dir` was
    converted from it), adapters converted to GGUF LoRA next to the model.

    None when llama.cpp cannot serve these weights (no GGUF of them, or llama-cpp-python missing) and the engine is
    the default rather than chosen: the caller decodes with torch, and `say` tells the user once. When the engine was
    set explicitly the same cases raise ConfigurationError.
    """
    cfg = settings.agent
    chosen = "embedded_engine" in cfg.model_fields_set

    def unavailable(reason: str) -> None:
        if chosen:
            raise ConfigurationError(f"RUBRICEM_AGENT__EMBEDDED_ENGINE=llamacpp: {reason}")
        say(f"Decoding with torch: {reason}.")
        log.warning("embedded engine llamacpp unavailable (%s); decoding with torch", reason)

    from learning.engines.weights import bundled_source

    if not llamacpp_installed():
        unavailable("llama-cpp-python is not installed; run `make install` (the [llamacpp] extra), or "
                    "set RUBRICEM_AGENT__EMBEDDED_ENGINE=torch")
        return None
    from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient

    gguf = cfg.embedded_gguf_path or bundled_source(model_dir)
    if gguf is None:
        unavailable(f"{model_dir} is not the bundled SmolLM2; set RUBRICEM_AGENT__EMBEDDED_GGUF_PATH to a GGUF of "
                    "the same weights")
        return None
    # next to the model, so every data folder that uses the same weights shares the conversions (keyed by content)
    cache = model_dir.parent if os.access(model_dir.parent, os.W_OK) else settings.store.model_cache
    return EmbeddedLlamaCppClient(model_dir, gguf, adapter_path=adapter, version=version,
                                  lora_cache=cache / "gguf-lora", threads=cfg.embedded_threads or None,
                                  cpu_variant=cfg.embedded_cpu_variant, merge_adapter=cfg.embedded_merge_adapter,
                                  base_q8=cfg.embedded_base_q8)


def base_adapter(settings: Settings) -> Path | None:
    """The adapter the embedded policy starts with, which the registry's `base` version stands for.

    An explicit `embedded_adapter_path`; else, for the bundled model (the only one it fits), the shipped SFT adapter
    unless `embedded_sft` is off; else None (the plain weights). A deployment whose live version is `base` serves this,
    and retraining from `base` starts from it (RL after SFT, METHOD §10).
    """
    cfg = settings.agent
    if cfg.policy_backend != "embedded":
        return None
    if cfg.embedded_adapter_path is not None:
        return cfg.embedded_adapter_path
    if cfg.embedded_model_path is None and cfg.embedded_sft and (SHIPPED_SFT_ADAPTER / "adapter_config.json").is_file():
        return SHIPPED_SFT_ADAPTER
    return None


def open_index(settings: Settings, client: ClientAPI | None = None) -> DocIndex:
    """The local document index (embedded Chroma or a Chroma server, per settings)."""
    return DocIndex(settings.store, client=client)


def open_bank(settings: Settings, client: ClientAPI | None = None, log: SessionLog | None = None) -> RubricBank:
    """The rubric bank (the same Chroma as the document index, its own collection); with the session log, a
    same-question hit is only ever the asker's own item (issue 34: `RubricBank.retrieve`). The held-out guard is
    always on (issue 62): no path writes or retrieves an item derived from a held-out question."""
    from learning.eval.heldout import heldout_guard
    from store.people import SessionOwners

    return RubricBank(settings.store, client=client, owners=SessionOwners(log) if log is not None else None,
                      heldout=heldout_guard())


def ensure_corpus(index: DocIndex, say: Say = lambda _m: None, progress: Progress | None = None) -> None:
    """Index the bundled demo corpus when the user has ingested nothing of their own; remove it once they have."""
    sources = index.sources()
    if any(not s.startswith(DEMO_SOURCE_PREFIX) for s in sources):
        demo = [s for s in sources if s.startswith(DEMO_SOURCE_PREFIX)]
        if demo:
            say("Your own documents are indexed: removing the bundled demo corpus from local_search.")
            for source in demo:
                index.delete_source(source)
        return
    if index.count() == 0:
        say("Indexing the bundled Wikipedia demo corpus (first use only)...")
    ensure_demo_corpus(index, progress=progress)


def build_mcp_tools(settings: Settings, builtin: dict[str, SearchTool], say: Say = lambda _m: None
                    ) -> dict[str, SearchTool]:
    """The configured MCP servers' tools (serving only: training and rollouts use the built-in tools).

    A server that cannot be listed is left out with a message through `say`; a tool name taken twice is a
    ConfigurationError, raised before anything is served.
    """
    cfg = settings.agent
    if not cfg.mcp_servers:
        return {}
    say(f"Listing the tools of {len(cfg.mcp_servers)} MCP server(s)...")
    try:
        found = discover_sync(cfg.mcp_servers, BUILTIN_TOOL_NAMES | set(builtin), snippet_chars=cfg.snippet_chars,
                              say=say)
    except ToolConfigError as exc:
        raise ConfigurationError(str(exc)) from exc
    if found:
        say(f"MCP tools offered: {', '.join(sorted(found))}")
    return dict(found)


@dataclass
class Services:
    """Everything the entry points use."""

    settings: Settings
    log: SessionLog
    index: DocIndex
    tools: dict[str, SearchTool]
    policy: PolicyClient
    research: ResearchService
    bank: RubricBank
    registry: Registry


def build(settings: Settings | None = None, say: Say = lambda _m: None, progress: Progress | None = None) -> Services:
    """Build every service for a research run."""
    settings = settings or Settings()
    enable_tracing(settings)
    settings.store.data_dir.mkdir(parents=True, exist_ok=True)
    policy = build_policy(settings, say)  # configuration errors surface before any indexing work
    log = SessionLog.from_config(settings.store)
    client = open_index_client(settings.store)
    index = open_index(settings, client)
    bank = open_bank(settings, client, log)
    ensure_corpus(index, say, progress)
    tools = build_tools(settings.agent, index)
    tools.update(build_mcp_tools(settings, tools, say))
    registry = Registry(log)
    uses = settings.agent.attribute_uncited or settings.agent.verify_citations
    embed = partial(embed_texts, model_name=settings.store.embedding_model) if uses else None
    research = ResearchService(policy, tools, log, settings.agent, bank, live=registry, embed=embed,
                               base_adapter=base_adapter(settings), durable=durable_sessions(settings, log),
                               lease=lease_timing(settings))
    sweep_leases(log, say)  # the process-start crash sweep: no session stays 'running' after its process is gone
    return Services(settings, log, index, tools, policy, research, bank, registry)


def lease_timing(settings: Settings) -> LeaseTiming:
    """How this process holds the sessions it runs (sessions.heartbeat_s / lease_s)."""
    return LeaseTiming(heartbeat_s=settings.sessions.heartbeat_s, lease_s=settings.sessions.lease_s)


def durable_sessions(settings: Settings, log: SessionLog) -> Any:
    """Checkpointing for the service's sessions (issue 21), or None when RUBRICEM_SESSIONS__CHECKPOINTS=false."""
    from app.durable import DurableSessions, clarify_default

    cfg = settings.sessions
    if not cfg.checkpoints:
        return None
    return DurableSessions.for_store(log, settings.store, keep_checkpoints=cfg.keep_checkpoints,
                                     approval_expiry_s=cfg.approval_expiry_s,
                                     clarify=clarify_default(cfg.clarify, settings.agent.policy_backend))


def build_judge_client(settings: Settings) -> Any:
    """The JSON judge client for a configured judge endpoint (ConfigurationError when the settings are unusable)."""
    from learning.judge.client import JudgeClient

    enable_tracing(settings)
    cfg = settings.learning.judge
    if not cfg.model.strip():
        raise ConfigurationError("a judge endpoint is set but no judge model: set RUBRICEM_LEARNING__JUDGE__MODEL")
    cache = (settings.learning.cache_dir or settings.store.data_dir / "judge-cache") if cfg.cache else None
    try:
        return JudgeClient.from_config(cfg, cache)
    except ValueError as exc:
        raise ConfigurationError(f"judge settings: {exc}") from exc


def build_judge(settings: Settings, log: SessionLog, say: Say = lambda _m: None) -> Any:
    """The LLM judge when a judge endpoint is configured, else the offline (approximate) judge."""
    enable_tracing(settings)
    cfg = settings.learning.judge
    if cfg.base_url:
        from learning.judge.llm import LLMJudge

        client = build_judge_client(settings)
        return LLMJudge(client, log, trajectory_chars=cfg.trajectory_chars,
                        citation_support_check=cfg.citation_support_check)
    from learning.judge.offline import OfflineJudge

    say("No judge endpoint configured (RUBRICEM_LEARNING__JUDGE__BASE_URL): using the offline judge — an "
        "approximate, embedding-similarity estimate, not a real grade.")
    return OfflineJudge(log, embedding_model=settings.store.embedding_model)


def build_reflection_judge(settings: Settings, say: Say = lambda _m: None) -> Any:
    """The LLM reflection judge when a judge endpoint is configured, else the offline (approximate) one."""
    if settings.learning.judge.base_url:
        from learning.judge.reflection import ReflectionJudge

        return ReflectionJudge(build_judge_client(settings), trajectory_chars=settings.learning.judge.trajectory_chars)
    from learning.judge.offline_reflection import OfflineReflectionJudge

    say("No judge endpoint configured: reflections are graded by the offline judge (an approximate heuristic).")
    return OfflineReflectionJudge(embedding_model=settings.store.embedding_model)
