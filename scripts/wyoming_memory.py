"""How much memory a running homeai keeps for Wyoming audio: its RSS before, while N connections
each hold an utterance of S seconds, and after they close (issue 26, "Bounded listeners").

    python scripts/wyoming_memory.py --pid PID --port 10300 [--connections 100] [--seconds 29] [--rate 48000]

Each connection is the `wyoming` package's client: `audio-start`, then S seconds of PCM16 mono
in 1024-sample chunks, held open (no `audio-stop`, so nothing is transcribed) until every
connection has sent its audio; then all close. Connections the server refuses (its caps) are
counted. RSS is read from /proc/PID/status; "after" is AFTER_S after the server has closed the
last of them (it may still be reading what they sent: at most --settle seconds are waited for).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path

from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe

CHUNK_SAMPLES = 1024
AFTER_S = 3.0  # "after": this long after the server has closed the last of them


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def hold(port: int, pcm: bytes, rate: int, sent: asyncio.Event, release: asyncio.Event) -> str:
    """One connection: its audio sent and held until `release`; "held", "refused: CODE" or "failed"."""
    client = AsyncTcpClient("127.0.0.1", port)
    try:
        await client.connect()
        await client.write_event(Describe().event())
        answer = await asyncio.wait_for(client.read_event(), 60)
        if answer is None or Error.is_type(answer.type):
            return f"refused: {Error.from_event(answer).code}" if answer is not None else "refused: closed"
        await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
        step = 2 * CHUNK_SAMPLES
        for i in range(0, len(pcm), step):
            await client.write_event(AudioChunk(rate=rate, width=2, channels=1, audio=pcm[i:i + step]).event())
        sent.set()
        await release.wait()
        return "held"
    except (ConnectionError, asyncio.TimeoutError, OSError):
        return "failed"
    finally:
        with contextlib.suppress(Exception):
            await client.disconnect()


async def measure(pid: int, port: int, connections: int, seconds: float, rate: int, settle_s: float) -> dict:
    pcm = (b"\x10\x00\xf0\xff" * (int(seconds * rate) // 2 + 1))[: 2 * int(seconds * rate)]  # a quiet tone
    before = rss_mib(pid)
    release = asyncio.Event()
    events = [asyncio.Event() for _ in range(connections)]
    tasks = [asyncio.create_task(hold(port, pcm, rate, sent, release)) for sent in events]
    while not all(e.is_set() or t.done() for e, t in zip(events, tasks)):
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # the server reads what is still in flight
    during = rss_mib(pid)
    release.set()
    outcomes = await asyncio.gather(*tasks)
    closed = time.monotonic()
    while server_sockets(port) and time.monotonic() < closed + settle_s:  # the server reads what was sent
        await asyncio.sleep(0.5)
    served_s = time.monotonic() - closed
    await asyncio.sleep(AFTER_S)
    after = rss_mib(pid)
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return {"connections": connections, "seconds": seconds, "rate": rate, "outcomes": counts,
            "server_done_s": round(served_s, 1), "open_left": server_sockets(port),
            "rss_mib": {"before": round(before), "during": round(during), "after": round(after)}}


def server_sockets(port: int) -> int:
    """The server's connections on `port` still open on its side: ESTABLISHED, or CLOSE_WAIT (the
    client has closed, the server not yet) (/proc/net/tcp, tcp6)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state in ("01", "08"):
                    count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the homeai serve process")
    parser.add_argument("--port", type=int, default=10300, help="its Wyoming port")
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=29.0, help="audio each connection holds")
    parser.add_argument("--rate", type=int, default=48000)
    parser.add_argument("--settle", type=float, default=300.0,
                        help="longest wait for the server to close them after they closed")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.pid, args.port, args.connections, args.seconds, args.rate,
                                         args.settle))))


if __name__ == "__main__":
    main()
