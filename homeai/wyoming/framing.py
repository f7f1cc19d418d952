"""Wyoming's framing: an event is a JSON header line, then optional JSON data, then an optional payload.

    {"type": "audio-chunk", "version": "1.8.0", "data_length": 42, "payload_length": 2048}\n
    {"rate": 16000, "width": 2, "channels": 1}<2048 bytes of PCM>

The data may also come inline, as the header's `data` object (with both, the data bytes are
merged over it). `read_event` trusts nothing it has not checked: a header that is not a JSON
object with a `type`, a length that is not an integer in 0..max_bytes, or data that is not a
JSON object is a `WyomingError`, after which the stream's position is lost and the connection
must close. The header line's own limit is the stream reader's (`asyncio.start_server(limit=...)`).
An event read whole whose text is not valid Unicode (a lone surrogate, `"\\ud800"`, in its type,
version or data) is an `EventRefused`: the stream is intact, so the connection goes on.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from homeai.service.text import find_invalid_text

PROTOCOL_VERSION = "1.8.0"  # written in every header we send; clients do not check it


@dataclass(frozen=True)
class Event:
    type: str
    data: dict = field(default_factory=dict)
    payload: bytes = b""


class WyomingError(Exception):
    """Sent to the client as an `error` event {text, code}; the connection is then closed."""

    def __init__(self, code: str, text: str):
        super().__init__(text)
        self.code, self.text = code, text


class EventRefused(WyomingError):
    """An event read whole but refused: sent as an `error` event, and the connection goes on."""


async def read_event(reader: asyncio.StreamReader, max_bytes: int) -> Event | None:
    """The next event, or None when the client closed the connection between events."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise WyomingError("bad_frame", "the connection closed inside an event header") from None
    except asyncio.LimitOverrunError:
        raise WyomingError("frame_too_large", f"an event header is over {max_bytes} bytes") from None
    header = _json_object(line, "the event header")
    kind = header.get("type")
    if not isinstance(kind, str) or not kind:
        raise WyomingError("bad_frame", "the event header has no type")
    version = header.get("version")
    if version is not None and not isinstance(version, str):
        raise WyomingError("bad_frame", f"version must be a string, got {version!r}")
    data = header.get("data")
    if data is not None and not isinstance(data, dict):
        raise WyomingError("bad_frame", "the event's data must be a JSON object")
    data_length = _length(header, "data_length", max_bytes)
    payload_length = _length(header, "payload_length", max_bytes)
    data = dict(data or {})
    suspect = _may_hold_surrogates(line)
    if data_length:
        raw = await _exactly(reader, data_length)
        data.update(_json_object(raw, "the event's data"))
        suspect = suspect or _may_hold_surrogates(raw)
    payload = await _exactly(reader, payload_length) if payload_length else b""
    if suspect:  # checked once the event is read whole: refused, it leaves the stream where it was
        _check_text(header, data)
    return Event(kind, data, payload)


def encode(event: Event) -> bytes:
    """The event's bytes on the wire, its data after the header (`data_length`), as Wyoming's own library writes."""
    header: dict = {"type": event.type, "version": PROTOCOL_VERSION}
    data = json.dumps(event.data, ensure_ascii=False).encode() if event.data else b""
    if data:
        header["data_length"] = len(data)
    if event.payload:
        header["payload_length"] = len(event.payload)
    return json.dumps(header).encode() + b"\n" + data + event.payload


def _length(header: dict, key: str, max_bytes: int) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WyomingError("bad_frame", f"{key} must be a non-negative integer, got {value!r}")
    if value > max_bytes:
        raise WyomingError("frame_too_large", f"{key} {value} is over the {max_bytes} byte limit "
                           "(wyoming.max_frame_bytes)")
    return value


def _may_hold_surrogates(raw: bytes) -> bool:
    """Whether JSON text may decode to a lone surrogate: through an escape ("\\ud800"), a surrogate
    written in UTF-8 (0xED 0xA0..0xBF, which json.loads lets through), or UTF-16/32 (NUL bytes)."""
    return b"\\u" in raw or b"\xed" in raw or b"\x00" in raw


def _check_text(header: dict, data: dict) -> None:
    """Text that cannot be written back out (a lone surrogate) is refused where it enters."""
    where = find_invalid_text(header)  # the type, the version, inline data ("data.text")
    if where is None and (found := find_invalid_text(data)) is not None:
        where = f"data.{found}"
    if where is not None:
        kind = header["type"].encode("utf-8", "backslashreplace").decode()
        raise EventRefused("invalid_text", f"the {kind} event holds text that is not valid Unicode "
                           f"(a lone surrogate) at {where}; the event was ignored")


async def _exactly(reader: asyncio.StreamReader, num_bytes: int) -> bytes:
    try:
        return await reader.readexactly(num_bytes)
    except asyncio.IncompleteReadError:
        raise WyomingError("bad_frame", "the connection closed inside an event") from None


def _json_object(raw: bytes, what: str) -> dict:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError too
        raise WyomingError("bad_frame", f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise WyomingError("bad_frame", f"{what} must be a JSON object")
    return value
