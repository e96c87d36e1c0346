"""Agent settings section: the policy endpoint, tools and per-run budgets."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from store.records import Stage

# The SFT adapter shipped with the package for the bundled SmolLM2 (see its PROVENANCE.md).
SHIPPED_SFT_ADAPTER = Path(__file__).resolve().parent / "adapters" / "smollm2-sft"

FormatLabel = Literal["exact_answer", "short_form", "long_form"]


class StageTokenCaps(BaseModel):
    """Maximum new tokens per generation call, by stage (research is per tool-call turn); at least 16
    (agent.sequence.MIN_NEW_TOKENS), below which a stage cannot say anything and the run would fail."""

    plan: int = Field(default=384, ge=16, le=32768)
    research: int = Field(default=256, ge=16, le=32768)
    review: int = Field(default=384, ge=16, le=32768)
    answer: int = Field(default=768, ge=16, le=32768)

    def cap(self, stage: Stage) -> int:
        """The cap for one stage."""
        return int(getattr(self, stage))


class RunOptions(BaseModel):
    """Per-run options; passed with each run (never overridden by the environment)."""

    model_config = {"frozen": True}

    format: FormatLabel = Field(default="long_form", description="Which format instruction follows the question.")
    max_tool_calls: int = Field(default=10, ge=0, le=50, description="Tool-call budget per trajectory (paper: 10).")
    token_caps: StageTokenCaps = Field(default_factory=StageTokenCaps)
    wall_clock_s: float = Field(default=900.0, gt=0, description="Hard wall-clock limit of one run, seconds.")
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    seed: int | None = Field(default=None, description="Sampling seed (reproducible runs where the backend allows).")
    inject_bank: bool = Field(default=True, description="Retrieve rubric-bank reflections into the prompt.")
    bank_mode: Literal["auto", "within", "cross"] = Field(
        default="auto", description="auto: the same question's reflection if there is one, else similar questions'; "
        "within / cross: only that kind (the training curriculum).")
    context_tokens: int = Field(
        default=8192, ge=512, description="Policy context window; research stops early to leave room for review+answer."
    )
    question_first: bool = Field(
        default=True, description="The graph makes the first search itself, with the question as asked; the model "
        "writes every later query. Off: the model writes every query (the paper's scaffold).")


MCP_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""Tool names the scaffold can carry in `<call_tool name="...">` (the MCP spec allows the same characters)."""


