"""PEFT LoRA adapters as GGUF LoRA files, so llama.cpp can sample with the weights the trainer saved (issue 37).

llama.cpp loads a LoRA adapter from a GGUF file whose metadata says `general.type = adapter`, `adapter.type = lora`
and `adapter.lora.alpha`, and whose tensors are named after the base model's GGUF tensors with `.lora_a` / `.lora_b`
appended (`blk.3.attn_q.weight.lora_a`). It scales the product by alpha / rank, as PEFT does. This module writes
such a file with the `gguf` package (no conversion script is installed, and none is needed):

* names: `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` → `blk.N.attn_q.weight.lora_a`, and so on
  for the seven projections of a Llama block;
* shapes: PEFT keeps A as (rank, in) and B as (out, rank); GGUF stores the same row-major arrays, which ggml reads as
  ne = [in, rank] and [rank, out], the layout llama.cpp checks;
* the rotary permutation: the Llama GGUF converter permutes the rows of the query and key projections (pairs of
  rotary dimensions interleaved per head), and transformers undoes it when it loads a GGUF. The adapter was trained
  on the un-permuted layout, so the output rows of B for q and k get the same permutation the base weights got; A is
  untouched (its rows are the rank). Without it every head's rotary pairs would be crossed and the adapter's effect
  on attention would be noise (the equivalence test against the torch engine catches exactly that).

Refused with the reason (`GGUFConversionError`, an `AdapterLoadError`): an adapter whose modules or shapes do not
match the base GGUF (another model, another width, a layer the base does not have), a non-LoRA or DoRA adapter, and
per-module rank or alpha patterns (one scale per file is all llama.cpp takes). rsLoRA's scale alpha/sqrt(rank) is
kept by writing alpha·sqrt(rank) as the file's alpha.

`write_q8_gguf` / `cached_q8_base` write the base with every 4-bit weight as Q8_0, which llama.cpp's tiled prompt
kernels take (the engine's `base_q8`, issue 47). `write_dense_gguf` writes the base model itself de-quantized (bf16 or
f16), for measuring how much of the sampler's gap to the trainer is the 4-bit weights and how much the kernels.

The cache (`cached_lora`, issue 46): llama.cpp trusts whatever GGUF it is given, so a cached conversion is served
only from a folder no other user can write (nor any folder a lookup of it searches, links' targets included, unless
root's and sticky like /tmp; issue 65), created private, and only while its SHA-256 matches the digest recorded beside
it when it was written; a file that does not match, has no record, or is a link is converted again.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from learning.engines.client import AdapterLoadError
from learning.engines.files import NotPrivate, file_lock, hash_into, private_dir, sha256_file

log = logging.getLogger(__name__)

LORA_CONVERSION_FORMAT = 1  # bump to re-convert cached adapters
Q8_BASE_FORMAT = 1  # bump to re-convert cached Q8_0 bases
DIGEST_SUFFIX = ".sha256"  # lora-<key>.gguf.sha256: the SHA-256 of lora-<key>.gguf, recorded as it is written
_PROJECTIONS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_PEFT_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)\.lora_([AB])\.weight$")


class GGUFConversionError(AdapterLoadError):
    """A LoRA adapter could not be written as a GGUF LoRA for this base model; nothing was written."""


def _base_info(base_gguf: Path) -> dict[str, Any]:
    """Architecture, head counts and every tensor's row-major shape of the base GGUF."""
    import gguf

    reader = gguf.GGUFReader(str(base_gguf))

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        return f.contents() if f is not None else None

    arch = field("general.architecture")
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
    return {"arch": arch, "heads": field(f"{arch}.attention.head_count"),
            "kv_heads": field(f"{arch}.attention.head_count_kv"), "shapes": shapes}


