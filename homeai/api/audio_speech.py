"""`POST /v1/audio/speech`: OpenAI's text to speech, answered by piper, streamed as it is synthesised.

The JSON body is OpenAI's: `input` (the text; Markdown is not read out, code blocks are left out),
`voice`, `model` (any name: there is one synthesiser; OpenAI clients send "tts-1" or
"gpt-4o-mini-tts"; `<name>:<lane>` picks a lane as the chat routes' names do), `response_format`
and `speed` (0.25-4.0). `instructions` is accepted and ignored; `stream_format` is "audio" only.

* `voice`: a loaded piper voice's name (the embedded `en_US-joe-medium`), or one of OpenAI's own
  voices (alloy, echo, nova, ...), which say the default voice: OpenAI's clients require a voice
  and tools preset one of these, so refusing them would break every client configured for OpenAI.
  Any other name is a 400 naming `voice` and the voices there are.
* `response_format`: "wav" (the default here: OpenAI's "mp3" is not made) streams a WAV header
  whose lengths are unknown (0xFFFFFFFF, as streaming WAV writers do), then PCM16 mono at the
  voice's rate; "pcm" is OpenAI's raw PCM16 mono at 24 kHz (resampled), the rate also in the
  `X-HomeAI-Sample-Rate` header. Any other format is a 400 naming `response_format`.

The member needs the lane (default chat, else `X-HomeAI-Lane` or the body's `lane`), which sets
the synthesis priority (voice before chat before background); the member's share of the
speech-out pool is theirs alone (`homeai.speech.synthesis_queue`). Refusals before any audio are
the service's (`homeai.service.speaking`): 400s naming the field (a control character or a lone
surrogate in `input` too: `invalid_text`), 503 `tts_unavailable` (chat serves on), `tts_busy`
with `Retry-After`: 429 when the member already has `tts.max_pending_per_member` syntheses open,
503 when the pool has no room left for the lane. The first sentence is synthesised before the
answer starts, so these arrive as statuses; a client that leaves stops the synthesis at its next
sentence and gives its slot back.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from homeai.api.auth import CurrentMember, current_member
from homeai.api.deps import LaneHeader, ServiceDep
from homeai.api.schemas import RequestBody
from homeai.service import ServiceError
from homeai.speech.base import resample_pcm16

router = APIRouter(prefix="/v1/audio", tags=["audio"], dependencies=[Depends(current_member)])
log = logging.getLogger("homeai.api")

OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer",
                           "verse", "marin", "cedar"})
PCM_RATE = 24_000  # OpenAI's "pcm": 24 kHz, 16-bit signed little-endian, mono
FORMATS = ("wav", "pcm")
UNKNOWN_LENGTH = 0xFFFFFFFF


class SpeechRequest(RequestBody):
    input: str
    model: str | None = None
    voice: str | None = None
    response_format: str = "wav"
    speed: float = 1.0
    instructions: str | None = None  # OpenAI's tone hints for its own models: piper has none
    stream_format: Literal["audio"] = "audio"
    lane: str | None = None  # homeai's: the synthesis priority's lane (also X-HomeAI-Lane)


AUDIO = {200: {"description": "The speech, streamed as it is synthesised",
               "content": {"audio/wav": {"schema": {"type": "string", "format": "binary"}},
                           "audio/pcm": {"schema": {"type": "string", "format": "binary"}}}}}


@router.post("/speech", response_class=StreamingResponse, responses=AUDIO)
async def speech(body: SpeechRequest, service: ServiceDep, member: CurrentMember,
                 lane_header: LaneHeader = None) -> StreamingResponse:
    lane, _policy = service.request_lane(member, model=body.model, lane=body.lane, header=lane_header, default="chat")
    if body.response_format not in FORMATS:
        raise ServiceError(400, f"response_format {body.response_format!r} is not made here; use one of "
                           f"{', '.join(FORMATS)}", code="invalid_value", param="response_format")
    speaking = service.speaking
    voice = speaking.check(body.input, None if body.voice in OPENAI_VOICES else body.voice, body.speed)
    rate = speaking.sample_rate(voice)
    frames = speaking.speak(body.input, lane=lane, member=member.key, voice=voice, speed=body.speed)
    first = await _first(frames)  # refusals (a busy pool) still as a status, before the answer starts
    if body.response_format == "pcm":
        audio = _resampled(first, frames, rate, PCM_RATE)
        return StreamingResponse(audio, media_type="audio/pcm", headers={"X-HomeAI-Sample-Rate": str(PCM_RATE)})
    return StreamingResponse(_wav(first, frames, rate), media_type="audio/wav",
                             headers={"X-HomeAI-Sample-Rate": str(rate)})


async def _first(frames: AsyncIterator[bytes]) -> bytes:
    try:
        return await anext(frames)
    except StopAsyncIteration:
        return b""
    except BaseException:
        await frames.aclose()
        raise


def wav_header(sample_rate: int) -> bytes:
    """A PCM16 mono WAV header for a stream whose length is not known yet."""
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, 2 * sample_rate, 2, 16)
    return (b"RIFF" + struct.pack("<I", UNKNOWN_LENGTH) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", UNKNOWN_LENGTH))


async def _wav(first: bytes, frames: AsyncIterator[bytes], rate: int) -> AsyncIterator[bytes]:
    yield wav_header(rate) + first
    async for pcm in _rest(frames):
        yield pcm


async def _resampled(first: bytes, frames: AsyncIterator[bytes], rate: int, to_rate: int) -> AsyncIterator[bytes]:
    yield resample_pcm16(first, rate, to_rate)
    async for pcm in _rest(frames):
        yield resample_pcm16(pcm, rate, to_rate)


async def _rest(frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The frames after the first; a failure now can only end the audio early (the status is sent)."""
    try:
        async for pcm in frames:
            yield pcm
    except ServiceError as e:
        log.warning("speech cut short: %s", e.message)
    finally:
        await frames.aclose()
