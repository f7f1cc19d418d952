"""A bounded load test: a few hundred concurrent requests across lanes against a real `homeai serve`.

Every request is answered (200) or refused for a full queue (429), never anything else; no
lane's queue ever holds more than its `max_queue`; the server survives, and its memory comes
back near where it started. Only to 127.0.0.1; it ends by itself (a fixed number of requests,
and a time limit on the whole).

Run: .venv/bin/python -m pytest tests/ops/test_load.py
"""

from __future__ import annotations

import asyncio
import collections

import httpx
import pytest

from tests.ops.conftest import chat, homeai_serve

pytestmark = pytest.mark.model

MAX_QUEUE = {"chat": 8, "summaries": 8, "embeddings": 16}
NUM_REQUESTS = {"chat": 120, "summaries": 80, "embeddings": 100}
TIME_LIMIT_S = 240.0  # the whole run; the box is shared, so generous: no assertion on time
RSS_SLACK_KIB = 96 * 1024  # allocator arenas and caches may keep some of what the load took


def request_for(lane: str, i: int) -> tuple[str, dict]:
    if lane == "embeddings":
        return "/v1/embeddings", {"input": f"note {i}: the spare key is under the blue pot"}
    return "/v1/chat/completions", chat(f"Question {i}: what is {i} plus {i}?", lane=lane, max_tokens=2)


async def one(client: httpx.AsyncClient, lane: str, i: int) -> tuple[str, int, str]:
    path, body = request_for(lane, i)
    r = await client.post(path, json=body)
    code = r.json().get("error", {}).get("code", "") if r.status_code != 200 else ""
    return lane, r.status_code, code


async def watch_queues(client: httpx.AsyncClient, stop: asyncio.Event, seen: dict) -> None:
    while not stop.is_set():
        lanes = (await client.get("/api/lanes")).json()["lanes"]
        for lane in MAX_QUEUE:
            seen[lane] = max(seen[lane], lanes[lane]["queued"])
        await asyncio.sleep(0.05)


async def load(url: str) -> tuple[collections.Counter, dict]:
    limits = httpx.Limits(max_connections=sum(NUM_REQUESTS.values()) + 8, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=url, timeout=TIME_LIMIT_S, limits=limits) as client:
        stop, seen = asyncio.Event(), {lane: 0 for lane in MAX_QUEUE}
        watcher = asyncio.create_task(watch_queues(client, stop, seen))
        jobs = [one(client, lane, i) for lane, n in NUM_REQUESTS.items() for i in range(n)]
        try:
            results = await asyncio.wait_for(asyncio.gather(*jobs), TIME_LIMIT_S)
        finally:
            stop.set()
            await watcher
    return collections.Counter(results), seen


def warm_up(url: str) -> None:
    with httpx.Client(base_url=url, timeout=TIME_LIMIT_S) as http:
        for lane in NUM_REQUESTS:
            for i in range(3):
                path, body = request_for(lane, i)
                assert http.post(path, json=body).status_code == 200


def test_a_few_hundred_concurrent_requests_are_answered_or_refused_and_memory_comes_back(tmp_path):
    lanes = {lane: {"max_queue": n} for lane, n in MAX_QUEUE.items()}
    with homeai_serve(tmp_path, lanes=lanes,
                      server={"max_connections_per_address": 512}) as served:  # every request from one address
        warm_up(served.url)
        rss_before = served.rss_kib()
        outcomes, max_queued = asyncio.run(load(served.url))
        for (lane, status, code), n in outcomes.items():
            assert (status, code) in ((200, ""), (429, "queue_full")), (lane, status, code, n)
        for lane in NUM_REQUESTS:
            assert outcomes[(lane, 200, "")] > 0, f"{lane}: nothing answered: {outcomes}"
            assert max_queued[lane] <= MAX_QUEUE[lane], (lane, max_queued)
        assert sum(n for (_, status, _), n in outcomes.items() if status == 429) > 0  # the overflow was refused
        assert sum(outcomes.values()) == sum(NUM_REQUESTS.values())

        with httpx.Client(base_url=served.url, timeout=60) as http:
            assert http.get("/healthz").json()["status"] == "ok"
            snapshot = http.get("/api/lanes").json()
            assert all(snapshot["lanes"][lane]["queued"] == 0 and snapshot["lanes"][lane]["running"] == 0
                       for lane in MAX_QUEUE)
            assert snapshot["kv"]["cells_used"] == 0 and snapshot["kv"]["seqs_used"] == 0
            assert snapshot["lanes"]["chat"]["rejected"] > 0 or snapshot["lanes"]["summaries"]["rejected"] > 0
            assert snapshot["lanes"]["chat"]["typical_output_tokens"] < 10  # learnt from answers of 2 tokens
            chat = snapshot["lanes"]["chat"]  # held to its target, or more on a box too slow for it
            assert chat["reading_pace_ms"] >= chat["policy"]["itl_target_ms"] > 0
            assert snapshot["lanes"]["summaries"]["reading_pace_ms"] is None
        warm_up(served.url)  # the same small work as before the load
        rss_after = served.rss_kib()
        assert rss_after <= rss_before + RSS_SLACK_KIB, (rss_before, rss_after)
        assert served.terminate() == 0