def _permute_rows(rows: Any, n_head: int) -> Any:
    """The Llama GGUF converter's rotary permutation of a projection's output rows (numpy, rows first)."""
    shape = rows.shape
    return rows.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _adapter_scale_alpha(config: dict[str, Any]) -> float:
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise GGUFConversionError(f"only LoRA adapters convert to GGUF, not {config.get('peft_type')!r}")
    if config.get("use_dora"):
        raise GGUFConversionError("DoRA adapters cannot be written as a GGUF LoRA (llama.cpp has no magnitude vector)")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise GGUFConversionError("per-module rank_pattern/alpha_pattern cannot be written as one GGUF LoRA scale")
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha * math.sqrt(r) if config.get("use_rslora") else alpha  # llama.cpp scales by alpha / r


@contextlib.contextmanager
def _gguf_written(path: Path, arch: str) -> Iterator[Any]:
    """A `GGUFWriter` for `path`: the block adds keys and tensors, then the file is written to a temporary sibling
    and renamed into place, so a reader never sees half a file and a failure leaves nothing behind."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    writer = None
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        yield writer
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        if writer is not None:  # a handle left open keeps the removed file's blocks: a full disk would stay full
            with contextlib.suppress(Exception):  # its buffer's flush fails again on a full disk; the file closes
                writer.close()
        Path(tmp).unlink(missing_ok=True)
        raise


def _adapter_pairs(adapter_dir: Path, base: dict[str, Any]) -> tuple[float, dict[str, tuple[Any, Any]]]:
    """The adapter's scale alpha and, per base tensor name, its (A, B) as float32 numpy arrays, B's rows already in
    the GGUF's rotary order.

    Raises:
        GGUFConversionError: the adapter is unreadable, not a plain LoRA, or does not fit the base model.
    """
    from safetensors.torch import load_file  # numpy has no bfloat16, the trainer's dtype

    try:
        config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
        tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    except (OSError, ValueError) as exc:
        raise GGUFConversionError(f"unreadable adapter in {adapter_dir}: {exc}") from exc
    except Exception as exc:  # safetensors raises its own error types for a corrupt file
        raise GGUFConversionError(f"unreadable adapter weights {adapter_dir / 'adapter_model.safetensors'}: "
                                  f"{exc}") from exc
    alpha = _adapter_scale_alpha(config)
    if base["arch"] != "llama":
        raise GGUFConversionError(f"the base GGUF's architecture is {base['arch']!r}; only llama is supported")
    found: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        m = _PEFT_KEY.match(key)
        if m is None:
            raise GGUFConversionError(f"adapter tensor {key!r} is not a LoRA A/B of a Llama projection")
        name = f"blk.{m.group(1)}.{_PROJECTIONS[m.group(2)]}.weight"
        found.setdefault(name, {})[m.group(3)] = value.float().numpy()
    if not found:
        raise GGUFConversionError(f"{adapter_dir} holds no LoRA weights")
    pairs: dict[str, tuple[Any, Any]] = {}
    for name in sorted(found):
        pair = found[name]
        if set(pair) != {"A", "B"}:
            raise GGUFConversionError(f"{name}: the adapter has only lora_{''.join(pair)}")
        base_shape = base["shapes"].get(name)
        if base_shape is None:
            raise GGUFConversionError(f"the adapter adapts {name}, which the base model does not have "
                                      "(an adapter for another model?)")
        a, b = pair["A"], pair["B"]
        out_dim, in_dim = base_shape
        if a.shape[1] != in_dim or b.shape[0] != out_dim or a.shape[0] != b.shape[1]:
            raise GGUFConversionError(
                f"{name}: adapter A {tuple(a.shape)} / B {tuple(b.shape)} do not fit the base weight "
                f"({out_dim} x {in_dim}); the adapter was trained for another model")
        if ".attn_q." in name:
            b = _permute_rows(b, int(base["heads"]))
        elif ".attn_k." in name:
            b = _permute_rows(b, int(base["kv_heads"]))
        pairs[name] = (a, b)
    return alpha, pairs


def convert_lora(adapter_dir: Path, base_gguf: Path, out_path: Path) -> Path:
    """Write the PEFT LoRA adapter in `adapter_dir` as a GGUF LoRA for `base_gguf` at `out_path` (atomically).

    Raises:
        GGUFConversionError: the adapter is not a plain LoRA, or does not fit the base model (named in the message).
    """
    import numpy as np

    adapter_dir, out_path = Path(adapter_dir), Path(out_path)
    alpha, pairs = _adapter_pairs(adapter_dir, _base_info(base_gguf))
    with _gguf_written(out_path, "llama") as writer:
        writer.add_string("general.type", "adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", alpha)
        for name, (a, b) in pairs.items():
            writer.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a))
            writer.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b))
    return out_path


def write_merged_gguf(adapter_dir: Path, base_gguf: Path, out_path: Path) -> Path:
    """Write `base_gguf` with the adapter merged into the weights it adapts, each stored as Q8_0 (atomically).

    Why: llama.cpp has no tiled matrix-matrix kernel for the bundled Q4_1 on x86, and a runtime LoRA adds two small
    products per projection, so a prompt prefills at about 295 tok/s; Q8_0 weights prefill at about 494 (docs/speed.md).
    Each adapted weight is the base de-quantized plus (alpha / r)·B·A, rounded once to 8 bits: closer to the trainer's
    weights (the Q4_1 grid plus the adapter) than a second 4-bit rounding would be. Every other tensor is copied as it
    is, so the embeddings and norms stay exactly the base's.

    Raises:
        GGUFConversionError: as `convert_lora`.
    """
    adapter_dir, out_path = Path(adapter_dir), Path(out_path)
    alpha, pairs = _adapter_pairs(adapter_dir, _base_info(base_gguf))
    rank = int(next(iter(pairs.values()))[0].shape[0])
    scale = alpha / rank  # llama.cpp's, and PEFT's, scale (rsLoRA's alpha was already rewritten to keep it)
    return _write_q8(base_gguf, out_path, {name: scale * (b @ a) for name, (a, b) in pairs.items()}, every=False)


def write_q8_gguf(base_gguf: Path, out_path: Path) -> Path:
    """Write `base_gguf` with every 4/5-bit weight de-quantized and rounded to Q8_0 (atomically): the same values
    within a Q8_0 step, in the format llama.cpp's tiled prompt kernels take (`cached_q8_base`)."""
    return _write_q8(Path(base_gguf), Path(out_path), {}, every=True)


