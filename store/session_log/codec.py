"""Storage encodings and input checks shared by the session-log modules.

Token ids are little-endian int32 BLOBs and logprobs little-endian float64 BLOBs (exact, NaN payloads included); free
text is TEXT (`RawText`, a UTF-8 BLOB in SQLite, when it holds lone surrogates; see `store.db.dialect` for how
PostgreSQL keeps it); options, metrics, attrs and judge payloads are JSON text; timestamps are fixed-width UTC ISO-8601
strings.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import get_args

from store.db.dialect import RawText
from store.errors import InvalidInput
from store.records import FinishReason, TokenSource

TOKEN_SOURCES: tuple[str, ...] = get_args(TokenSource)
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)
_MAX_ID_LEN = 200
# array's "i" is a C int; pick whichever typecode is 4 bytes here so the on-disk format is the same everywhere.
_I32 = next(code for code in ("i", "l") if array(code).itemsize == 4)
_BIG_ENDIAN = sys.byteorder == "big"


def pack_ids(ids: Sequence[int], what: str) -> bytes:
    try:
        arr = array(_I32, ids)
    except (OverflowError, TypeError) as exc:
        raise InvalidInput(f"{what}: token ids must be integers in [0, 2**31): {exc}") from exc
    if arr and min(arr) < 0:
        raise InvalidInput(f"{what}: token ids must be integers in [0, 2**31); got {min(arr)}")
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def unpack_ids(blob: bytes) -> tuple[int, ...]:
    arr = array(_I32)
    arr.frombytes(blob)
    if _BIG_ENDIAN:
        arr.byteswap()
    return tuple(arr)


def pack_floats(values: Sequence[float], what: str) -> bytes:
    try:
        arr = array("d", values)
    except TypeError as exc:
        raise InvalidInput(f"{what}: logprobs must be floats: {exc}") from exc
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def unpack_floats(blob: bytes) -> tuple[float, ...]:
    arr = array("d")
    arr.frombytes(blob)
    if _BIG_ENDIAN:
        arr.byteswap()
    return tuple(arr)


def text_in(value: object, what: str) -> str | bytes:
    """Free text goes in as TEXT; a str with lone surrogates (not valid Unicode) as `RawText`, so nothing is lost."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return RawText(value.encode("utf-8", "surrogatepass"))
    return value


def text_out(value: str | bytes) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def opt_text_in(value: object, what: str) -> str | bytes | None:
    return None if value is None else text_in(value, what)


def opt_text_out(value: str | bytes | None) -> str | None:
    return None if value is None else text_out(value)


def label_in(value: object, what: str, *, allow_empty: bool = False) -> str:
    """Identifiers (ids, versions, hashes, model names): short valid-Unicode str, non-empty unless allowed."""
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > _MAX_ID_LEN:
        raise InvalidInput(f"{what} must be a non-empty str of at most {_MAX_ID_LEN} characters, got {value!r:.80}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} is not valid Unicode: {value!r:.80}") from exc
    return value


def json_in(value: object, what: str) -> str:
    # ASCII-escaped, so any str (lone surrogates included) survives; NaN/inf rejected because they are not JSON.
    try:
        return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} must be JSON-serialisable (str keys, no NaN/inf): {exc}") from exc


def mapping_in(value: object, what: str) -> str:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a mapping, got {type(value).__name__}")
    return json_in(dict(value), what)


def choice_in(value: object, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise InvalidInput(f"{what} must be one of {allowed}, got {value!r:.80}")
    return value


def iso(moment: datetime) -> str:
    """Fixed-width UTC ISO-8601 (naive datetimes are taken as UTC), so that text order is time order."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")
