"""HTTP to one remote OpenAI-compatible server, and what can go wrong with it as `RemoteFailure`.

`post` sends a request and reads the whole answer; `open_stream` sends it and returns the
response once its headers are in (the status is known: an error is still a proper HTTP
error, and a fallback is still possible); `lines` reads a stream's lines. `timeout_s`
bounds every silence: connecting, waiting for the answer, and between chunks.

A failure says whether it is the remote's fault (unreachable 502, too slow 504, a 5xx or a
refused key 502: worth falling back to the local model) or the client's (a remote 4xx, relayed
as it came, with its own status and body).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

MAX_ERROR_BYTES = 64 * 1024  # of a remote's error body, enough for any message
DETAIL_CHARS = 300  # of a remote's own error message, quoted in ours


class RemoteFailure(Exception):
    def __init__(self, status: int, code: str, message: str, *, remote_fault: bool = True,
                 body: bytes | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.remote_fault = remote_fault  # the remote failed (fall back); else the client's request did
        self.body = body  # a client error's body, relayed as the remote sent it
        self.headers = headers or {}


class RemoteClient:
    def __init__(self, url: str, *, api_key: str = "", timeout_s: float = 120.0, name: str = "remote"):
        self.url = url.rstrip("/")
        self.name = name  # how errors name it: "the summaries lane's remote (http://...)"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout_s),
                                      limits=httpx.Limits(max_keepalive_connections=32), trust_env=False)
        self.timeout_s = timeout_s

    async def post(self, path: str, body: dict, headers: dict[str, str] | None = None) -> httpx.Response:
        try:
            response = await self.http.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise self.failure(exc) from None
        await self._check(response)
        return response

    async def open_stream(self, path: str, body: dict, headers: dict[str, str] | None = None) -> httpx.Response:
        request = self.http.build_request("POST", path, json=body, headers=headers)
        try:
            response = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self.failure(exc) from None
        try:
            await self._check(response)
        except BaseException:
            await response.aclose()
            raise
        return response

    async def lines(self, response: httpx.Response) -> AsyncIterator[str]:
        """A stream's lines; a dropped or silent remote raises RemoteFailure."""
        try:
            async for line in response.aiter_lines():
                yield line
        except httpx.HTTPError as exc:
            raise self.failure(exc) from None

    async def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        body = await _read_some(response)
        detail = _message(body)
        status = response.status_code
        if status in (401, 403):
            raise RemoteFailure(502, "remote_auth_failed", f"{self.name} refused homeai's credentials "
                                f"(HTTP {status}: {detail}); check its api_key")
        if status >= 500:
            raise RemoteFailure(502, "remote_error", f"{self.name} failed (HTTP {status}: {detail})")
        keep = {k: v for k, v in response.headers.items() if k.lower() in ("retry-after", "content-type")}
        raise RemoteFailure(status, "remote_refused", detail, remote_fault=status == 429, body=body, headers=keep)

    def failure(self, exc: Exception) -> RemoteFailure:
        if isinstance(exc, httpx.TimeoutException):
            return RemoteFailure(504, "remote_timeout", f"{self.name} did not answer within {self.timeout_s:g} s "
                                 f"({type(exc).__name__})")
        if isinstance(exc, httpx.ConnectError):
            return RemoteFailure(502, "remote_unavailable", f"{self.name} could not be reached: {exc or 'refused'}")
        return RemoteFailure(502, "remote_failed", f"{self.name} dropped the request: {type(exc).__name__} {exc}")

    async def aclose(self) -> None:
        await self.http.aclose()


async def _read_some(response: httpx.Response) -> bytes:
    data = bytearray()
    try:
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) >= MAX_ERROR_BYTES:
                break
    except httpx.HTTPError:
        pass
    return bytes(data[:MAX_ERROR_BYTES])


def _message(body: bytes) -> str:
    """The remote's own error message (OpenAI's shape, FastAPI's, or plain text)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:DETAIL_CHARS] or "no details"
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:DETAIL_CHARS]
        if isinstance(error, str):
            return error[:DETAIL_CHARS]
        if "detail" in doc:
            return str(doc["detail"])[:DETAIL_CHARS]
    return json.dumps(doc)[:DETAIL_CHARS]
