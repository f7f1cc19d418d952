"""Real `homeai serve` processes for the operations tests, each with its own small config.

A served process loads its own copy of the model (it never touches the test session's shared
runner), listens on a free loopback port, and is stopped with SIGTERM as systemd stops it.
In-process servers (`tests.api.conftest.serve`) over the shared runner are used where a test
needs to reach inside; they never overlap.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.api.conftest import http  # noqa: F401 (fixture: a client of the module's server)
from tests.conftest import worker_threads

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0  # generous: the box is shared; no test asserts on time
SMALL_MODEL = {"n_ctx": 2048, "n_seq_max": 8, "n_batch": 256, "n_threads": worker_threads(), "embed_n_ctx": 512,
               "embed_n_seq_max": 8}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def to_toml(sections: dict) -> str:
    """Tables of str/int/float/bool/list values, nested one level for [remote.<lane>] and [lanes.<lane>]."""
    lines = []
    for name, table in sections.items():
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if scalars:
            lines.append(f"[{name}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in scalars.items()]
        for sub, values in table.items():
            if isinstance(values, dict):
                lines.append(f"[{name}.{sub}]")
                lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


@dataclass
class Served:
    url: str
    proc: subprocess.Popen
    data_dir: Path
    log: Path

    @property
    def db(self) -> Path:
        return self.data_dir / "homeai.db"

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def terminate(self, timeout: float = 120.0) -> int:
        """SIGTERM, as `systemctl stop` sends it; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def write_config(folder: Path, **sections) -> tuple[Path, int]:
    port = free_port()
    raw = {"server": {"host": "127.0.0.1", "port": port, "data_dir": str(folder / "data")},
           "model": dict(SMALL_MODEL)}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "homeai.toml"
    path.write_text(to_toml(raw))
    return path, port


@contextlib.contextmanager
def homeai_serve(folder: Path, **sections):
    """`homeai serve` with a config in `folder` (sections on top of a small model), once healthy."""
    config, port = write_config(folder, **sections)
    log = folder / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "homeai.cli", "serve", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    served = Served(f"http://127.0.0.1:{port}", proc, folder / "data", log)
    try:
        wait_healthy(served)
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(served: Served) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if served.proc.poll() is not None:
            raise RuntimeError(f"homeai serve exited with {served.proc.returncode}:\n{served.output()}")
        try:
            if httpx.get(served.url + "/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"homeai serve did not become healthy:\n{served.output()}")


def integrity(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def sse_events(lines) -> list:
    """The `data:` payloads of an SSE body: dicts, and "[DONE]" as a string."""
    events = []
    for line in lines:
        if line.startswith("data:"):
            payload = line[5:].strip()
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def chat(content: str = "Tell me a long story about a cat.", **extra) -> dict:
    return {"messages": [{"role": "user", "content": content}], **extra}


# Sampling that keeps a tiny model talking (end-of-text is a very unlikely draw at this temperature).
LONG_ANSWER = {"temperature": 2.0, "top_k": 0, "top_p": 1.0, "seed": 7}