def _write_q8(base_gguf: Path, out_path: Path, deltas: dict[str, Any], *, every: bool) -> Path:
    """`base_gguf` with each weight named in `deltas` (and, with `every`, each weight of another quantized type than
    Q8_0) written as Q8_0 of its de-quantized value plus its delta; F32 tensors and the rest are copied as they are."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(base_gguf))
    types = gguf.GGMLQuantizationType
    q8, kept = types.Q8_0, (types.F32, types.F16, types.BF16, types.Q8_0)
    with _gguf_written(out_path, "llama") as writer:
        _copy_fields(reader, writer, file_type=gguf.LlamaFileType.MOSTLY_Q8_0 if every else None)
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if t.name in deltas or (every and t.tensor_type not in kept):
                dense = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
                if t.name in deltas:
                    dense += deltas[t.name]
                writer.add_tensor(t.name, gguf.quants.quantize(dense, q8), raw_dtype=q8)
            elif t.tensor_type == types.F32:
                writer.add_tensor(t.name, np.asarray(t.data, dtype=np.float32).reshape(shape))
            else:
                writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)  # bytes, as read
    return out_path


def _copy_fields(reader: Any, writer: Any, file_type: int | None = None) -> None:
    """Every metadata key of `reader` into `writer` (the architecture is the writer's own; `file_type` replaces
    general.file_type when given)."""
    import gguf

    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type" and file_type is not None:
            writer.add_file_type(file_type)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)


def adapter_digest(adapter_dir: Path, base_gguf: Path) -> str:
    """A key for the converted file: the adapter's config and weights, the base GGUF's identity, the format."""
    h = hashlib.sha256(f"{LORA_CONVERSION_FORMAT}:{base_gguf.name}:{base_gguf.stat().st_size}".encode())
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        hash_into(h, os.open(adapter_dir / name, os.O_RDONLY))
    return h.hexdigest()[:24]


def cached_lora(adapter_dir: Path, base_gguf: Path, cache_dir: Path) -> Path:
    """The GGUF LoRA of `adapter_dir`, converted once into `cache_dir` and reused while the adapter is unchanged and
    the cached file still has the digest recorded when it was written (otherwise it is converted again).

    Raises:
        GGUFConversionError: the adapter is unreadable or does not convert, or `cache_dir` (or a folder above it) can
            be written by other users.
    """
    return _cached(adapter_dir, base_gguf, cache_dir, "lora")


def cached_merged(adapter_dir: Path, base_gguf: Path, cache_dir: Path) -> Path:
    """`base_gguf` with `adapter_dir` merged in (`write_merged_gguf`), cached as `cached_lora` caches a GGUF LoRA."""
    return _cached(adapter_dir, base_gguf, cache_dir, "merged")


def cached_q8_base(base_gguf: Path, cache_dir: Path) -> Path:
    """`base_gguf` as Q8_0 (`write_q8_gguf`), converted once into `cache_dir` (about 6 s of CPU, 145 MB) and reused
    under the same ownership and digest checks as `cached_lora`; the key is the base file's name, size and the format.

    Raises:
        GGUFConversionError: the base does not convert, or `cache_dir` can be written by other users.
    """
    base_gguf = Path(base_gguf)
    key = hashlib.sha256(f"{Q8_BASE_FORMAT}:{base_gguf.name}:{base_gguf.stat().st_size}".encode()).hexdigest()[:24]
    target = private_folder(Path(cache_dir)) / f"base-q8_0-{key}.gguf"

    def write(path: Path) -> None:
        try:
            write_q8_gguf(base_gguf, path)
        except (OSError, ValueError) as exc:
            raise GGUFConversionError(f"could not write a Q8_0 copy of {base_gguf} to {target}: {exc}") from exc

    return _cached_file(target, write)


def _cached(adapter_dir: Path, base_gguf: Path, cache_dir: Path, kind: str) -> Path:
    adapter_dir = Path(adapter_dir)
    try:
        digest = adapter_digest(adapter_dir, base_gguf)
    except OSError as exc:
        raise GGUFConversionError(f"unreadable adapter in {adapter_dir}: {exc}") from exc
    target = private_folder(Path(cache_dir)) / f"{kind}-{digest}.gguf"
    convert = convert_lora if kind == "lora" else write_merged_gguf

    def write(path: Path) -> None:
        try:
            convert(adapter_dir, base_gguf, path)
        except OSError as exc:  # the destination (a full disk, a file size limit): the error named neither file
            raise GGUFConversionError(f"could not write the GGUF of {adapter_dir} to {target}: {exc}") from exc

    return _cached_file(target, write)


def recorded(target: Path) -> bool:
    """Whether `target` is a plain file whose SHA-256 is the one recorded beside it (`cached_file` wrote both)."""
    return _matches_record(target, target.with_name(target.name + DIGEST_SUFFIX))


def forget(target: Path) -> None:
    """Remove `target` and its recorded digest (a link is removed, never followed)."""
    for path in (target, target.with_name(target.name + DIGEST_SUFFIX)):
        path.unlink(missing_ok=True)


def cached_file(target: Path, write: Callable[[Path], object]) -> Path:
    """`_cached_file` for other caches in the same private folder (the engine's saved system messages)."""
    return _cached_file(target, write)


def _cached_file(target: Path, write: Callable[[Path], object]) -> Path:
    """`target` when it matches the digest recorded beside it, else written by `write(path)` to a temporary sibling,
    renamed into place and recorded. The conversion runs under a lock file beside it, so processes starting together
    convert once (the others wait, then find it recorded) and none removes a file another has just written but not
    yet recorded.

    Why the temporary sibling: not every writer is atomic (llama.cpp's state saver writes straight to the name it is
    given), and one that failed half-way (a full disk) left half a file under the cached name; it was never trusted
    (it has no record), but it took the space until the next write. Now `target` holds a finished file or nothing.
    """
    record = target.with_name(target.name + DIGEST_SUFFIX)
    if _matches_record(target, record):
        return target
    with file_lock(target.with_name(f".{target.name}.lock")):
        if _matches_record(target, record):
            return target
        for stale in (target, record):  # a link is removed, never followed
            stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(fd)
        try:
            write(Path(tmp))
            os.chmod(tmp, 0o600)  # writers such as llama.cpp's state saver leave the umask's mode
            digest = sha256_file(Path(tmp), follow_links=False)
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)  # gone after the replace; left only by a failed write
        _write_atomically(record, digest)
    return target


