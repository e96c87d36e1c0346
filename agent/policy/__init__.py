"""HTTP policy clients: vLLM's OpenAI server (token-id prompts, exact token ids) and llama-cpp-python's (text only).

Both normalise a completion to `agent.protocols.Generation`, retry transient failures with backoff and map the rest to
the typed errors of `agent.errors`. Pure httpx; no torch.

Modules: `transport` (the shared httpx transport, retries and error mapping), `completions` (argument checks and
response parsing both servers share), `vllm` (`VLLMPolicyClient`), `replicas` (`ReplicaSet`: several vLLM replicas
of one policy, with failover and all-or-nothing adapter loads), `llamacpp` (`LlamaCppPolicyClient`,
`render_chatml`) and `pinned` (`PinnedPolicy`: one session's view of a shared client, pinned to one version).
"""

from agent.policy.completions import check_generate_args
from agent.policy.llamacpp import SMOLLM2_DEFAULT_SYSTEM, LlamaCppPolicyClient, render_chatml
from agent.policy.pinned import PinnedPolicy, pinnable
from agent.policy.replicas import ReplicaSet, redact_url
from agent.policy.vllm import SLEEP_MODES, VLLM_MAX_STOP_STRINGS, VLLM_RUNTIME_LORA_ENV, VLLMPolicyClient

__all__ = [
    "SLEEP_MODES",
    "SMOLLM2_DEFAULT_SYSTEM",
    "VLLM_MAX_STOP_STRINGS",
    "VLLM_RUNTIME_LORA_ENV",
    "LlamaCppPolicyClient",
    "PinnedPolicy",
    "pinnable",
    "ReplicaSet",
    "VLLMPolicyClient",
    "check_generate_args",
    "redact_url",
    "render_chatml",
]
