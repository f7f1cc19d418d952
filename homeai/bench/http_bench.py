"""`homeai bench http`: the household workload over HTTP, against homeai and any OpenAI-compatible peer.

Run: `homeai bench http --peer URL [--url URL] [--peer-name NAME] [--peer-model NAME] [--quick]`.
Both servers must be running already, over the same GGUF for a fair comparison (`llama-server
-m FILE`, or Ollama with the file imported). Each gets the same seeded household workload in
turn, never both at once (they would share one GPU), in two phases: `idle` (chats and voice
questions alone) and `loaded` (with the summaries of long documents). Every request is one
streamed `/v1/chat/completions` call naming its lane in `X-HomeAI-Lane` (other servers ignore
the header). The indexing lane's embeddings are left out: llama-server serves them only when
started for them.

What the client sees, per server, phase and lane: TTFT (sent to the first chunk with text),
ITL (the gaps between chunks with text) and end to end. Tokens are counted from chunks: a
server holds back a token that ends inside a UTF-8 character (random weights emit many) and
sends it with the next, so one chunk may carry several tokens and the gaps then overstate the
time between tokens; `tokens per chunk` (the usage's completion tokens over text chunks, where
the server reports usage) says by how much. Output: `<out>/http.json` and `<out>/http.md`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from pathlib import Path

import httpx

from homeai.bench.driver import RequestRecord
from homeai.bench.report import group_metrics
from homeai.bench.workloads import Spec, Workload

INTERACTIVE = {"chat", "voice"}
TIMEOUT_S = 600.0  # one answer, from sending to its last chunk
WORDS = ("the house kitchen garden light door window table chair water coffee bread music evening "
         "morning family school work dinner story weather rain sun winter summer heating boiler "
         "shopping list milk eggs friday weekend holiday train car bike dog cat plants book film").split()


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    url: str  # the OpenAI base URL, ending in /v1
    model: str = ""  # sent as `model` when set (Ollama needs one; homeai and llama-server do not)
    api_key: str = ""


def base_url(url: str) -> str:
    """`http://host:port` or `http://host:port/v1` as the OpenAI base URL."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def prompt_text(spec: Spec) -> str:
    """About `prompt_len` tokens of ordinary words (one token each in common vocabularies)."""
    rng = random.Random(f"{spec.request_id}:{spec.seed}")
    words = " ".join(rng.choice(WORDS) for _ in range(spec.prompt_len))
    return f"Summarise this document:\n{words}" if spec.lane == "summaries" else words


def _body(spec: Spec, target: Target) -> dict:
    body = {"messages": [{"role": "user", "content": prompt_text(spec)}], "max_tokens": spec.output_len,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.8,
            "seed": random.Random(spec.request_id).randrange(2**31)}
    return {**body, "model": target.model} if target.model else body


async def _one(client: httpx.AsyncClient, target: Target, spec: Spec, start: float) -> tuple[RequestRecord, int | None]:
    """One request at its arrival time; its record and the completion tokens the server reported."""
    await asyncio.sleep(max(0.0, start + spec.arrival_s - time.perf_counter()))
    record, tokens = RequestRecord(spec, arrival=time.perf_counter(), reason="error"), None
    headers = {"X-HomeAI-Lane": spec.lane}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    try:
        async with client.stream("POST", target.url + "/chat/completions", json=_body(spec, target),
                                 headers=headers) as response:
            if response.status_code != 200:
                record.reason = f"http {response.status_code}"
            else:
                tokens = await _read(response, record)
    except httpx.HTTPError as exc:
        record.reason = f"error: {type(exc).__name__}"
    record.finish = time.perf_counter()
    return record, tokens


async def _read(response: httpx.Response, record: RequestRecord) -> int | None:
    tokens = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        event = json.loads(payload)
        if event.get("error"):
            record.reason = "error"
            break
        if event.get("usage"):
            tokens = event["usage"].get("completion_tokens")
        for choice in event.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                record.token_times.append(time.perf_counter())
            if choice.get("finish_reason"):
                record.reason = choice["finish_reason"]
    return tokens


async def run_phase(target: Target, workload: Workload) -> list[tuple[RequestRecord, int | None]]:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    async with httpx.AsyncClient(timeout=TIMEOUT_S, limits=limits) as client:
        start = time.perf_counter()
        return await asyncio.gather(*[_one(client, target, spec, start) for spec in workload.specs])


