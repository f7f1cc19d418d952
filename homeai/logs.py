"""What `homeai serve` logs through, and that no secret is written: tokens are redacted from every line.

uvicorn's access log records each request's path with its query string, and `?token=hai_...`
is a login the voice socket accepts, so a plain access log would keep members' tokens.
`config(level)` is uvicorn's logging config with `RedactSecrets` on its two handlers, which
every line passes through: uvicorn's access and error loggers, homeai's own loggers and the
warnings of every other library (the root logger). A redacted line keeps its shape:

    "WebSocket /v1/voice?token=[redacted]" [accepted]

A token is found in any case ("HAI_...") and percent-encoded too ("hai%5F...", even twice): a
line that hides one behind percent-encoding is written decoded, with the secret cut.
"""

from __future__ import annotations

import copy
import logging
import re
from urllib.parse import unquote

from uvicorn.config import LOGGING_CONFIG

REDACTED = "[redacted]"
SECRETS = (
    # a query or form value named like a credential: ?token=..., &access_token=..., api_key=...
    (re.compile(r"(?i)\b([\w-]*(?:token|key|secret|password)=)[^&\s\"'<>]+"), r"\1" + REDACTED),
    # an Authorization header, however it is printed: "Authorization: Basic ...", {'authorization': '...'}
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)[^\"'\r\n,}]+"), r"\1" + REDACTED),
    (re.compile(r"(?i)\b(bearer\s+)[^\s\"',;}]+"), r"\1" + REDACTED),
    # a member token wherever else it appears (a path, an error message), in any case: "HAI_..."
    (re.compile(r"(?i)(?<![a-z0-9])hai_[A-Za-z0-9_-]+"), "hai_" + REDACTED),
)
MAX_DECODES = 3  # percent-decoding rounds: "hai%255F..." is "hai_..." encoded twice


def redact(text: str) -> str:
    """`text` with its secrets cut, also those percent-encoded ("hai%5F...", "token%3D..."): a line
    hiding one is written decoded, with the secret cut."""
    decoded = text
    for _ in range(MAX_DECODES):
        decoded, previous = unquote(decoded, errors="replace"), decoded
        if decoded == previous:
            break
    if decoded != text and _redact_plain(decoded) != decoded:
        return _redact_plain(decoded)  # decoded whole: a token's tail may be encoded ("hai_abc%2Ddef")
    return _redact_plain(text)


def _redact_plain(text: str) -> str:
    for pattern, replacement in SECRETS:
        text = pattern.sub(replacement, text)
    return text


class RedactSecrets(logging.Filter):
    """Redacts a record's message, arguments and traceback in place. Arguments stay arguments
    (uvicorn's access formatter unpacks them), so each is redacted on its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _redact_arg(arg) for key, arg in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _redact_arg(arg):
    if arg is None or isinstance(arg, (bool, int, float)):
        return arg  # numbers keep their %d
    if isinstance(arg, str):
        return redact(arg)
    text = f"{arg} {arg!r}"
    return redact(str(arg)) if redact(text) != text else arg  # an object printing a secret becomes its redacted text


def config(level: str = "info") -> dict:
    """uvicorn's logging config, every handler redacting, homeai's loggers and the root's warnings on it."""
    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["filters"] = {"redact": {"()": RedactSecrets}}
    for handler in cfg["handlers"].values():
        handler["filters"] = ["redact"]
    cfg["loggers"]["homeai"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    cfg["root"] = {"handlers": ["default"], "level": "WARNING"}
    return cfg
