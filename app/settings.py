"""One Settings object, built once from RUBRICEM_* environment variables and an optional .env file.

Nested sections use "__": e.g. RUBRICEM_AGENT__POLICY_BACKEND=vllm, RUBRICEM_STORE__DATA_DIR=/srv/rubricem.
Every variable is listed in .env.example.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.accounting import ModelPrice
from agent.config import AgentConfig
from agent.telemetry import TracingOptions
from learning.config import LearningConfig
from store.config import StoreConfig


class UIConfig(BaseModel):
    """Research chat UI settings (env: RUBRICEM_UI__<FIELD>)."""

    host: str = Field(default="127.0.0.1", description="Address `rubricem ui` binds; not loopback needs a login.")
    port: int = Field(default=8501, ge=1, le=65535, description="Port `rubricem ui` listens on.")
    password: SecretStr | None = Field(default=None, description="Shared login password, at least 12 characters: "
                                       "logs in as shared:user, one identity for everyone who knows it (several "
                                       "people: named accounts).")
    admin_password: SecretStr | None = Field(default=None, description="Shared admin password (at least 12 "
                                             "characters): logs in as shared:admin, with admin actions.")
    oidc: bool = Field(default=False, description="Log in through Streamlit's built-in OIDC (st.login); needs an "
                       "[auth] section in .streamlit/secrets.toml.")
    admin_emails: list[str] = Field(default_factory=list, description="OIDC users (by e-mail) who are admins, as a "
                                    "JSON list; only an address the provider marks email_verified=true counts.")
    login_free_attempts: int = Field(default=5, ge=1, le=100, description="Failed logins per client address and "
                                     "per account name before each further try waits (2 s, 4 s, 8 s ...).")
    login_max_backoff_s: float = Field(default=900.0, gt=0, le=86400, description="Longest wait after failed "
                                       "logins, seconds (a UI restart forgets every count).")
    login_checks_per_s: float = Field(default=5.0, gt=0, le=1000, description="Password checks (bcrypt) the UI "
                                      "does per second at most, over all visitors; more attempts are asked to wait.")
    trusted_proxies: list[str] = Field(default_factory=list, description="Addresses or networks (JSON list, e.g. "
                                       '["127.0.0.1"]) of reverse proxies whose X-Forwarded-For names the client; '
                                       "empty: the login limit counts the connecting address and ignores the header.")

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: list[str]) -> list[str]:
        """Each entry an IP address or network: anything else (a host name, "*") would make uvicorn trust a literal
        string or every peer, and a forged header would again choose the address the login limit counts."""
        for entry in value:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError as exc:
                raise ValueError(f"ui.trusted_proxies: {entry!r} is not an IP address or network") from exc
        return [entry.strip() for entry in value]

    @field_validator("password", "admin_password", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """An empty password (e.g. `RUBRICEM_UI__ADMIN_PASSWORD=` from compose) means none, never "log in with ''"."""
        if value is None or (isinstance(value, str | SecretStr) and not str(
                value.get_secret_value() if isinstance(value, SecretStr) else value).strip()):
            return None
        return value


class McpServeConfig(BaseModel):
    """`rubricem mcp`, the agent as an MCP server (env: RUBRICEM_MCP__<FIELD>)."""

    transport: Literal["stdio", "http"] = Field(default="stdio", description="stdio (a desktop client starts the "
                                                "process) or http (streamable HTTP on host:port).")
    host: str = Field(default="127.0.0.1", description="Address the HTTP transport binds; anything but exactly "
                      "127.0.0.1, localhost or ::1 needs a token.")
    port: int = Field(default=8765, ge=1, le=65535, description="Port of the HTTP transport.")
    path: str = Field(default="/mcp", pattern=r"^/[A-Za-z0-9_./-]*$", description="Endpoint path of the HTTP "
                      "transport.")
    token: SecretStr | None = Field(default=None, description="Bearer token HTTP clients must send, at least 32 "
                                    "characters (required off 127.0.0.1, localhost and ::1).")
    allowed_hosts: list[str] = Field(default_factory=list, description="Extra Host names (name or name:port) HTTP "
                                     "clients may use besides the bind address, as a JSON list; required when binding "
                                     "0.0.0.0 or :: (DNS-rebinding protection).")
    owner: str = Field(default="mcp", min_length=1, max_length=254, pattern=r"^[^\x00-\x1f\x7f]+$",
                       description="The one identity every MCP caller acts as: it owns the sessions MCP research "
                       "creates and sees only those (not the CLI's `local` ones, nor UI users'). Name a UI account to "
                       "let that person see them in their history.")
    max_concurrent_runs: int = Field(default=1, ge=1, le=64, description="Research runs the MCP server does at once; "
                                     "a call over the limit is refused with a busy message.")

    @field_validator("token", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """An empty token means none, never "authenticate with ''"."""
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        return None if isinstance(text, str) and not text.strip() else value


class SessionsConfig(BaseModel):
    """Durable sessions, plan approval and clarification before planning (issue 21)."""

    checkpoints: bool = Field(default=True, description="Checkpoint every step of a session on LangGraph's "
                              "checkpointer, so `rubricem resume` continues a session cut off by a crash.")
    keep_checkpoints: bool = Field(default=False, description="Keep a session's checkpoints after it ends (by "
                                   "default they are pruned when it completes, fails or is rejected).")
    approval_expiry_s: float = Field(default=86400.0, gt=0, description="A plan waiting for approval (or a "
                                     "clarifying question waiting for its answer) expires after this many seconds "
                                     "(the session then ends, failed).")
    clarify: Literal["auto", "on", "off"] = Field(
        default="auto", description="Before planning, let the policy ask the user one question when the request is "
        "ambiguous (chat and `rubricem ask`; batch, eval and MCP never ask). auto: on for endpoint policies (vllm, "
        "llamacpp), off for the embedded model.")
    heartbeat_s: float = Field(default=20.0, gt=0, le=3600, description="The process running a session renews its "
                               "lease this often, seconds.")
    lease_s: float = Field(default=90.0, gt=0, le=86400, description="A session's lease lasts this long after each "
                           "heartbeat, seconds; once it lapses the process is taken to be gone: the session shows as "
                           "interrupted and `rubricem resume` may take it over. Longer than heartbeat_s.")
    max_runs_per_person: int = Field(default=2, ge=1, le=1000, description="Chat research runs one person may have "
                                     "going at once (a page left mid-run still counts until its run ends).")
    max_runs_total: int = Field(default=4, ge=1, le=10000, description="Chat research runs going at once in one UI "
                                "process, everyone together (they all share one model).")
    user_max_wall_clock_s: float = Field(default=900.0, gt=0, description="Longest time limit a non-admin may give "
                                         "one chat run, seconds (admins: up to 3600).")
    user_max_tool_calls: int = Field(default=10, ge=0, le=50, description="Most tool calls a non-admin may give one "
                                     "chat run (admins: up to 50).")
    batch_max_questions: int = Field(default=10000, ge=1, description="Most questions one `rubricem batch` file may "
                                     "hold (the file is read line by line).")

    @model_validator(mode="after")
    def _heartbeat_inside_lease(self) -> SessionsConfig:
        """A heartbeat slower than the lease would let a live run's session look interrupted, and be taken over."""
        if self.heartbeat_s >= self.lease_s:
            raise ValueError(f"sessions.heartbeat_s ({self.heartbeat_s}) must be shorter than sessions.lease_s "
                             f"({self.lease_s})")
        return self


