"""`POST /v1/audio/transcriptions`: OpenAI's multipart form, answered by the speech model.

Form fields: `file` (WAV, or anything PyAV decodes: MP3, OGG, FLAC, WebM...), `model` (any
name: there is one speech model; OpenAI clients send "whisper-1"), `language` (a code like
"en"; none: detected), `response_format` (`json` {"text"}, `text`, or `verbose_json` with the
language, duration and segments). OpenAI's other fields (`prompt`, `temperature`, ...) are
accepted and ignored. A file that is not audio, or is longer than `speech.max_utterance_s`,
is a 400; the transcription runs on the speech model's bounded pool (a full pool is a 503).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from homeai.api.auth import current_member
from homeai.api.deps import RuntimeDep
from homeai.api.errors import ApiError
from homeai.speech.base import AudioError, SpeechBusy, Transcript

router = APIRouter(prefix="/v1/audio", tags=["audio"], dependencies=[Depends(current_member)])

Format = Literal["json", "text", "verbose_json"]


@router.post("/transcriptions")
async def transcriptions(runtime: RuntimeDep, file: Annotated[UploadFile, File()],
                         model: Annotated[str | None, Form()] = None,
                         language: Annotated[str | None, Form()] = None,
                         response_format: Annotated[Format, Form()] = "json") -> Response:
    stt = runtime.stt
    if stt is None:
        loading = runtime.engine is None and not runtime.stt_error
        message = "speech to text is still loading; retry shortly" if loading else (
            runtime.stt_error or "speech to text is not loaded")
        raise ApiError(503, message, code="model_loading" if loading else "speech_unavailable",
                       headers={"Retry-After": "5"} if loading else None)
    data = await file.read()
    try:
        transcript = await stt.transcribe_file_async(data, language or None)
    except AudioError as e:
        raise ApiError(400, str(e), code="invalid_audio", param="file") from None
    except SpeechBusy as e:
        raise ApiError(503, str(e), code="speech_busy", headers={"Retry-After": "1"}) from None
    if response_format == "text":
        return PlainTextResponse(transcript.text + "\n")
    if response_format == "verbose_json":
        return JSONResponse(_verbose(transcript))
    return JSONResponse({"text": transcript.text})


def _verbose(t: Transcript) -> dict:
    segments = [{"id": i, "start": start, "end": end, "text": text}
                for i, (start, end, text) in enumerate(t.segments)]
    return {"task": "transcribe", "language": t.language, "duration": t.duration_s, "text": t.text,
            "segments": segments}
