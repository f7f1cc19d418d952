"""The voice socket's messages: its limits, its errors and the client's frames read and checked.

`homeai.api.voice` runs a session with these, `homeai.api.voice_turn` answers an utterance;
nothing here touches the socket, the store or the answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from homeai.api.schemas import MAX_INT64
from homeai.service import ServiceError
from homeai.service.text import find_invalid_text
from homeai.speech.base import MAX_RATE, MIN_RATE, resample

# One message; 8 s of 16 kHz audio. A larger one gets an error and is dropped (and one over
# server.max_ws_message_bytes closes the socket: uvicorn's hard cap).
MAX_MESSAGE_BYTES = 256 * 1024
AUTH_TIMEOUT_S = 10.0  # an unauthenticated socket must send session.start with a token by then
PRE_ROLL_S = 1.0  # with server VAD, the audio kept from before the speech starts
CLOSE_UNAUTHORIZED, CLOSE_FORBIDDEN, CLOSE_TOO_MANY, CLOSE_INTERNAL_ERROR = 4401, 4403, 4429, 1011
LANGUAGE = re.compile(r"^[a-z]{2,3}$")


class VoiceError(Exception):
    """Sent to the client as an `error` event; the socket stays usable."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def error_event(e: VoiceError | ServiceError) -> dict:
    """The `error` event of a refusal: its code, message and, when it names one, the field (`param`)."""
    event = {"type": "error", "code": e.code, "message": e.message}
    if e.param:
        event["param"] = e.param
    return event


class CloseSocket(Exception):
    """Ends the session: the socket is closed with `code`."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason


class Unauthorized(CloseSocket):
    def __init__(self, reason: str):
        super().__init__(CLOSE_UNAUTHORIZED, reason)


@dataclass(frozen=True)
class Settings:
    """What `session.start` asked for, checked."""

    sample_rate: int
    language: str | None  # None: detected
    vad: bool
    conversation_id: int | None
    tools: list | None = None  # OpenAI-shaped tool definitions (checked at session.start)
    tool_choice: object = None
    speak: bool = False  # answers spoken too (homeai.api.voice_audio)
    voice: str | None = None  # the voice they are spoken with; None: the default one


def parse(text: str) -> dict:
    """A text frame -> its JSON object (`invalid_json`, `invalid_text` when it is not one)."""
    try:
        message = json.loads(text)
    except ValueError as e:
        raise VoiceError("invalid_json", f"a text frame must be JSON: {e}") from None
    except RecursionError:
        raise VoiceError("invalid_json", "a text frame must be JSON: it is nested too deeply") from None
    if not isinstance(message, dict):
        raise VoiceError("invalid_json", "a text frame must be a JSON object with a type")
    path = find_invalid_text(message)
    if path is not None:
        raise VoiceError("invalid_text", f"{path}: not valid Unicode text (a lone surrogate, \\ud800-\\udfff)")
    return message


def parse_settings(message: dict) -> Settings:
    """The settings of a `session.start` message, each field checked."""
    rate = message.get("sample_rate")
    if not isinstance(rate, int) or isinstance(rate, bool):
        raise VoiceError("invalid_value", f"session.start needs sample_rate, an integer in Hz, got {rate!r}")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise VoiceError("unsupported_sample_rate",
                         f"unsupported sample rate {rate} Hz (accepted: {MIN_RATE}..{MAX_RATE}, best 16000)")
    language = message.get("language", "en")
    if language is not None and not (isinstance(language, str) and LANGUAGE.match(language)):
        raise VoiceError("invalid_value", f"language must be a language code like 'en', or null, got {language!r}")
    vad = message.get("vad", False)
    if not isinstance(vad, bool):
        raise VoiceError("invalid_value", f"vad must be true or false, got {vad!r}")
    tools = message.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise VoiceError("invalid_tools", "tools must be a list of OpenAI tool definitions")
    conversation_id = message.get("conversation_id")
    if conversation_id is not None and (not isinstance(conversation_id, int) or isinstance(conversation_id, bool)
                                        or not 1 <= conversation_id <= MAX_INT64):  # a database id, as the routes take
        raise VoiceError("invalid_value", f"conversation_id must be an integer 1..{MAX_INT64}, got {conversation_id!r}")
    speak, voice = message.get("speak", False), message.get("voice")
    if not isinstance(speak, bool):
        raise VoiceError("invalid_value", f"speak must be true or false, got {speak!r}", "speak")
    if voice is not None and not (isinstance(voice, str) and voice.strip()):
        raise VoiceError("invalid_value", f"voice must be a voice's name, or null, got {voice!r}", "voice")
    return Settings(rate, language, vad, conversation_id, tools or None, message.get("tool_choice"), speak, voice)


def at_16k(pcm: bytes, sample_rate: int) -> bytes:
    """PCM16 at the session's rate -> PCM16 at 16 kHz, what the end-of-speech detector hears."""
    if sample_rate == 16000:
        return pcm
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    return resample(audio, sample_rate).astype("<i2").tobytes()
