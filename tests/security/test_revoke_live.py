"""`homeai members revoke NAME`, run as its own process while NAME is connected, ends what NAME
has open: voice sockets close with 4401, a streamed answer stops where it was, and an answer
being waited for gets 401 `token_revoked`; their sequences are freed. Other members carry on.
A real server, real sockets, the real CLI writing the shared database.

Run: .venv/bin/python -m pytest tests/security/test_revoke_live.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from homeai.api.lanes import lanes_view
from tests.api.conftest import TIMEOUT, add_token, api_config, wait_for
from tests.ops.conftest import ROOT, sse_events, to_toml
from tests.security.conftest import event, voice_socket

pytestmark = pytest.mark.model

START = {"type": "session.start", "sample_rate": 16000}
REVOKED_WAIT_S = 60.0  # generous (the daemon looks every 2 s); a bound on waiting, not a timing check
# An answer still running when its token is revoked: counting on, greedily and without a chat
# template, a small model does not stop by itself before max_tokens (minutes on a CPU).
COUNTING = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 4000, "temperature": 0.0}


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True})


@pytest.fixture(scope="module")
def config_file(cfg, module_tmp):
    """The same database, for the CLI."""
    path = module_tmp / "homeai.toml"
    path.write_text(to_toml({"database": {"url": cfg.database_url}, "auth": {"required": True}}))
    return path


def revoke(config_file, name: str) -> None:
    done = subprocess.run([sys.executable, "-m", "homeai.cli", "members", "revoke", name, "--config", str(config_file)],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    assert done.returncode == 0 and "revoked 1 token" in done.stdout, done


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def chat_idle(server) -> bool:
    lane = lanes_view(server.program.engine.state())["lanes"]["chat"]
    return lane["running"] == 0 and lane["queued"] == 0


def test_revoking_closes_the_members_voice_sockets(server, cfg, config_file):
    carol, dave = add_token(cfg, "carol"), add_token(cfg, "dave")
    with voice_socket(server) as ws, voice_socket(server, dave) as other:
        ws.send(json.dumps({**START, "token": carol}))  # the web UI's login: the token in session.start
        other.send(json.dumps(START))
        assert event(ws)["type"] == "session.ready" and event(other)["type"] == "session.ready"
        revoke(config_file, "carol")
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                event(ws, REVOKED_WAIT_S)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        other.send(json.dumps(START))  # dave's socket is untouched
        assert event(other)["type"] == "session.ready"


def test_revoking_ends_the_members_streamed_answer(server, cfg, config_file):
    erin = add_token(cfg, "erin")
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=bearer(erin)) as client:
        with client.stream("POST", "/v1/completions", json={**COUNTING, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            started = [next(line for line in lines if line.startswith("data:"))]
            revoke(config_file, "erin")
            events = sse_events(started + list(lines))  # until the server ends the response
        assert client.get("/v1/models").status_code == 401
    assert "[DONE]" not in events  # cut short, not finished
    assert wait_for(lambda: chat_idle(server))  # its sequence was aborted


def test_revoking_ends_an_answer_being_waited_for_with_401(server, cfg, config_file):
    frank = add_token(cfg, "frank")
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, server.url + "/v1/completions", json=COUNTING,
                             headers=bearer(frank), timeout=TIMEOUT)
        assert wait_for(lambda: not chat_idle(server))  # under way
        revoke(config_file, "frank")
        r = answer.result()
    assert r.status_code == 401 and r.json()["error"]["code"] == "token_revoked", r.text
    assert wait_for(lambda: chat_idle(server))
