"""Images from clients (`homeai.service.images`): what is read, how it is made upright RGB, and what is refused.

No model, no server: images are made with Pillow in memory, and the hostile ones (decompression
bombs) are written chunk by chunk.

Run: .venv/bin/python -m pytest -q tests/api/test_images.py
"""

from __future__ import annotations

import base64
import io
import resource
import struct
import tracemalloc
import zlib

import pytest
from PIL import Image

from homeai.service import images
from homeai.service.images import ImageRefused, check_count, decode, from_base64, from_url
from homeai.config import LimitsConfig

LIMITS = LimitsConfig()
SMALL = LimitsConfig(max_image_pixels=4096)  # a bomb is then anything over 4 x 4096 = 16,384 pixels (a JPEG 64x)
RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 200, 0), (0, 0, 255), (255, 255, 255)


def encoded(img: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **params)
    return out.getvalue()


def pattern(size=(6, 4)) -> Image.Image:
    """Green with a red top-left pixel: where that pixel lands shows any turn."""
    img = Image.new("RGB", size, GREEN)
    img.putpixel((0, 0), RED)
    return img


def pixel(picture: images.Picture, x: int, y: int) -> tuple[int, int, int]:
    i = (y * picture.width + x) * 3
    return tuple(picture.rgb[i:i + 3])


def near(got, want, tolerance=12) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(got, want))