def private_folder(folder: Path) -> Path:
    """The real path of `folder`, created owner-only (0700, whatever the umask) if missing, once it is known that no
    other user can write it or swap it (`files.private_dir`).

    Every folder a lookup of it searches, the targets of links on the way included (a data folder that is a link into
    a world-writable folder is that folder's), must be this user's or root's and writable by no one else, unless it is
    root's and sticky like /tmp; the folder itself must be this user's and writable by this user alone.

    Raises:
        GGUFConversionError: which folder other users can write (or own), and what to do.
    """
    try:
        return private_dir(Path(folder))
    except NotPrivate as exc:
        raise GGUFConversionError(
            f"the GGUF LoRA cache {folder} is refused: {exc}; a file there could be a GGUF llama.cpp should not "
            "load. `chmod go-w` the folder named (as its owner), or point RUBRICEM_STORE__DATA_DIR at a folder only "
            "you and root can write") from exc
    except OSError as exc:
        raise GGUFConversionError(f"cannot create the GGUF LoRA cache {folder}: {exc}") from exc


def _matches_record(target: Path, record: Path) -> bool:
    """Whether `target` is a plain file (not a link) whose SHA-256 is the one recorded in `record`."""
    try:
        if not stat.S_ISREG(target.lstat().st_mode) or not stat.S_ISREG(record.lstat().st_mode):
            return False
        recorded = record.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return False
    if hmac.compare_digest(sha256_file(target, follow_links=False), recorded):
        return True
    log.warning("the cached file %s does not match its recorded digest: writing it again", target)
    return False


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with open(fd, "w", encoding="ascii") as fh:
            fh.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_dense_gguf(src: Path, dst: Path, dtype: str = "bf16") -> Path:
    """Copy the GGUF at `src` with every quantized tensor de-quantized to `dtype` ("bf16" or "f16").

    The torch engine's weights are the bundled Q4_1 GGUF de-quantized and rounded to bf16, so a bf16 copy holds
    exactly the trainer's weights: sampling from it leaves only the kernels' arithmetic between sampler and trainer.
    """
    import gguf
    import numpy as np

    if dtype not in ("bf16", "f16"):
        raise ValueError(f"dtype must be 'bf16' or 'f16', not {dtype!r}")
    want = gguf.GGMLQuantizationType.BF16 if dtype == "bf16" else gguf.GGMLQuantizationType.F16
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    with _gguf_written(dst, arch) as writer:
        _copy_fields(reader, writer, int(gguf.LlamaFileType.MOSTLY_BF16 if dtype == "bf16"
                                         else gguf.LlamaFileType.MOSTLY_F16))
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if t.tensor_type in (gguf.GGMLQuantizationType.F32,):
                writer.add_tensor(t.name, np.asarray(t.data, dtype=np.float32).reshape(shape))
                continue
            dense = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
            if dtype == "bf16":
                writer.add_tensor(t.name, gguf.quants.quantize(dense, want), raw_dtype=want)
            else:
                writer.add_tensor(t.name, dense.astype(np.float16))
    return dst