def phase_metrics(results: list[tuple[RequestRecord, int | None]], lanes: dict) -> dict:
    records = [r for r, _ in results]
    span = max((r.finish for r in records), default=0.0) - min((r.arrival for r in records), default=0.0)
    out = {}
    for lane in sorted({r.spec.lane for r in records}):
        mine = [(r, n) for r, n in results if r.spec.lane == lane]
        policy = dataclasses.asdict(lanes[lane]) if lane in lanes else None
        metrics = group_metrics([r for r, _ in mine], span, policy)
        counted = [(n, len(r.token_times)) for r, n in mine if r.ok and n is not None and r.token_times]
        metrics["tokens_per_chunk"] = (round(sum(n for n, _ in counted) / sum(c for _, c in counted), 2)
                                       if counted else None)
        metrics["failures"] = sorted({r.reason for r, _ in mine if not r.ok})
        out[lane] = metrics
    return {"makespan_s": round(span, 2), "lanes": out}


def phases(workload: Workload) -> dict[str, Workload]:
    generating = Workload(workload.name, [s for s in workload.specs if s.kind == "generate"], workload.params)
    return {"idle": generating.only_lanes(INTERACTIVE), "loaded": generating}


def run(targets: list[Target], workload: Workload, lanes: dict, progress=print) -> dict:
    """Every phase against every target in turn; the report."""
    results: dict[str, dict] = {}
    for target in targets:
        results[target.name] = {}
        for phase, part in phases(workload).items():
            metrics = phase_metrics(asyncio.run(run_phase(target, part)), lanes)
            results[target.name][phase] = metrics
            chat = metrics["lanes"].get("chat", {})
            progress(f"{target.name} {phase}: chat TTFT p95 {chat.get('ttft_ms', {}).get('p95')} ms, "
                     f"ITL p95 {chat.get('itl_ms', {}).get('p95')} ms", flush=True)
    return {"bench": "http", "targets": {t.name: t.url for t in targets}, "workload": workload.to_dict(),
            "params": workload.params, "results": results, "findings": findings(results)}


def findings(results: dict) -> list[str]:
    lines = []
    for name, by_phase in results.items():
        idle = _chat(by_phase, "idle", "ttft_ms")
        loaded = _chat(by_phase, "loaded", "ttft_ms")
        ratio = round(loaded / idle, 2) if idle and loaded else None
        lines.append(f"{name}: chat TTFT p95 idle {idle} ms, loaded {loaded} ms ({ratio}x; homeai's target <= 1.5x); "
                     f"chat ITL p95 loaded {_chat(by_phase, 'loaded', 'itl_ms')} ms (target <= 100 ms), "
                     f"{_chat_value(by_phase, 'loaded', 'tokens_per_chunk')} tokens a chunk")
    return lines


def _chat(by_phase: dict, phase: str, key: str):
    return ((by_phase[phase]["lanes"].get("chat") or {}).get(key) or {}).get("p95")


def _chat_value(by_phase: dict, phase: str, key: str):
    return (by_phase[phase]["lanes"].get("chat") or {}).get(key)


def markdown(doc: dict, command: str) -> str:
    lines = ["# homeai bench http: the household workload over HTTP", "", f"Command: `{command}`", "",
             "Targets: " + ", ".join(f"{n} ({u})" for n, u in doc["targets"].items()), "",
             "Workload: " + ", ".join(f"{k}: {v}" for k, v in doc["params"].items()), "",
             "Measured by the client; ITL is the gap between chunks with text (see tokens a chunk); "
             "the indexing lane's embeddings are left out.", "",
             "| server | phase | lane | n | ok | TTFT ms p50 / p95 / p99 | ITL ms p50 / p95 / p99 | end to end ms p50 / p95 | tokens a chunk |",
             "|---|---|---|---:|---:|---|---|---|---:|"]
    fmt = lambda d, keys=("p50", "p95", "p99"): " / ".join("-" if d[k] is None else f"{d[k]:.0f}" for k in keys)
    for name, by_phase in doc["results"].items():
        for phase, m in by_phase.items():
            for lane, g in m["lanes"].items():
                lines.append(f"| {name} | {phase} | {lane} | {g['requests']} | {g['succeeded']} | {fmt(g['ttft_ms'])} | "
                             f"{fmt(g['itl_ms'])} | {fmt(g['e2e_ms'], ('p50', 'p95'))} | {g['tokens_per_chunk'] or '-'} |")
    lines += ["", "## Findings", ""] + [f"* {line}" for line in doc["findings"]]
    return "\n".join(lines) + "\n"


def write(doc: dict, command: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "http.json").write_text(json.dumps({**doc, "command": command}, indent=2))
    (out / "http.md").write_text(markdown(doc, command))
