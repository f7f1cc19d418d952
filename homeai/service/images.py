"""Where images from clients enter homeai: checked, decoded and scaled into a `Picture` (issue 53).

Images arrive as Ollama's `images` (plain base64, or a data URL) and as OpenAI `image_url` parts
(data URLs only: nothing is fetched). Any guest on the LAN can send anything, so every way an
image can be wrong ends as `ImageRefused`, which the routes answer with a 400:

* size: a file over `[limits] max_image_bytes` is refused from its base64 length, before decoding;
* format: PNG, JPEG, WebP, GIF (first frame) and BMP only; anything else, or a corrupt file, is refused;
* pixels: a file declaring more than 4 times `[limits] max_image_pixels` (64 times for a JPEG, which
  decodes at a reduced scale), or a side over 32768, is a decompression bomb, refused from its header before a pixel is decoded; a smaller image larger
  than the cap is scaled down to fit it (a JPEG decodes at a reduced scale first).

The picture is upright (EXIF orientation applied), RGB, transparency composited on white.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import struct
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from homeai.config import LimitsConfig

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
# A file may declare this many times the pixel cap before it is a bomb: a JPEG decodes at 1/8 scale per
# side (64 times the cap still decodes within it), the others whole before they are scaled down (4 times:
# at the default cap, 16.8M pixels, 50 MB, at most, for one image being read)
BOMB_FACTOR = {"JPEG": 64}
OTHER_FACTOR = 4
MAX_SIDE = 32768
NOT_AN_IMAGE = "not an image homeai reads (PNG, JPEG, WebP, GIF or BMP)"
MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")  # and RIFF....WEBP


class ImageRefused(ValueError):
    """Why an image is refused, in words a client can act on (the routes answer 400 with it)."""


@dataclass(frozen=True)
class Picture:
    width: int
    height: int
    rgb: bytes  # width * height * 3 bytes, RGB, row-major, what llama.cpp's mtmd_bitmap_init takes
    # sha256 hex over (width, height, rgb), the sides as little-endian uint32s: the content hash the prompt
    # cache keys an image by
    digest: str


def check_count(n: int, limits: LimitsConfig) -> None:
    if n > limits.max_images:
        raise ImageRefused(f"{n} images in one request: at most {limits.max_images} ([limits] max_images)")


def from_url(url: str, limits: LimitsConfig) -> Picture:
    """An OpenAI `image_url`: a data URL; remote URLs are never fetched (the server would be a proxy)."""
    scheme = url.strip().partition(":")[0].lower()
    if scheme == "data":
        return from_base64(url, limits)
    if scheme in ("http", "https"):
        raise ImageRefused("remote image URLs are not fetched: send the image as a data URL (base64)")
    raise ImageRefused("an image URL must be a data URL (data:image/png;base64,...)")


def from_base64(text: str, limits: LimitsConfig) -> Picture:
    """Plain base64 (Ollama's `images`) or a `data:image/...;base64,` URL."""
    text = text.strip()
    if text[:5].lower() == "data:":
        header, comma, text = text.partition(",")
        header = header.lower()
        if not (comma and header.startswith("data:image/") and header.endswith(";base64")):
            raise ImageRefused("a data URL must be data:image/...;base64,<the image in base64>")
    text = "".join(text.split())
    if not text:
        raise ImageRefused("an empty image")
    _check_bytes(len(text) * 3 // 4 - text[-2:].count("="), limits)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRefused("an image that is not valid base64") from None
    return decode(data, limits)


def decode(data: bytes, limits: LimitsConfig) -> Picture:
    """An image file's bytes, checked and decoded into an upright RGB picture within the pixel cap."""
    if not data:
        raise ImageRefused("an empty image")
    _check_bytes(len(data), limits)
    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:  # also what Pillow says of a read format whose header is broken
        raise ImageRefused("a corrupt image" if _is_read_format(data) else NOT_AN_IMAGE) from None
    except Image.DecompressionBombError:
        raise ImageRefused(_bomb(limits)) from None
    except Exception:  # each plugin fails its own way on a bad header
        raise ImageRefused("a corrupt image") from None
    with img:
        width, height = img.size
        factor = BOMB_FACTOR.get(img.format, OTHER_FACTOR)
        if width * height > factor * limits.max_image_pixels or max(width, height) > MAX_SIDE:
            raise ImageRefused(_bomb(limits, factor))
        size = fit(width, height, limits.max_image_pixels)
        try:
            rgb = _upright_rgb(img, size)
        except Exception:  # truncated data, bad EXIF, ...: whatever PIL raises, the client hears this
            raise ImageRefused("a corrupt image") from None
    pixels = rgb.tobytes()
    digest = hashlib.sha256(struct.pack("<II", *rgb.size))
    digest.update(pixels)
    return Picture(rgb.width, rgb.height, pixels, digest.hexdigest())


def fit(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The largest size of about the same aspect within `max_pixels` (the size itself when it fits)."""
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    new_height = max(1, int(height * scale))
    new_width = max(1, min(int(width * scale), max_pixels // new_height))
    return new_width, min(new_height, max_pixels // new_width)


def _upright_rgb(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    if img.format == "JPEG" and size != img.size:
        img.draft("RGB", size)  # decode at 1/2, 1/4 or 1/8 scale, still at least `size`
    img.load()
    info = img.info  # EXIF orientation, read by exif_transpose once the picture is small
    if img.mode.startswith("I"):  # 16-bit grey: keep the high byte rather than clip at 255
        img = img.convert("I").point(lambda v: v / 256).convert("L")
    mode = "RGBA" if "A" in img.getbands() or "transparency" in img.info else "RGB"
    if img.mode != mode:
        img = img.convert(mode)
    if img.size != size:
        img = img.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    if mode == "RGBA":
        img = Image.alpha_composite(Image.new("RGBA", img.size, "white"), img).convert("RGB")
    img.info = info
    return ImageOps.exif_transpose(img)


def _is_read_format(data: bytes) -> bool:
    return data.startswith(MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


def _check_bytes(num_bytes: int, limits: LimitsConfig) -> None:
    if num_bytes > limits.max_image_bytes:
        raise ImageRefused(f"an image of {num_bytes:,} bytes: at most {limits.max_image_bytes:,} "
                           "([limits] max_image_bytes)")


def _bomb(limits: LimitsConfig, factor: int = OTHER_FACTOR) -> str:
    return (f"an image declaring more than {factor} x {limits.max_image_pixels:,} pixels "
            f"([limits] max_image_pixels) or a side over {MAX_SIDE}: refused as a decompression bomb")
