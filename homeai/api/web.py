"""The household web UI: the files of `web/` served as they are, at `/` (no build step).

One route per file found at import (`/` is `index.html`), rather than a catch-all mount, so
the UI can never shadow an API route whatever order routers are included in. Every answer
carries a strict Content-Security-Policy: only the page's own scripts run, so even a
rendering bug could not make model output execute.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse


def _web_dir() -> Path:
    """`web/` beside the package in a checkout, else where a wheel installs it (share/homeai/web)."""
    checkout = Path(__file__).resolve().parents[2] / "web"
    return checkout if checkout.is_dir() else Path(sys.prefix) / "share" / "homeai" / "web"


WEB_DIR = _web_dir()
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
               ".ico": "image/x-icon", ".webmanifest": "application/manifest+json"}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self' ws: wss:; media-src 'self' blob:; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}  # revalidate: an upgraded daemon serves its new UI at once

router = APIRouter(tags=["web"], include_in_schema=False)


def _route(path: Path):
    media_type = MEDIA_TYPES.get(path.suffix, "application/octet-stream")

    def serve() -> FileResponse:
        return FileResponse(path, media_type=media_type, headers=HEADERS)
    return serve


def _add_routes(web_dir: Path) -> None:
    if not web_dir.is_dir():
        return
    for path in sorted(p for p in web_dir.rglob("*") if p.is_file() and p.suffix in MEDIA_TYPES):
        url = "/" + path.relative_to(web_dir).as_posix()
        router.add_api_route(url, _route(path), methods=["GET"], name=f"web:{url}")
        if path.name == "index.html" and path.parent == web_dir:
            router.add_api_route("/", _route(path), methods=["GET"], name="web:/")


_add_routes(WEB_DIR)