def png_declaring(width: int, height: int, num_rows: int) -> bytes:
    """An 8-bit grey PNG whose header declares width x height, with `num_rows` rows of zeros."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (width + 1) * num_rows, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


# What is read.

@pytest.mark.parametrize("fmt, lossless", [("PNG", True), ("JPEG", False), ("WEBP", False), ("GIF", True),
                                           ("BMP", True)])
def test_each_format_is_read(fmt, lossless):
    picture = decode(encoded(pattern(), fmt), LIMITS)
    assert (picture.width, picture.height) == (6, 4)
    assert len(picture.rgb) == 6 * 4 * 3
    assert near(pixel(picture, 5, 3), GREEN, 0 if lossless else 12)
    if lossless:
        assert pixel(picture, 0, 0) == RED


def test_gif_is_its_first_frame():
    frames = [Image.new("RGB", (4, 4), BLUE), Image.new("RGB", (4, 4), RED)]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert pixel(decode(data, LIMITS), 2, 2) == BLUE


def test_base64_and_data_urls():
    data = encoded(pattern(), "PNG")
    plain = base64.b64encode(data).decode()
    wrapped = "\n".join(plain[i:i + 76] for i in range(0, len(plain), 76))  # MIME-style line breaks
    url = "data:image/png;base64," + plain
    pictures = [from_base64(plain, LIMITS), from_base64(wrapped, LIMITS), from_base64(url, LIMITS),
                from_url(url, LIMITS)]
    assert len({p.digest for p in pictures}) == 1
    assert pixel(pictures[0], 0, 0) == RED


@pytest.mark.parametrize("mode", ["P", "L", "1", "LA", "CMYK", "I;16"])
def test_every_mode_becomes_rgb(mode):
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    picture = decode(encoded(pattern().convert(mode), fmt), LIMITS)
    assert len(picture.rgb) == picture.width * picture.height * 3


def test_16_bit_grey_keeps_its_high_byte():
    picture = decode(encoded(Image.new("I;16", (2, 2), 40_000), "PNG"), LIMITS)
    assert pixel(picture, 0, 0) == (156, 156, 156)  # 40000 / 256, not clipped to white


def test_transparency_is_composited_on_white():
    img = Image.new("RGBA", (3, 1))
    img.putdata([(255, 0, 0, 0), (0, 0, 255, 255), (0, 0, 0, 128)])
    picture = decode(encoded(img, "PNG"), LIMITS)
    assert pixel(picture, 0, 0) == WHITE
    assert pixel(picture, 1, 0) == BLUE
    assert near(pixel(picture, 2, 0), (127, 127, 127), 2)


def test_palette_transparency_is_composited_on_white():
    img = pattern().convert("P", palette=Image.Palette.ADAPTIVE)
    picture = decode(encoded(img, "PNG", transparency=img.getpixel((0, 0))), LIMITS)  # red's index: clear
    assert pixel(picture, 0, 0) == WHITE
    assert pixel(picture, 1, 0) == GREEN


def test_exif_orientation_is_applied():
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera was turned: show rotated 90 degrees clockwise
    img = Image.new("RGB", (60, 40), GREEN)
    img.paste(RED, (0, 0, 20, 20))
    picture = decode(encoded(img, "JPEG", exif=exif.tobytes(), quality=95), LIMITS)
    assert (picture.width, picture.height) == (40, 60)
    assert near(pixel(picture, 30, 10), RED)  # the top-left block went to the top right
    assert near(pixel(picture, 10, 10), GREEN)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_large_image_is_scaled_down_keeping_its_aspect(fmt):
    picture = decode(encoded(pattern((160, 80)), fmt), SMALL)  # 12,800 px, within 4 x 4,096
    assert picture.width * picture.height <= SMALL.max_image_pixels
    assert picture.width * picture.height > SMALL.max_image_pixels * 0.9
    assert abs(picture.width / picture.height - 2) < 0.05
    assert len(picture.rgb) == picture.width * picture.height * 3


def test_a_large_jpeg_decodes_at_a_reduced_scale_and_still_fits():
    picture = decode(encoded(pattern((2000, 120)), "JPEG"), SMALL)  # 240,000 px: 1/4 scale, then resized
    assert picture.width * picture.height <= SMALL.max_image_pixels
    assert abs(picture.width / picture.height - 2000 / 120) < 1


def test_an_image_under_4_times_the_cap_is_scaled_not_refused():
    picture = decode(png_declaring(120, 120, num_rows=120), SMALL)  # 14,400 px, under 16,384
    assert (picture.width, picture.height) == (64, 64)
    assert pixel(picture, 10, 10) == (0, 0, 0)


def test_digest_is_of_the_pixels_not_the_file():
    as_png = decode(encoded(pattern(), "PNG"), LIMITS)
    as_bmp = decode(encoded(pattern(), "BMP"), LIMITS)
    other = pattern()
    other.putpixel((5, 3), BLUE)
    assert as_png.digest == as_bmp.digest
    assert as_png.digest != decode(encoded(other, "PNG"), LIMITS).digest
    turned = decode(encoded(pattern().transpose(Image.Transpose.TRANSPOSE), "PNG"), LIMITS)
    assert turned.digest != as_png.digest  # same bytes' worth, another shape


def test_count():
    check_count(LIMITS.max_images, LIMITS)
    with pytest.raises(ImageRefused, match=r"\[limits\] max_images"):
        check_count(LIMITS.max_images + 1, LIMITS)


# What is refused.

def refused(call, *args, match: str):
    with pytest.raises(ImageRefused, match=match):
        call(*args)


def test_empty_is_refused():
    refused(decode, b"", LIMITS, match="empty")
    refused(from_base64, "", LIMITS, match="empty")
    refused(from_base64, " \n", LIMITS, match="empty")
    refused(from_base64, "data:image/png;base64,", LIMITS, match="empty")


@pytest.mark.parametrize("text", ["not base64!", "iVBORw0KGgo", "aGVsbG8=aGVsbG8=", "aGVs bG8-_w==", "aGVsbG8é"])
def test_bad_base64_is_refused(text):
    refused(from_base64, text, LIMITS, match="not valid base64")


@pytest.mark.parametrize("url", ["data:text/plain;base64,aGVsbG8=", "data:image/png,rawbytes",
                                 "data:image/png;charset=utf-8,aGVsbG8=", "data:,aGVsbG8="])
def test_a_data_url_that_is_not_a_base64_image_is_refused(url):
    refused(from_base64, url, LIMITS, match="data:image/...;base64")
    refused(from_url, url, LIMITS, match="data:image/...;base64")


def other_formats() -> list[bytes]:
    return [b"hello, this is a text file\n", b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog >>\nendobj\n",
            b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
            encoded(pattern(), "TIFF"), encoded(pattern((16, 16)), "ICO"), bytes(range(256)) * 8]


@pytest.mark.parametrize("data", other_formats(), ids=["text", "pdf", "svg", "tiff", "ico", "noise"])
def test_what_is_not_a_read_format_is_refused(data):
    refused(decode, data, LIMITS, match=r"not an image homeai reads \(PNG, JPEG, WebP, GIF or BMP\)")
    refused(from_base64, base64.b64encode(data).decode(), LIMITS, match="not an image homeai reads")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_a_truncated_image_is_refused(fmt):
    data = encoded(pattern((64, 64)).effect_spread(8), fmt)  # noise, so the pixel data is most of the file
    refused(decode, data[:len(data) // 2], LIMITS, match="corrupt")


def test_a_corrupt_header_is_refused():
    data = bytearray(encoded(pattern(), "PNG"))
    data[20] ^= 0xFF  # inside IHDR: its CRC no longer matches
    refused(decode, bytes(data), LIMITS, match="corrupt")
    refused(decode, png_declaring(0, 10, num_rows=1), LIMITS, match="corrupt")


def test_over_max_image_bytes_is_refused_before_base64_is_decoded(monkeypatch):
    monkeypatch.setattr(images.base64, "b64decode", lambda *a, **k: pytest.fail("decoded"))
    text = "A" * (LIMITS.max_image_bytes * 4 // 3 + 8)
    refused(from_base64, text, LIMITS, match=r"2,500,00\d bytes: at most 2,500,000 \(\[limits\] max_image_bytes\)")
    refused(from_url, "data:image/png;base64," + text, LIMITS, match=r"\[limits\] max_image_bytes")


def test_over_max_image_bytes_is_refused_as_a_file():
    refused(decode, b"\x89PNG" + bytes(LIMITS.max_image_bytes), LIMITS, match=r"\[limits\] max_image_bytes")


@pytest.mark.parametrize("url", ["http://example.com/cat.png", "https://example.com/cat.png", " HTTPS://x/y.png"])
def test_remote_urls_are_not_fetched(url):
    refused(from_url, url, LIMITS, match="remote image URLs are not fetched: send the image as a data URL")


@pytest.mark.parametrize("url", ["ftp://example.com/cat.png", "file:///etc/passwd", "cat.png", ""])
def test_other_urls_are_refused(url):
    refused(from_url, url, LIMITS, match="must be a data URL")


def test_a_decompression_bomb_is_refused_without_taking_memory():
    bomb = png_declaring(100_000, 100_000, num_rows=4)  # 10 billion pixels declared, in a file of a few KB
    assert len(bomb) < 4096
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tracemalloc.start()
    try:
        refused(decode, bomb, LIMITS, match="decompression bomb")
        refused(from_base64, base64.b64encode(bomb).decode(), LIMITS, match="decompression bomb")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50_000_000
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 50_000  # Pillow's own buffers too


@pytest.mark.parametrize("width, height", [(1000, 1000), (200, 200), (40_000, 2), (2, 40_000)])
def test_past_4_times_the_cap_or_a_side_over_32768_is_a_bomb(width, height):
    # Under Pillow's own guard (about 89 million pixels), so only homeai's check stands in the way.
    refused(decode, png_declaring(width, height, num_rows=1), SMALL, match="decompression bomb")


def test_a_member_has_two_requests_images_read_at_a_time_and_others_are_not_held_back():
    from homeai.service.core import MAX_READING_IMAGES, Service
    from homeai.service.errors import ServiceError

    service = object.__new__(Service)
    service._reading_images = {}
    pictures = ("one",)
    with service._images_turn("guest", pictures), service._images_turn("guest", pictures):
        assert MAX_READING_IMAGES == 2
        with pytest.raises(ServiceError) as busy:
            with service._images_turn("guest", pictures):
                pass
        assert busy.value.status == 429 and busy.value.code == "images_busy" and busy.value.headers["Retry-After"]
        with service._images_turn("alice", pictures), service._images_turn("guest", ()):  # text needs no turn
            pass
    assert service._reading_images == {}
    with service._images_turn("guest", pictures):
        pass
