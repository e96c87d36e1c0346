"""One Settings object, built once from RUBRICEM_* environment variables and an optional .env file.

Nested sections use "__": e.g. RUBRICEM_AGENT__POLICY_BACKEND=vllm, RUBRICEM_STORE__DATA_DIR=/srv/rubricem.
Every variable is listed in .env.example.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.config import AgentConfig
from learning.config import LearningConfig
from store.config import StoreConfig


class Settings(BaseSettings):
    """All configuration of the application."""

    model_config = SettingsConfigDict(
        env_prefix="RUBRICEM_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    agent: AgentConfig = AgentConfig()
    learning: LearningConfig = LearningConfig()
    store: StoreConfig = StoreConfig()


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
