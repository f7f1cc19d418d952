"""The household's turns as the service reads them (`homeai.api.household_images.prompt`): each
message's images before its text as their marks, numbered across the conversation, the latest
`[limits] max_images` only (the question's always), earlier ones only for a model that reads images."""

from __future__ import annotations

import base64

from homeai.api.household_images import Turn, media_type, prompt
from homeai.config import LimitsConfig
from homeai.engine.prompt import image_mark


def files(*names: str) -> tuple[bytes, ...]:
    return tuple(name.encode() for name in names)


def read(images) -> list[str]:
    return [base64.b64decode(i.data).decode() for i in images]


TURNS = [Turn("user", "porch?", files("a", "b"), "messages.1.images"), Turn("assistant", "a cat"),
         Turn("user", "garden?", files("c"), "messages.3.images"), Turn("assistant", "a dog"),
         Turn("user", "and now?", files("d", "e"))]


def test_marks_before_each_message_text_numbered_across_the_conversation():
    messages, images = prompt(TURNS, LimitsConfig(max_images=8))
    assert [m["content"] for m in messages] == [
        image_mark(0) + "\n" + image_mark(1) + "\nporch?", "a cat", image_mark(2) + "\ngarden?", "a dog",
        image_mark(3) + "\n" + image_mark(4) + "\nand now?"]
    assert read(images) == ["a", "b", "c", "d", "e"]
    assert [i.param for i in images] == ["messages.1.images.0", "messages.1.images.1", "messages.3.images.0",
                                         "images.0", "images.1"]


def test_only_the_latest_images_a_request_may_read():
    messages, images = prompt(TURNS, LimitsConfig(max_images=3))
    assert read(images) == ["c", "d", "e"]
    assert messages[0]["content"] == "porch?" and messages[2]["content"] == image_mark(0) + "\ngarden?"


def test_a_model_that_reads_no_image_gets_only_the_questions():
    messages, images = prompt(TURNS, LimitsConfig(), stored=False)
    assert read(images) == ["d", "e"] and messages[0]["content"] == "porch?"
    assert prompt(TURNS[:4], LimitsConfig(), stored=False) == ([{"role": t.role, "content": t.content}
                                                                for t in TURNS[:4]], ())


def test_stored_files_a_lowered_size_limit_refuses_are_left_out():
    big = Turn("user", "big?", (b"x" * 2048,), "messages.1.images")
    _, images = prompt([big, Turn("assistant", "ok"), Turn("user", "more?", files("q"))],
                       LimitsConfig(max_image_bytes=1024))
    assert read(images) == ["q"]


def test_media_type_from_the_first_bytes():
    assert media_type(b"\x89PNG\r\n\x1a\n....") == "image/png"
    assert media_type(b"\xff\xd8\xff\xe0") == "image/jpeg"
    assert media_type(b"GIF89a") == "image/gif" and media_type(b"BM....") == "image/bmp"
    assert media_type(b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