class UploadsConfig(BaseModel):
    """Documents added from the chat (env: RUBRICEM_UPLOADS__<FIELD>): caps that keep one upload from exhausting the
    machine (issue 34)."""

    max_file_bytes: int = Field(default=25_000_000, ge=1, description="Largest file one upload may hold, bytes; the "
                                "upload is copied to disk in pieces and refused past this.")
    pdf_max_bytes: int = Field(default=25_000_000, ge=1, description="Largest PDF that is ingested (uploads and "
                               "`rubricem ingest`), bytes.")
    pdf_max_pages: int = Field(default=500, ge=1, description="Most pages a PDF may have; more is refused before "
                               "any text is extracted.")
    pdf_max_text_chars: int = Field(default=5_000_000, ge=1, description="Most text extracted from one PDF, "
                                    "characters; a PDF that decompresses to more (a PDF bomb) is refused.")


class PolicyServerConfig(BaseModel):
    """`rubricem policy-server`: a local vLLM (the CPU build from `make vllm`) serving the policy; its host, port and
    served name come from RUBRICEM_AGENT__POLICY_BASE_URL and __POLICY_MODEL (env: RUBRICEM_POLICY_SERVER__<FIELD>)."""

    python: Path | None = Field(default=None, description="Interpreter of the vLLM environment (default: "
                                "<project>/.vllm/bin/python, which `make vllm` creates).")
    kv_cache_gib: float = Field(default=1.0, gt=0, le=256, description="KV cache of the CPU backend, GiB "
                                "(VLLM_CPU_KVCACHE_SPACE).")
    max_model_len: int = Field(default=4096, ge=256, description="Context window the server accepts, tokens.")
    max_lora_rank: int = Field(default=16, ge=1, le=512, description="Largest adapter rank it loads (the CPU LoRA "
                               "kernels pad to it: keep it at the adapters' rank).")
    max_loras: int = Field(default=1, ge=1, le=64, description="Adapters served in one batch; requests for another "
                           "wait for the batch, they are not refused.")
    cpu_bind: str = Field(default="all", pattern=r"^(all|auto|[0-9][0-9,\-]*)$", description="OpenMP cores of the "
                          "worker: all (every core), auto (vLLM's choice, which keeps one for its front end), or a "
                          "list like 0-1.")
    omp_wait_policy: Literal["passive", "default"] = Field(default="passive", description="What the worker's "
                                                            "OpenMP threads do while they wait (OMP_WAIT_POLICY): "
                                                            "passive sleeps at once, so a trainer beside the server "
                                                            "keeps its share of the cores; default is OpenMP's own "
                                                            "(spin a while, then sleep). Measured in docs/speed.md.")
    reserved_cpus: int = Field(default=0, ge=0, description="Cores vLLM keeps for its front end "
                               "(VLLM_CPU_NUM_OF_RESERVED_CPU).")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(default="auto", description="The weights' dtype: auto "
                                                          "serves bfloat16 where the CPU has bf16 instructions "
                                                          "(AVX-512 BF16 or AMX-BF16) and float32 elsewhere, where "
                                                          "bf16 is emulated.")
    start_timeout_s: float = Field(default=600.0, gt=0, description="How long `rubricem policy-server` waits for "
                                   "vLLM to serve, seconds.")


