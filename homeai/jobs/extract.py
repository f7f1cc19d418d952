"""What a file holds: text from plain text, Markdown, HTML (scripts and styles stripped) or PDF; or a photo.

`read_file(path, scope, photos=...)` returns the raw bytes and their hash, or a `Skip` naming why the
file cannot be read (a broken link, a FIFO, a permission, a link out of the indexed folders, a binary
file, a photo when the model reads no images). A photo is an image file, known by its suffix or, for
a binary file, its first bytes (PNG, JPEG, WebP, GIF, BMP); its text is what the model sees in it
(`homeai.jobs.indexer`). `extract_text(path, data)` returns a document's text, or a `Skip` for binary
data, a damaged or encrypted PDF, or a file with no text.
Nothing here raises for a bad file: a bad file is a reason, not a crash.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import stat
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from homeai.jobs.scope import OUTSIDE, Scope
from homeai.service.images import MAGIC as IMAGE_MAGIC

HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PHOTO_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp"}
SNIFF_BYTES = 8192
MAX_FILE_BYTES = 64 * 2**20  # a household document is smaller; a video is not a document
BINARY = "binary file (not text, Markdown, HTML or PDF)"
NOT_REGULAR = "unreadable: not a regular file (a FIFO, socket or device)"
NO_EYES = "a photo: the model reads no images ([model] mmproj)"


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class FileData:
    data: bytes
    content_hash: str  # sha256 of the bytes
    size: int
    mtime: float
    photo: bool = False  # an image file: its text is what the model sees in it


def read_file(path: Path, scope: Scope, *, photos: bool = False) -> FileData | Skip:
    """The file's bytes, or why they are not worth reading: never blocks on a FIFO or a device,
    reads only the first few KB of a binary file, and of a photo unless `photos` (the model reads
    images: a photo library costs little otherwise), and reads nothing the `scope` does not admit,
    even if the path becomes a link while it is read."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return Skip("unreadable: a broken symbolic link" if path.is_symlink() else "unreadable: the file vanished")
    except OSError as e:
        return Skip(f"unreadable: {e.strerror or e}")
    if not scope.admits(os.path.realpath(path)):
        return Skip(OUTSIDE)
    if not stat.S_ISREG(st.st_mode):
        return Skip(NOT_REGULAR)
    if st.st_size > MAX_FILE_BYTES:
        return Skip(f"too large ({st.st_size // 2**20} MiB; the limit is {MAX_FILE_BYTES // 2**20} MiB)")
    try:
        # Non-blocking: the path may have become a FIFO since the stat.
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return Skip(NOT_REGULAR)
            if not _opened_in_scope(f, path, scope):
                return Skip(OUTSIDE)
            head = f.read(SNIFF_BYTES)
            photo = is_photo(path, head)
            if photo and not photos:
                return Skip(NO_EYES)
            if b"\x00" in head and not photo and not head.startswith(b"%PDF-"):
                return Skip(BINARY)
            data = head + f.read()
    except OSError as e:
        return Skip(f"unreadable: {e.strerror or e}")
    return FileData(data, hashlib.sha256(data).hexdigest(), len(data), st.st_mtime, photo)


def is_photo(path: Path, head: bytes) -> bool:
    """An image file, by its suffix or, in a binary file (a text may begin "BM"), its magic bytes."""
    if path.suffix.lower() in PHOTO_SUFFIXES:
        return True
    return b"\x00" in head and (head.startswith(IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"))


def _opened_in_scope(f, path: Path, scope: Scope) -> bool:
    """Whether the open file is the one at the path's real place, and that place is admitted:
    a link swapped in after the first check resolves elsewhere, or to another file."""
    real_path = os.path.realpath(path)
    try:
        return scope.admits(real_path) and os.path.samestat(os.fstat(f.fileno()), os.stat(real_path))
    except OSError:  # the path vanished after the open
        return False


def extract_text(path: Path, data: bytes) -> str | Skip:
    """The document's text, or why there is none to index."""
    suffix = path.suffix.lower()
    if suffix == ".pdf" or data.startswith(b"%PDF-"):
        text = _pdf_text(data)
    else:
        text = _decode(data)
        if not isinstance(text, Skip) and (suffix in HTML_SUFFIXES or _looks_like_html(text)):
            text = html_text(text)
    if isinstance(text, Skip):
        return text
    text = text.replace("\r\n", "\n").replace("\x00", "")
    return text if text.strip() else Skip("no text in the file")


def _decode(data: bytes) -> str | Skip:
    if b"\x00" in data[:SNIFF_BYTES]:
        return Skip(BINARY)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    # Older household files are often Windows-1252; accept them only if they read as text.
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        return Skip("binary file (not UTF-8 or Windows-1252 text)")
    sample = text[:SNIFF_BYTES]
    controls = sum(1 for c in sample if ord(c) < 32 and c not in "\n\r\t\f")
    if controls > len(sample) * 0.02:
        return Skip("binary file (not UTF-8 or Windows-1252 text)")
    return text


def _looks_like_html(text: str) -> bool:
    head = text[:512].lstrip().lower()
    return head.startswith("<!doctype html") or head.startswith("<html")


def _pdf_text(data: bytes) -> str | Skip:
    from pypdf import PdfReader  # only when a PDF shows up

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a damaged PDF is reported as a skip, once
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            return Skip("unreadable PDF: encrypted")
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except Exception as e:  # pypdf raises many types for damaged files
        return Skip(f"unreadable PDF: {type(e).__name__}: {e}"[:300])


class _TextOfHTML(HTMLParser):
    SKIP = {"script", "style", "noscript", "template", "svg"}
    BLOCKS = {"p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header", "footer",
              "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "title", "dd", "dt"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skipping = max(self.skipping - 1, 0)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_text(html: str) -> str:
    """The visible text of an HTML page: blocks on their own lines, scripts and styles gone."""
    parser = _TextOfHTML()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).split("\n"))
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.strip()


def is_hidden(name: str) -> bool:
    return name.startswith(".")


def walk(root: Path):
    """Every file under `root` (or `root` itself), hidden files and folders left out, in a stable order."""
    if not root.is_dir():
        yield root
        return
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not is_hidden(d))
        for name in sorted(files):
            if not is_hidden(name):
                yield Path(folder) / name
