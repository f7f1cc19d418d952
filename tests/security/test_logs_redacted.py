"""No member token reaches the log: a real `homeai serve` with its log in a file, the voice
socket signed in with `?token=` (the login that put tokens in the access log), rejected HTTP
attempts with tokens in their query and path, and the file read back. The redaction filter on
its own too: messages, arguments and tracebacks, through a real handler into a file.

Run: .venv/bin/python -m pytest tests/security/test_logs_redacted.py
"""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from homeai.logs import RedactSecrets, redact
from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import add_member
from tests.api.conftest import TIMEOUT
from tests.ops.conftest import homeai_serve

pytestmark = pytest.mark.model

WRONG = "hai_" + "W" * 43  # shaped like a token, but no member's


def new_token(db, name: str) -> str:
    engine = make_engine(f"sqlite:///{db}")
    try:
        with make_sessionmaker(engine)() as session:
            return add_member(session, name=name)[1]
    finally:
        engine.dispose()


def secrets_in(text: str, *tokens: str) -> list[str]:
    """The tokens (or their random part, however it was cut) found in `text`."""
    return [t for t in tokens if t in text or t[4:20] in text]


@pytest.fixture(scope="module")
def served_log(tmp_path_factory):
    """The log of a served homeai after the probes below, and the tokens they used."""
    with homeai_serve(tmp_path_factory.mktemp("logs"), auth={"required": True}) as served:
        token = new_token(served.db, "alice")
        ws_url = served.url.replace("http://", "ws://") + "/v1/voice"
        with connect(f"{ws_url}?token={token}", open_timeout=TIMEOUT) as ws:  # accepted, signed in
            ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
            assert json.loads(ws.recv(TIMEOUT))["type"] in ("session.ready", "error")  # error: speech not loaded
        with connect(f"{ws_url}?token={WRONG}", open_timeout=TIMEOUT) as ws:  # accepted, then closed 4401
            with pytest.raises(ConnectionClosed):
                ws.recv(TIMEOUT)
        with httpx.Client(base_url=served.url, timeout=TIMEOUT) as http:
            assert http.get(f"/v1/models?token={token}").status_code == 401  # HTTP takes only the header
            assert http.get(f"/v1/models?access_token={WRONG}&api_key={token}").status_code == 401
            assert http.get(f"/api/conversations/{token}").is_client_error
            assert http.get("/v1/models", headers={"Authorization": f"Bearer {WRONG}"}).status_code == 401
            body = token[4:]  # the token's secret part, written as a careless or hostile client may
            assert http.get(f"/api/conversations/HAI_{body}").is_client_error  # upper case
            assert http.get(f"/v1/models?q=hai%5F{body}").status_code == 401  # percent-encoded
            assert http.get(f"/v1/models?q=hai%255F{body}").status_code == 401  # encoded twice
            assert http.get(f"/v1/models?q=%68%61%69%5F{body[:8]}%2D{body[8:]}").status_code == 401  # all of it
        assert served.terminate() == 0
        yield served.output(), (token, WRONG)


def test_tokens_in_query_strings_and_paths_are_redacted(served_log):
    log, tokens = served_log
    assert not secrets_in(log, *tokens), log
    # the lines are there, with the secret part cut
    assert '"WebSocket /v1/voice?token=[redacted]" [accepted]' in log, log
    assert '"GET /v1/models?token=[redacted] HTTP/1.1" 401' in log, log
    assert "/v1/models?access_token=[redacted]&api_key=[redacted]" in log, log
    assert "/api/conversations/hai_[redacted]" in log, log
    assert log.count("/v1/models?q=hai_[redacted]") >= 3, log  # the encoded ones, written decoded


@pytest.mark.parametrize("line, kept", [
    ("GET /api/conversations/HAI_{body} 404", "GET /api/conversations/hai_[redacted] 404"),
    ("GET /v1/models?q=hai%5F{body} HTTP/1.1", "GET /v1/models?q=hai_[redacted] HTTP/1.1"),
    ("GET /v1/models?q=hai%5f{body}", "GET /v1/models?q=hai_[redacted]"),  # lower-case escapes too
    ("GET /v1/models?q=Hai%255F{body}", "GET /v1/models?q=hai_[redacted]"),  # encoded twice
    ("/x?q=hai_{body}%2Dtail%20end", "/x?q=hai_[redacted] end"),  # the token's tail encoded
    ("/x?TOKEN%3D{body}&y=1", "/x?TOKEN=[redacted]&y=1"),  # the name encoded
    ("Authorization:%20Bearer%20{body}", "Authorization: [redacted]"),
    ("/files/a%20b.txt 200", "/files/a%20b.txt 200"),  # no secret: the line keeps its escapes
    ("a chai_latte and hai_", "a chai_latte and hai_"),  # not a token: nothing follows, or a word before
])
def test_redaction_ignores_case_and_percent_encoding(line, kept):
    body = "s3cret-Tok_en" * 3
    assert redact(line.format(body=body)) == kept


def test_messages_arguments_and_tracebacks_are_redacted(tmp_path):
    path = tmp_path / "homeai.log"
    handler = logging.FileHandler(path)
    handler.addFilter(RedactSecrets())
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("homeai.test_logs_redacted")
    logger.addHandler(handler)
    logger.propagate = False
    token = "hai_" + "s3cret-Tok_en" * 3
    try:
        logger.warning("a request with %s, status %d", f"Authorization: Bearer {token}", 401)
        logger.warning("headers: %r", {"authorization": f"Bearer {token}"})
        logger.warning(f"inline {token}")
        try:
            raise ValueError(f"no member has {token}")
        except ValueError:
            logger.exception("failed for %s", f"/v1/voice?token={token}")
    finally:
        logger.removeHandler(handler)
        handler.close()
    text = path.read_text()
    assert not secrets_in(text, token), text
    assert "status 401" in text and "ValueError: no member has hai_[redacted]" in text
    assert text.count("[redacted]") >= 5, text
