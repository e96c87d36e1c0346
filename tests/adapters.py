"""LoRA adapter folders made from the shipped SFT adapter: for the real-vLLM tests another rank, or LoRA matrices
shaped for another base model (a load that must fail), all-zero so they serve exactly the base model's outputs; for
the embedded engines a scaled copy (another adapter of the same shape)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx


def reshaped_adapter(src: Path, dest: Path, rank: int | None = None, hidden: int | None = None) -> Path:
    """A copy of `src` with zero LoRA matrices of rank `rank` (config `r` too), or with A and B sized for a base model
    of hidden size `hidden` (another model's adapter)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    cfg = json.loads((dest / "adapter_config.json").read_text())
    weights = load_file(str(dest / "adapter_model.safetensors"))
    if rank is not None:
        cfg["r"] = rank
        weights = {k: (torch.zeros(rank, v.shape[1], dtype=v.dtype) if "lora_A" in k else
                       torch.zeros(v.shape[0], rank, dtype=v.dtype)) for k, v in weights.items()}
    if hidden is not None:
        weights = {k: (torch.zeros(v.shape[0], hidden, dtype=v.dtype) if "lora_A" in k else
                       torch.zeros(hidden, v.shape[1], dtype=v.dtype)) for k, v in weights.items()}
    (dest / "adapter_config.json").write_text(json.dumps(cfg))
    save_file(weights, str(dest / "adapter_model.safetensors"))
    return dest


def scaled_adapter(src: Path, dest: Path, factor: float) -> Path:
    """A copy of `src` with every LoRA B multiplied by `factor`: another adapter of the same shape, other outputs."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    weights = load_file(str(dest / "adapter_model.safetensors"))
    save_file({k: (v * factor if "lora_B" in k else v).contiguous() for k, v in weights.items()},
              str(dest / "adapter_model.safetensors"))
    return dest


def served_adapters(server: Any) -> dict[str, str]:
    """The adapters a real vLLM server serves, by name, with the folder each was loaded from."""
    cards = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    return {c["id"]: c["root"] for c in cards if c.get("parent")}


def unload_adapters(server: Any) -> None:
    """Take every adapter off a server the test run shares (the tests that load adapters call it when done). A server
    that no longer answers has nothing loaded: its test has already failed, and that failure is the one to report."""
    try:
        names = served_adapters(server)
    except httpx.TransportError:
        return
    for name in names:
        httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)