class TelemetryConfig(BaseModel):
    """Traces and metrics (env: RUBRICEM_TELEMETRY__<FIELD>; issue 36). Traces are exported only when the standard
    OTEL_EXPORTER_OTLP_ENDPOINT is set."""

    record_question_text: bool = Field(default=False, description="Put the question's text on session spans (off: "
                                       "only its length; questions can be personal).")
    export_timeout_s: float = Field(default=5.0, gt=0, le=60, description="One span export gives up after this "
                                    "many seconds; the batch is dropped with a warning, the session never waits.")
    max_queue_size: int = Field(default=4096, ge=16, le=1_000_000, description="Spans held for export; past this "
                                "new spans are dropped (a slow or dead trace backend never grows memory).")
    metrics_host: str = Field(default="127.0.0.1", description="Address the scheduler's Prometheus endpoint binds.")
    metrics_port: int = Field(default=9464, ge=0, le=65535, description="Port of the scheduler's Prometheus "
                              "endpoint (/metrics); 0 turns it off.")
    metrics_allowed_hosts: list[str] = Field(default_factory=list, description="Extra Host names (name or name:port) "
                                             "scrapers may use besides the bind address, as a JSON list; required "
                                             "when binding 0.0.0.0 or :: (DNS-rebinding protection).")


