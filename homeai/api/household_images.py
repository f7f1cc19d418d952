"""The household's images (issue 53): those a member sends with a message, checked before anything is
stored, and a conversation's turns as the service reads them, each stored image where it was sent.

A message's images go in before its text, each as its mark (`homeai.engine.prompt.image_mark`) and a
newline, as homeai's Ollama route places them, numbered in order across the whole conversation. A
request reads at most `[limits] max_images` images: the conversation's latest (the question's own
always among them); older ones, and stored ones a lowered `[limits] max_image_bytes` now refuses,
are left out of the prompt, their text kept. The service's fit then drops what the context cannot hold.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from homeai.api.errors import ApiError
from homeai.config import LimitsConfig
from homeai.engine.prompt import image_mark
from homeai.service import images
from homeai.service.asks import ImageIn

# The file's first bytes name its type: stored and served as what it is, whatever the data URL said.
MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
         (b"GIF89a", "image/gif"), (b"BM", "image/bmp"))


@dataclass(frozen=True)
class Turn:
    """A message of the conversation as the prompt needs it, with its images' files."""

    role: str
    content: str
    files: tuple[bytes, ...] = ()
    param: str = "images"  # where its images came from, for errors: the body's `images`, or a stored message


def read(urls: Sequence[str], limits: LimitsConfig) -> list[tuple[str, bytes]]:
    """The body's `images` (data URLs), each read as the model would read it, as (media type, file):
    a 400 naming the one at fault (`images.N`), or too many."""
    try:
        images.check_count(len(urls), limits)
    except images.ImageRefused as e:
        raise ApiError(400, str(e), code="too_many_images", param="images") from None
    files = []
    for i, url in enumerate(urls):
        try:
            images.from_url(url, limits)
        except images.ImageRefused as e:
            raise ApiError(400, f"images.{i}: {e}", code="invalid_image", param=f"images.{i}") from None
        data = base64.b64decode("".join(url.partition(",")[2].split()))  # read above: valid base64
        files.append((media_type(data), data))
    return files


def media_type(data: bytes) -> str:
    """The media type of a file `homeai.service.images` read (PNG, JPEG, GIF, BMP or WebP)."""
    for magic, kind in MAGIC:
        if data.startswith(magic):
            return kind
    return "image/webp"  # RIFF....WEBP, the one format left


def prompt(turns: Sequence[Turn], limits: LimitsConfig, *,
           stored: bool = True) -> tuple[list[dict], tuple[ImageIn, ...]]:
    """The chat messages and the images their marks name: the latest `max_images` (`stored`: the images
    of earlier messages too; a model that reads no image gets only the question's, which it refuses)."""
    last = len(turns) - 1
    kept = [(t, j) for t, turn in enumerate(turns) for j, data in enumerate(turn.files)
            if t == last or (stored and len(data) <= limits.max_image_bytes)]
    kept = set(kept[max(0, len(kept) - limits.max_images):])
    messages, found = [], []
    for t, turn in enumerate(turns):
        marks = []
        for j, data in enumerate(turn.files):
            if (t, j) in kept:
                marks.append(image_mark(len(found)) + "\n")
                found.append(ImageIn(base64.b64encode(data).decode("ascii"), param=f"{turn.param}.{j}"))
        messages.append({"role": turn.role, "content": "".join(marks) + turn.content})
    return messages, tuple(found)
