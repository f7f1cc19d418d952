"""`POST /v1/audio/transcriptions`: OpenAI's multipart form, answered by the speech model.

Form fields: `file` (WAV, or anything PyAV decodes: MP3, OGG, FLAC, WebM...), `model` (any
name: there is one speech model; OpenAI clients send "whisper-1"), `language` (a code like
"en"; none: detected), `response_format` (`json` {"text"}, `text`, or `verbose_json` with the
language, duration and segments). OpenAI's other fields (`prompt`, `temperature`, ...) are
accepted and ignored. A file that is not audio, or is longer than `speech.max_utterance_s`,
is a 400; the transcription is the service's speech in (`service.hearing`: `homeai.service.hearing`), on the speech
model's bounded pool (a full pool is a 503).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from homeai.api.auth import current_member
from homeai.api.deps import ServiceDep
from homeai.speech.base import Transcript

router = APIRouter(prefix="/v1/audio", tags=["audio"], dependencies=[Depends(current_member)])

Format = Literal["json", "text", "verbose_json"]


@router.post("/transcriptions")
async def transcriptions(service: ServiceDep, file: Annotated[UploadFile, File()],
                         model: Annotated[str | None, Form()] = None,
                         language: Annotated[str | None, Form()] = None,
                         response_format: Annotated[Format, Form()] = "json") -> Response:
    service.hearing.model()  # no speech model: a 503 saying why, before the upload is read
    transcript = await service.hearing.transcribe_file(await file.read(), language or None)
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