class Settings(BaseSettings):
    """All configuration of the application."""

    model_config = SettingsConfigDict(
        env_prefix="RUBRICEM_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    agent: AgentConfig = AgentConfig()
    learning: LearningConfig = LearningConfig()
    store: StoreConfig = StoreConfig()
    ui: UIConfig = UIConfig()
    mcp: McpServeConfig = McpServeConfig()
    sessions: SessionsConfig = SessionsConfig()
    uploads: UploadsConfig = UploadsConfig()
    policy_server: PolicyServerConfig = PolicyServerConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    # The price table (RUBRICEM_PRICES, JSON): {"model": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}}. Empty:
    # every model costs 0; otherwise a model it does not list has an unknown cost (agent/accounting.py).
    prices: dict[str, ModelPrice] = Field(default_factory=dict, description="Price table, USD per million tokens in "
                                          "and out, per model name, as JSON; empty: every model costs 0, otherwise "
                                          "an unlisted model's cost is unknown.")
    # The OpenTelemetry SDK's standard variables (no RUBRICEM_ prefix), read here so that only this module reads the
    # environment.
    otel_exporter_otlp_endpoint: str | None = Field(default=None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
                                                    description="OTLP base URL; set, spans are exported.")
    otel_exporter_otlp_protocol: Literal["http/protobuf", "grpc"] = Field(
        default="http/protobuf", validation_alias="OTEL_EXPORTER_OTLP_PROTOCOL", description="OTLP protocol.")
    otel_exporter_otlp_headers: SecretStr | None = Field(default=None, validation_alias="OTEL_EXPORTER_OTLP_HEADERS",
                                                         description="OTLP headers, key=value,key2=value2.")
    otel_service_name: str = Field(default="rubricem", validation_alias="OTEL_SERVICE_NAME",
                                   description="service.name of the spans.")

    def tracing_options(self) -> TracingOptions | None:
        """What `agent.telemetry.configure_tracing` needs, or None when no OTLP endpoint is set (tracing off)."""
        endpoint = (self.otel_exporter_otlp_endpoint or "").strip()
        if not endpoint:
            return None
        headers: dict[str, str] = {}
        raw = self.otel_exporter_otlp_headers.get_secret_value() if self.otel_exporter_otlp_headers else ""
        for part in raw.split(","):
            key, sep, value = part.partition("=")
            if sep and key.strip():
                headers[key.strip()] = value.strip()
        t = self.telemetry
        return TracingOptions(endpoint=endpoint, protocol=self.otel_exporter_otlp_protocol, headers=headers,
                              service_name=self.otel_service_name, export_timeout_s=t.export_timeout_s,
                              max_queue_size=t.max_queue_size, record_question_text=t.record_question_text)


def _env_lines(model: type[BaseModel], prefix: str) -> list[str]:
    lines: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name.upper()}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            lines += _env_lines(ann, key + "__")
            continue
        default = field.get_default(call_default_factory=True)
        shown = "" if default is None or "key" in name else str(default)
        if isinstance(default, Path) and str(default).startswith(str(Path.home())):
            shown = "~" + str(default)[len(str(Path.home())):]
        lines.append(f"# {field.description or name}")
        lines.append(f"# {key}={shown}")
    return lines


def env_example() -> str:
    """The text of .env.example: every RUBRICEM_* variable with its description and default (a test keeps it true)."""
    head = [
        "# rubricem settings. Copy to .env (or export) and uncomment what you change.",
        "# Nested sections use a double underscore. Values shown are the defaults; keys are never committed.",
        "",
    ]
    body: list[str] = []
    standard: list[str] = []
    for section, field in Settings.model_fields.items():
        assert field.annotation is not None
        if isinstance(field.validation_alias, str):  # a standard variable of another tool (OpenTelemetry's)
            default = field.get_default(call_default_factory=True)
            standard += [f"# {field.description}", f"# {field.validation_alias}={'' if default is None else default}"]
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            body += [f"## {section}", *_env_lines(field.annotation, f"RUBRICEM_{section.upper()}__"), ""]
        else:
            body += [f"## {section}", f"# {field.description}", f"# RUBRICEM_{section.upper()}=", ""]
    body += ["## OpenTelemetry's standard variables (traces are exported only when the endpoint is set)", *standard, ""]
    return "\n".join(head + body)


def child_environment() -> dict[str, str]:
    """A copy of this process's environment, for a child process it starts (the local vLLM server, which keeps only
    an allow-listed part of it: `app.policy_server.server_env`): this module is the one place that reads the
    environment."""
    return dict(os.environ)