class McpServerConfig(BaseModel):
    """One MCP server whose tools the agent may call: a stdio command or a streamable-HTTP URL.

    Header, token and environment values are secrets: they reach the server only, never a prompt, a log line or the
    session store.
    """

    model_config = {"frozen": True, "extra": "forbid"}

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,40}$", description="Label used in messages and source titles.")
    command: str | None = Field(default=None, description="stdio: the executable that starts the server.")
    args: list[str] = Field(default_factory=list, description="stdio: its arguments.")
    env: dict[str, SecretStr] = Field(default_factory=dict, description="stdio: extra environment variables.")
    cwd: Path | None = Field(default=None, description="stdio: working directory.")
    url: str | None = Field(default=None, description="streamable HTTP: the endpoint, e.g. http://127.0.0.1:8000/mcp.")
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="HTTP: extra request headers.")
    bearer_token: SecretStr | None = Field(default=None, description="HTTP: sent as `Authorization: Bearer ...`.")
    tools: list[str] | None = Field(
        default=None, description="Allow-list of the server's tool names (None: all). Either way only read-only "
        "tools (annotated readOnlyHint=true) are offered, unless named in allow_side_effects.")
    allow_side_effects: list[str] = Field(
        default_factory=list, description="Tools offered although they do not declare readOnlyHint=true (they may "
        "change things: write, send, delete). The model's context holds text from the web, documents and other "
        "people, which can steer its calls; list a tool here only when any call to it is acceptable.")
    prefix: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]{0,20}$",
                        description="Put before each of its tool names, e.g. `docs_` (avoids name collisions).")
    timeout_s: float = Field(default=30.0, gt=0, le=600, description="Limit of one call, connecting included.")
    max_results: int = Field(default=5, ge=1, le=20, description="Content items kept (as snippets) per call.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("an MCP server url must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of `command` (stdio) or `url` (HTTP)")
        if self.url is None and (self.headers or self.bearer_token is not None):
            raise ValueError(f"MCP server {self.name!r}: headers and bearer_token apply to HTTP servers only")
        if self.command is not None and not self.command.strip():
            raise ValueError(f"MCP server {self.name!r}: `command` is empty")
        for tool in (*(self.tools or ()), *self.allow_side_effects):
            if not MCP_TOOL_NAME.match(self.prefix + tool):
                raise ValueError(f"MCP server {self.name!r}: {tool!r} is not a usable tool name "
                                 "(letters, digits, _ . - only, at most 64 characters with the prefix)")
        for tool in self.allow_side_effects:
            if self.tools is not None and tool not in self.tools:
                raise ValueError(f"MCP server {self.name!r}: allow_side_effects names {tool!r}, which its `tools` "
                                 "allow-list leaves out: add it to `tools` too, or drop it from allow_side_effects")
        return self


class AgentConfig(BaseModel):
    """Agent settings (env: RUBRICEM_AGENT__<FIELD>)."""

    policy_backend: Literal["embedded", "vllm", "llamacpp"] = Field(
        default="embedded",
        description="embedded: in-process SmolLM2 (no GPU/server); vllm: a vLLM OpenAI server; "
        "llamacpp: a llama-cpp-python server (CPU dev path).",
    )
    policy_base_url: str = Field(default="http://127.0.0.1:8000", description="Policy server root URL (no /v1).")
    policy_base_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Several vLLM replicas of one policy, instead of POLICY_BASE_URL: root "
        "URLs as a JSON list or comma-separated. Sessions spread over the healthy ones; promotion loads each adapter "
        "on every one before `live` moves (README, Deployment).")
    policy_replica_cooldown_s: float = Field(
        default=30.0, gt=0, le=3600, description="With several replicas: one that failed a request (down, 5xx, "
        "timeout, missing the adapter) is tried last for this many seconds.")
    policy_model: str = Field(default="policy", description="Served model/adapter alias sent as `model`.")
    policy_api_key: SecretStr | None = Field(default=None, description="Bearer token for the policy server; "
                                             "`rubricem policy-server` serves with it, and needs one of at least 32 "
                                             "characters to bind anything but 127.0.0.1, localhost or ::1.")
    policy_timeout_s: float = Field(default=300.0, gt=0, description="Per-request timeout, seconds.")
    policy_max_retries: int = Field(default=4, ge=0, le=10, description="Retries on 429/5xx/connection errors.")
    policy_chat_format: Literal["chatml"] = Field(
        default="chatml", description="Chat template the llama.cpp client renders itself (its server has no template endpoint)."
    )
    embedded_model_path: Path | None = Field(
        default=None, description="HF folder for the embedded backend; empty = the bundled SmolLM2-135M-Instruct."
    )
    embedded_adapter_path: Path | None = Field(default=None, description="PEFT LoRA adapter folder to load at start.")
    embedded_sft: bool = Field(
        default=True, description="With the bundled model and no adapter path, load the shipped SFT adapter "
        "(agent/adapters/smollm2-sft: the model writes the scaffold, its queries and citations itself; false = the "
        "plain base model).")
    embedded_dtype: Literal["bfloat16", "float32"] = Field(default="bfloat16")
    embedded_decode_attention: Literal["gqa", "eager", "sdpa"] = Field(
        default="gqa", description="Attention kernel of the embedded model's one-token decode steps (prompts and "
        "scoring always run sdpa): gqa is eager attention that reads the KV cache in place instead of copying it "
        "per query head; eager is 1.9x faster than sdpa behind a 3,000-token cache on CPU.")
    embedded_merge_adapter: bool = Field(
        default=False, description="Serve the embedded model's LoRA adapter folded into its weights. torch: the demo "
        "session ran 15% faster, but bf16 rounding of the merged weights changes outputs slightly (greedy tokens "
        "differ). llama.cpp: a Q8_0 copy of the model with the adapter merged in (cached per adapter, 145 MB): prompts "
        "prefill 1.6-1.9x faster and the sampler-trainer KL stays a tenth of the skip bound, but a new adapter takes "
        "seconds to convert and a swap loads a model; the demo session's sampled tokens per second were unchanged.")
    embedded_base_q8: bool = Field(
        default=False, description="llamacpp engine: serve the base weights from a Q8_0 copy of the GGUF (converted "
        "once, about 6 s, 145 MB, cached beside the GGUF LoRAs): llama.cpp's tiled prompt kernels take Q8_0 but not "
        "the bundled Q4_1, so prompts prefill 1.4-1.8x faster, but one-token steps read twice the bytes, and the demo "
        "session, mostly decode, ran slower in an interleaved A/B (docs/speed.md). For prompt-heavy work.")
    embedded_decode_matmul: Literal["native", "onednn"] = Field(
        default="native", description="CPU kernels of the embedded model's one-token decode steps: ATen's native "
        "bf16 matrix-vector products read the weights about twice as fast as oneDNN's (prompts always use oneDNN).")

    embedded_engine: Literal["torch", "llamacpp"] = Field(
        default="llamacpp", description="What decodes the embedded policy's tokens: llamacpp (llama.cpp in process "
        "on the bundled GGUF, adapters converted to GGUF LoRA; the trainer recomputes log-probs and corrects for the "
        "gap; several times faster on CPU, README Speed) or torch (transformers, the trainer's own kernels). Weights "
        "without a GGUF fall back to torch with a message.")
    embedded_gguf_path: Path | None = Field(
        default=None, description="llamacpp engine: the base model's GGUF; empty = the bundled SmolLM2 Q4_1 (required "
        "with a custom EMBEDDED_MODEL_PATH: the same weights as that folder).")
    embedded_cpu_variant: str | None = Field(
        default=None, pattern=r"^[a-z0-9_.]+$", description="llamacpp engine: the llama.cpp CPU backend variant to "
        "run (haswell, skylakex, icelake, zen4, alderlake, as `make install` built them); empty = the best one this "
        "CPU runs, each probed once per machine and never chosen again after a fault (README, Speed).")
    embedded_threads: int = Field(
        default=0, ge=0, le=256, description="CPU threads of the embedded policy's decode steps; 0 = measured on this "
        "machine at start (the fastest count, cached per machine).")
    embedded_compile: bool = Field(
        default=False, description="torch engine: compile the one-token decode step (torch.compile, inductor's C++ "
        "backend) over a static KV cache; a failed compile falls back to the eager kernels with one warning.")

    attribute_uncited: bool = Field(
        default=True, description="When an answer cites nothing, match its sentences to the retrieved passages they "
        "restate (labelled as matched after writing; rewards never use them).")
    verify_citations: bool = Field(
        default=True, description="Check every cited sentence against the passage it cites (MiniLM similarity and "
        "word overlap, agent/support.py): re-attribute it to a retrieved passage that supports it, or remove the "
        "citation and mark the sentence unsupported. The session log keeps the body as written too.")
    max_question_chars: int = Field(default=8000, ge=16, description="Longer questions are refused.")
    defaults: RunOptions = Field(default_factory=RunOptions, description="Default per-run options.")

    local_search_k: int = Field(default=5, ge=1, le=50, description="Snippets returned per local_search call.")
    snippet_chars: int = Field(default=700, ge=50, description="Snippet text is cut to this many characters.")

    serper_api_key: SecretStr | None = Field(default=None, description="Enables google_search (Serper).")
    serper_url: str = Field(default="https://google.serper.dev/search")
    s2_enabled: bool = Field(default=False, description="Offer snippet_search (Semantic Scholar).")
    s2_api_key: SecretStr | None = Field(default=None, description="Semantic Scholar key (optional, raises limits).")
    s2_url: str = Field(default="https://api.semanticscholar.org/graph/v1/snippet/search")
    searxng_url: str | None = Field(default=None, description="SearXNG instance root; enables web_search.")
    browse_enabled: bool = Field(default=False, description="Offer browse_webpage (SSRF-guarded fetch).")
    browse_scope: Literal["seen", "any"] = Field(
        default="seen", description="Which URLs browse_webpage opens. seen: only URLs that appeared in the question "
        "or in an earlier tool result of the same run, so a page, document or reflection that tells the model to "
        "open a URL it composed (carrying what it read) cannot leak anything; any: every public URL.")
    tool_timeout_s: float = Field(default=20.0, gt=0, description="Timeout of one search/fetch request.")
    browse_max_bytes: int = Field(default=2_000_000, ge=1024)
    browse_max_redirects: int = Field(default=5, ge=0, le=20)
    search_results: int = Field(default=5, ge=1, le=20, description="Results kept per web search call.")
    mcp_servers: list[McpServerConfig] = Field(
        default_factory=list, description="MCP servers whose tools the agent may call, as a JSON list of "
        '{"name", "command", "args", "env", "url", "headers", "bearer_token", "tools", "allow_side_effects", '
        '"prefix", "timeout_s", "max_results"} (README, MCP). Only read-only tools are offered unless a server '
        "lists others in allow_side_effects.")

    @field_validator("policy_base_urls", mode="before")
    @classmethod
    def _url_list(cls, value: object) -> object:
        """A JSON list, or comma-separated URLs (the environment's two forms); empty means none."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    return json.loads(text)
                except ValueError:
                    # Never quote the value: a URL may carry user:password.
                    raise ValueError("policy_base_urls: not a valid JSON list (or give comma-separated URLs)") from None
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("policy_base_urls", mode="after")
    @classmethod
    def _strip_urls(cls, value: list[str]) -> list[str]:
        return [url.strip() for url in value]

    @property
    def policy_urls(self) -> tuple[str, ...]:
        """The policy server root URL(s): `policy_base_urls` when set, else the one `policy_base_url`."""
        return tuple(self.policy_base_urls) or (self.policy_base_url,)

    @model_validator(mode="after")
    def _check(self) -> AgentConfig:
        if self.policy_base_url.rstrip("/").endswith("/v1"):
            raise ValueError("policy_base_url is the server root; drop the trailing /v1 (the client adds it)")
        # Messages name positions, never the URLs: a URL may carry user:password.
        seen: set[str] = set()
        for i, url in enumerate(self.policy_base_urls):
            root = url.strip().rstrip("/")
            if not re.match(r"^https?://[^/\s]+", root):
                raise ValueError(f"policy_base_urls[{i}] is not an http:// or https:// server root URL")
            if root.endswith("/v1"):
                raise ValueError(f"policy_base_urls[{i}] ends in /v1; give the server root (the client adds /v1)")
            if root in seen:
                raise ValueError(f"policy_base_urls[{i}] is listed twice; each replica once")
            seen.add(root)
        if (self.policy_base_urls and "policy_base_url" in self.model_fields_set
                and self.policy_base_url.strip().rstrip("/") not in seen):
            raise ValueError("policy_base_url and policy_base_urls are both set and disagree: set one of them "
                             "(RUBRICEM_AGENT__POLICY_BASE_URLS for several replicas, or drop it for one server)")
        names = [s.name for s in self.mcp_servers]
        if len(names) != len(set(names)):
            raise ValueError(f"mcp_servers: each server needs its own name, got {names}")
        return self
