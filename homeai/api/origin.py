"""Which names and which pages may talk to this server: the Host and Origin checks, HTTP and WebSocket.

Two attacks by a web page a household member happens to visit, worst with `auth.required =
false`, where every caller is the household admin:

* DNS rebinding: a page of evil.example makes its own name resolve to 127.0.0.1; the browser
  then treats this server as that page's origin and lets it read the answers. Its requests
  still say `Host: evil.example`, so only the names this server is known by are answered: IP
  addresses (a name is what rebinding needs; a page reaches an address literal only as another
  origin), `localhost`, the bind address, this machine's host name (and `<name>.local`), and
  `server.allowed_hosts`. Any other Host gets 421 `host_not_allowed`.
* Cross-site writes: a page may POST to 127.0.0.1 without asking first (a "simple" request).
  A state-changing request (any method but GET, HEAD, OPTIONS) whose `Origin` is neither this
  server's own (host and port those of the `Host` header) nor listed in
  `server.cors_origins` gets 403 `cross_origin`, auth on or off. A WebSocket has no CORS at all,
  so a handshake from such an origin is refused with 403 whatever it would do.

Requests without an `Origin` (curl, SDKs, the openai package) are not a browser page's and pass.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from homeai.api.errors import ApiError, error_response
from homeai.config import ServerConfig

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class SameSiteMiddleware:
    def __init__(self, app: ASGIApp, server: ServerConfig):
        self.app = app
        self.names = served_names(server)
        self.cors_origins = frozenset(server.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            refusal = self.refusal(scope)
            if refusal is not None:
                # a socket is refused before its accept: the answer to its handshake
                return await error_response(refusal)(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ApiError | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and not self.host_allowed(host):
            return ApiError(421, f"this server does not answer to the name {hostname(host)!r} "
                                 "(add it to server.allowed_hosts if it is this server's)", code="host_not_allowed")
        origin = headers.get("origin")
        writes = scope["type"] == "websocket" or scope["method"] not in SAFE_METHODS
        if writes and origin is not None and not self.origin_allowed(origin, host):
            return ApiError(403, f"a page of {origin} may not call this server (only its own pages and "
                                 "server.cors_origins may)", code="cross_origin")
        return None

    def host_allowed(self, host: str) -> bool:
        name = hostname(host)
        return name in self.names or _is_ip(name)

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        if origin in self.cors_origins:
            return True
        return host is not None and urlsplit(origin).netloc.lower() == host.lower()


def served_names(server: ServerConfig) -> frozenset[str]:
    """The host names (not addresses) this server answers to."""
    machine = socket.gethostname().lower()
    names = {"localhost", machine, f"{machine}.local", server.host.lower(), *(h.lower() for h in server.allowed_hosts)}
    return frozenset(name.rstrip(".") for name in names)


def hostname(host: str) -> str:
    """A Host header's name without its port and brackets, lower case: "[::1]:8700" -> "::1"."""
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name.rstrip(".").lower()


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
