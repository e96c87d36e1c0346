"""One Settings object, built once from RUBRICEM_* environment variables and an optional .env file.

Nested sections use "__": e.g. RUBRICEM_AGENT__POLICY_BACKEND=vllm, RUBRICEM_STORE__DATA_DIR=/srv/rubricem.
Every variable is listed in .env.example.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.config import AgentConfig
from learning.config import LearningConfig
from store.config import StoreConfig


class UIConfig(BaseModel):
    """Research chat UI settings (env: RUBRICEM_UI__<FIELD>)."""

    host: str = Field(default="127.0.0.1", description="Address `rubricem ui` binds; not loopback needs a login.")
    port: int = Field(default=8501, ge=1, le=65535, description="Port `rubricem ui` listens on.")
    password: SecretStr | None = Field(default=None, description="Login password for users (required off loopback "
                                       "unless OIDC is on).")
    admin_password: SecretStr | None = Field(default=None, description="Login password that also grants admin "
                                             "actions (retrain now).")
    oidc: bool = Field(default=False, description="Log in through Streamlit's built-in OIDC (st.login); needs an "
                       "[auth] section in .streamlit/secrets.toml.")
    admin_emails: list[str] = Field(default_factory=list, description="OIDC users (by e-mail) who are admins, as a "
                                    "JSON list.")

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
    host: str = Field(default="127.0.0.1", description="Address the HTTP transport binds; not loopback needs a token.")
    port: int = Field(default=8765, ge=1, le=65535, description="Port of the HTTP transport.")
    path: str = Field(default="/mcp", pattern=r"^/[A-Za-z0-9_./-]*$", description="Endpoint path of the HTTP "
                      "transport.")
    token: SecretStr | None = Field(default=None, description="Bearer token HTTP clients must send (required off "
                                    "loopback).")

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
    reserved_cpus: int = Field(default=0, ge=0, description="Cores vLLM keeps for its front end "
                               "(VLLM_CPU_NUM_OF_RESERVED_CPU).")
    start_timeout_s: float = Field(default=600.0, gt=0, description="How long `rubricem policy-server` waits for "
                                   "vLLM to serve, seconds.")


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
    policy_server: PolicyServerConfig = PolicyServerConfig()


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
    for section, field in Settings.model_fields.items():
        assert field.annotation is not None
        body += [f"## {section}", *_env_lines(field.annotation, f"RUBRICEM_{section.upper()}__"), ""]
    return "\n".join(head + body)


def child_environment() -> dict[str, str]:
    """A copy of this process's environment, for a child process it starts (the local vLLM server): this module is
    the one place that reads the environment."""
    return dict(os.environ)
