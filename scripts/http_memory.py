"""What a running homeai keeps for request bodies, and how a member fares meanwhile: its RSS before,
while N connections each hold a request body open, and after they close; bob's /healthz and chat
latencies while they are open (issue 55, "Every byte from the network is timed and counted").

    python scripts/http_memory.py --url http://127.0.0.1:8700 --pid PID --bob TOKEN \\
        [--mode trickle|bodies] [--connections 1000] [--token MEMBER_TOKEN] [--hold 20]

* `trickle`: each connection sends a whole head of `POST /v1/chat/completions` announcing a body
  of `--size` bytes, then a byte every `--interval` seconds (a guest's slow body).
* `bodies`: each sends all but the last byte of such a body at once, and waits (the issue's 4 MB
  bodies).
Without `--token` they are a guest's (no token: answered 401 from the head); with it, a member's
(the app reads the body). Connections come from `--from` (a loopback address of their own, so
the per-address cap counts them apart from bob, who comes from 127.0.0.2). Each is held until
`--hold` seconds have passed or the server ends it (a 408, or closed); then all close. RSS is read
from /proc/PID/status; "after" is AFTER_S after the last one closed. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from collections import Counter
from pathlib import Path

import httpx

AFTER_S = 3.0  # "after": this long after the last connection closed (the server trims its heap 1 s after)
BOB = "127.0.0.2"
HI = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def head(host: str, size: int, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {size}\r\n\r\n").encode()


async def hold(args, release: asyncio.Event, opened: list) -> str:
    """One connection; what became of it: "held", "401 then held", "408", "401 then closed", "closed", "refused"."""
    host, port = args.url.removeprefix("http://").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port), local_addr=(args.source, 0))
    except OSError:
        return "refused"
    opened.append(1)
    answered = ""
    try:
        writer.write(head(host, args.size, args.token))
        writer.write(b"{" if args.mode == "trickle" else b"{" + b" " * (args.size - 2))
        await writer.drain()
        while not release.is_set():
            with contextlib.suppress(TimeoutError):
                data = await asyncio.wait_for(reader.read(65536), args.interval)
                if not data:
                    return f"{answered} then closed" if answered else "closed"
                answered = answered or data[9:12].decode(errors="replace")
                if answered == "408":
                    return "408"
            if args.mode == "trickle":
                writer.write(b" ")
                await writer.drain()
        return f"{answered} then held" if answered else "held"
    except (ConnectionError, OSError):
        return f"{answered} then reset" if answered else "reset"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def bob_meanwhile(args, stop: asyncio.Event, rounds: int | None = None) -> dict:
    """bob's /healthz and 4-token chat, one after the other, until `stop` (or `rounds` of them); their
    latencies in ms."""
    health, chat, failed = [], [], 0
    transport = httpx.AsyncHTTPTransport(local_address=BOB)
    headers = {"Authorization": f"Bearer {args.bob}"}
    async with httpx.AsyncClient(base_url=args.url, timeout=60, transport=transport, headers=headers) as http:
        while not stop.is_set() and (rounds is None or len(health) + failed < rounds):
            for path, times in (("/healthz", health), ("/v1/chat/completions", chat)):
                started = time.monotonic()
                try:
                    ok = (await (http.get(path) if path == "/healthz" else http.post(path, json=HI))).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    times.append((time.monotonic() - started) * 1000)
                else:
                    failed += 1
            await asyncio.sleep(0.2)
    return {"healthz_ms": _summary(health), "chat_ms": _summary(chat), "bob_failed": failed}


def _summary(times: list[float]) -> dict:
    if not times:
        return {"n": 0}
    return {"n": len(times), "median": round(statistics.median(times), 1), "max": round(max(times), 1)}


async def main(args) -> dict:
    before = rss_mib(args.pid)
    release, stop, opened = asyncio.Event(), asyncio.Event(), []
    idle = await bob_meanwhile(args, asyncio.Event(), rounds=5)
    tasks = [asyncio.create_task(hold(args, release, opened)) for _ in range(args.connections)]
    bob = asyncio.create_task(bob_meanwhile(args, stop))
    peak, started = before, time.monotonic()
    while time.monotonic() - started < args.hold and not all(t.done() for t in tasks):
        await asyncio.sleep(0.5)
        peak = max(peak, rss_mib(args.pid))
    open_at_end = sum(not t.done() for t in tasks)
    release.set()
    outcomes = Counter(await asyncio.gather(*tasks))
    stop.set()
    meanwhile = await bob
    await asyncio.sleep(AFTER_S)
    return {"mode": args.mode, "guest": args.token is None, "connections": args.connections, "size": args.size,
            "connected": len(opened), "open_at_end": open_at_end, "outcomes": dict(outcomes),
            "rss_before_mib": round(before, 1), "rss_peak_mib": round(peak, 1),
            "rss_after_mib": round(rss_mib(args.pid), 1), "bob_idle": idle, **meanwhile}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--bob", required=True, help="a member's token: bob asks meanwhile")
    parser.add_argument("--token", default=None, help="the connections' token (none: a guest's)")
    parser.add_argument("--mode", choices=("trickle", "bodies"), default="trickle")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--size", type=int, default=3_999_000, help="the body's announced bytes")
    parser.add_argument("--interval", type=float, default=2.0, help="trickle: seconds between bytes")
    parser.add_argument("--hold", type=float, default=20.0, help="seconds the connections are held at most")
    parser.add_argument("--from", dest="source", default="127.0.0.3", help="the connections' loopback address")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
