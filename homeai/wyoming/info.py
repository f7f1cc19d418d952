"""What `describe` answers: Wyoming's `info` event, built from what the service says when it is asked.

    asr  one program: the speech model in force (listed while it loads, as before);
         `supports_transcript_streaming` as `wyoming.transcript_streaming` says
    tts  one program with the loaded voice(s) and `supports_synthesize_streaming`; while the
         models still load, the voice being loaded (read from its .onnx.json, not loaded);
         none at all when text to speech is unavailable (`tts.enabled` off, or it failed to
         load: `service.speaking.offered()`), so Home Assistant offers no voice that cannot speak

A voice's languages are its .onnx.json's `language.code` ("en_US"), as wyoming-piper lists them,
else its espeak-ng voice ("en-us").
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from homeai import __version__
from homeai.wyoming.framing import Event

DEFAULT_LANGUAGE = "en"
EMBEDDED_MODEL = "tiny.en"
PIPER = {"name": "Piper", "url": "https://github.com/OHF-Voice/piper1-gpl"}
PIPER_VOICES = {"name": "rhasspy", "url": "https://huggingface.co/rhasspy/piper-voices"}


def describe(service) -> Event:
    """The `info` answer to `describe`."""
    tts = tts_program(service)
    return Event("info", {"asr": [asr_program(service.cfg)], "tts": [tts] if tts else [], "handle": [],
                          "intent": [], "wake": [], "mic": [], "snd": []})


def asr_program(cfg) -> dict:
    model = Path(cfg.speech.model).name if cfg.speech.model else EMBEDDED_MODEL
    attribution = {"name": "SYSTRAN faster-whisper", "url": "https://github.com/SYSTRAN/faster-whisper"}
    return {"name": "homeai", "description": "homeai speech to text (faster-whisper)", "attribution": attribution,
            "installed": True, "version": __version__,
            "supports_transcript_streaming": cfg.wyoming.transcript_streaming,
            "models": [{"name": model, "description": f"Whisper {model}",
                        "attribution": {"name": "OpenAI", "url": "https://github.com/openai/whisper"},
                        "installed": True, "version": None, "languages": [DEFAULT_LANGUAGE]}]}


def tts_program(service) -> dict | None:
    """The text-to-speech program, or None when there is none to offer."""
    voices = service.speaking.offered()
    if not voices:
        return None
    return {"name": "homeai", "description": "homeai text to speech (piper)", "attribution": PIPER,
            "installed": True, "version": __version__, "supports_synthesize_streaming": True,
            "voices": [_voice(name, path) for name, path in voices]}


def _voice(name: str, path: Path) -> dict:
    return {"name": name, "description": f"Piper voice {name}", "attribution": PIPER_VOICES, "installed": True,
            "version": None, "languages": list(voice_languages(str(path))), "speakers": None}


@functools.lru_cache(maxsize=16)
def voice_languages(onnx_path: str) -> tuple[str, ...]:
    """The languages a piper voice speaks, from the .onnx.json beside it (read once per voice)."""
    try:
        with open(f"{onnx_path}.json", encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return ()
    if not isinstance(config, dict):
        return ()
    language, espeak = config.get("language"), config.get("espeak")
    code = language.get("code") if isinstance(language, dict) else None
    if not isinstance(code, str) or not code:
        code = espeak.get("voice") if isinstance(espeak, dict) else None
    return (code,) if isinstance(code, str) and code else ()
