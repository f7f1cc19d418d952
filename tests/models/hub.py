"""A loopback stand-in for the Hugging Face hub's tree and file routes, selected with `HF_ENDPOINT`.

It answers what `huggingface_hub` asks for a pull: `GET /api/models/<org>/<repo>/tree/<rev>`
(recursive, every file with its size, git blob id and LFS sha256) and `GET|HEAD
/<org>/<repo>/resolve/<rev>/<path>` (the bytes, with `Range` answered as 206), and the hub's own
errors (`X-Error-Code: RepoNotFound`, 401 for a wrong token). Knobs for the failures a pull must
survive: cut a body short, refuse every download, serve other bytes than the tree's digest says,
send slowly; `ranges` records the `Range` headers it was sent.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

TREE = re.compile(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?")
RESOLVE = re.compile(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo -> path -> bytes
    token: str | None = None  # when set, requests without `Bearer <token>` get 401
    cut_after: int | None = None  # send only this many bytes of a body, then drop the connection
    cuts_left: int = 0  # ...for this many more downloads
    max_downloads: int | None = None  # downloads after this many answer 500
    corrupt: bool = False  # serve bytes that do not match the tree's digest
    delay_s: float = 0.0  # pause between 64 KiB pieces of a body
    ranges: list[str | None] = field(default_factory=list)  # the Range header of each download
    url: str = ""

    def add(self, repo: str, path: str, data: bytes) -> None:
        self.repos.setdefault(repo, {})[path] = data

    def tree(self, repo: str) -> list[dict]:
        entries = []
        for path, data in sorted(self.repos[repo].items()):
            oid = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
            entry = {"type": "file", "oid": oid, "size": len(data), "path": path}
            if path.endswith(".gguf"):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries


def _handler(hub: Hub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self._answer(head=True)

        def do_GET(self):
            self._answer(head=False)

        def _answer(self, head: bool):
            path = unquote(urlsplit(self.path).path)
            if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                return self._error(401, "Invalid credentials in Authorization header", "")
            if tree := TREE.fullmatch(path):
                return self._tree(self._repo(tree.group(1)))
            if resolve := RESOLVE.fullmatch(path):
                return self._file(self._repo(resolve.group(1)), resolve.group(3), head)
            self._error(404, "Not Found", "")

        def _repo(self, asked: str) -> str:
            """The repository's own spelling: the hub ignores case in repository names."""
            return next((repo for repo in hub.repos if repo.lower() == asked.lower()), asked)

        def _tree(self, repo: str):
            if repo not in hub.repos:
                return self._error(404, "Repository not found", "RepoNotFound")
            self._send(200, json.dumps(hub.tree(repo)).encode(), {"Content-Type": "application/json"})

        def _file(self, repo: str, name: str, head: bool):
            data = hub.repos.get(repo, {}).get(name)
            if data is None:
                return self._error(404, "Entry not found", "EntryNotFound" if repo in hub.repos else "RepoNotFound")
            if not head:
                hub.ranges.append(self.headers.get("Range"))
                if hub.max_downloads is not None and len(hub.ranges) > hub.max_downloads:
                    return self._error(500, "Internal Error", "")
            if hub.corrupt:
                data = bytes(b ^ 0xFF for b in data[:16]) + data[16:]
            start = 0
            if (asked := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")) is not None:
                start = int(asked.group(1))
            body = data[start:]
            headers = {"Content-Type": "application/octet-stream", "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                       "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes"}
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206 if start else 200, b"" if head else body, headers, length=len(body))

        def _send(self, status: int, body: bytes, headers: dict, length: int | None = None):
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            cut = None
            if hub.cut_after is not None and hub.cuts_left > 0 and len(body) > hub.cut_after:
                hub.cuts_left -= 1
                cut = hub.cut_after
            sent = 0
            for i in range(0, len(body), 65536):
                piece = body[i:i + 65536]
                if cut is not None and sent + len(piece) > cut:
                    self.wfile.write(piece[:cut - sent])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(piece)
                sent += len(piece)
                if hub.delay_s:
                    time.sleep(hub.delay_s)

        def _error(self, status: int, message: str, code: str):
            headers = {"Content-Type": "application/json", "X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, json.dumps({"error": message}).encode(), headers)

    return Handler


def start(hub: Hub) -> tuple[ThreadingHTTPServer, threading.Thread]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="hub-stand-in", daemon=True)
    thread.start()
    return server, thread
