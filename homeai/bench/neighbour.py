"""`homeai bench neighbour`: the household's lanes beside a noisy neighbour, before, during and after.

A chat (16 tokens) every `chat_every_s` and a steady stream of embeddings run on the real
engine for three phases of `phase_s` each: quiet, beside `num_busy` busy processes at nice 10
(started in their own session, as another service's would be, and always killed), and quiet
again. Reported per phase: chat TTFT and 16-token latency, embedding throughput, the cost
model's contention factor, the cores homeai's process used (its CPU seconds over the phase's:
beside two busy processes in sessions of their own, the kernel's fair share gives it about a
third of a two-core box, however many threads it runs) and llama.cpp's threads at the phase's end;
and after the load stops, the time until every lane has answered
again. Output: `<out>/neighbour.json` and `<out>/neighbour.md`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from homeai.bench.report import percentile
from homeai.sched.request import Kind, SamplingParams

PHASES = ("quiet", "busy", "after")
CHAT = [{"role": "user", "content": "Say something about the weather today."}]
PASSAGE = "The heating comes on at six and the boiler was serviced in March. " * 6


def busy_loops(n: int, seconds: float) -> list[subprocess.Popen]:
    """CPU-bound processes at nice 10, each in its own session, bounded by `timeout` in case we die."""
    cmd = ["timeout", str(int(seconds) + 5), "nice", "-n", "10", "sh", "-c", "while :; do :; done"]
    return [subprocess.Popen(cmd, start_new_session=True) for _ in range(n)]


def stop(loops: list[subprocess.Popen]) -> None:
    for p in loops:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


class _Traffic:
    """Chats and embeddings submitted from threads; each answer recorded with its phase."""

    def __init__(self, engine, chat_every_s: float):
        self.engine, self.chat_every_s = engine, chat_every_s
        self.prompt = engine.runner.apply_chat_template(CHAT)
        self.phase = "quiet"
        self.chats: list[tuple[str, float, float, float]] = []  # phase, start, ttft s, 16-token latency s
        self.embeds: list[tuple[str, float, int]] = []  # phase, finished at, tokens
        self.done = threading.Event()

    def chat_loop(self) -> None:
        while not self.done.is_set():
            phase, t0, first = self.phase, time.monotonic(), None
            stream = self.engine.submit(self.prompt, lane="chat",
                                        params=SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
            for _ in stream:
                first = first or time.monotonic() - t0
            self.chats.append((phase, t0, first or 0.0, time.monotonic() - t0))
            self.done.wait(max(self.chat_every_s - (time.monotonic() - t0), 0.0))

    def embed_loop(self) -> None:
        while not self.done.is_set():
            streams = [self.engine.submit(PASSAGE, lane="embeddings", kind=Kind.EMBED) for _ in range(4)]
            for s in streams:
                for _ in s:
                    pass
                self.embeds.append((self.phase, time.monotonic(), s.finished.stats.prompt_tokens))


def run(engine, phase_s: float = 20.0, num_busy: int = 2, chat_every_s: float = 1.0) -> dict:
    traffic = _Traffic(engine, chat_every_s)
    threads = [threading.Thread(target=traffic.chat_loop, daemon=True),
               threading.Thread(target=traffic.embed_loop, daemon=True)]
    contention, starts, cores, threads_at_end = {}, {}, {}, {}
    for t in threads:
        t.start()
    loops: list[subprocess.Popen] = []
    try:
        for phase in PHASES:
            traffic.phase, starts[phase] = phase, time.monotonic()
            if phase == "busy":
                loops = busy_loops(num_busy, phase_s)
            elif loops:
                stop(loops)
                loops = []
            cpu0 = time.process_time()
            time.sleep(phase_s)
            contention[phase] = round(engine.scheduler.cost.contention, 2)
            cores[phase] = round((time.process_time() - cpu0) / phase_s, 2)
            threads_at_end[phase] = getattr(engine.runner, "num_threads", None)
    finally:
        stop(loops)
        traffic.done.set()
        for t in threads:
            t.join(60)
    return _report(traffic, starts, phase_s, num_busy, contention, cores, threads_at_end)


def _report(traffic: _Traffic, starts: dict, phase_s: float, num_busy: int, contention: dict,
            cores: dict | None = None, threads_at_end: dict | None = None) -> dict:
    cores, threads_at_end = cores or {}, threads_at_end or {}
    phases = {}
    for phase in PHASES:
        chats = [c for c in traffic.chats if c[0] == phase]
        tokens = sum(n for p, _, n in traffic.embeds if p == phase)
        phases[phase] = {
            "chats": len(chats),
            "chat_ttft_ms_p50": _ms(percentile([c[2] for c in chats], 50)),
            "chat_16_tokens_ms_p50": _ms(percentile([c[3] for c in chats], 50)),
            "chat_16_tokens_ms_max": _ms(max((c[3] for c in chats), default=None)),
            "embedding_tok_s": round(tokens / phase_s, 1),
            "contention_at_end": contention.get(phase),
            "homeai_cores": cores.get(phase),
            "threads_at_end": threads_at_end.get(phase)}
    stopped = starts["after"]
    first_chat = min((t0 + latency for _, t0, _, latency in traffic.chats if t0 >= stopped), default=None)
    first_embed = min((t for _, t, _ in traffic.embeds if t >= stopped), default=None)
    lanes_back = None if first_chat is None or first_embed is None else round(max(first_chat, first_embed) - stopped, 2)
    q, b = phases["quiet"], phases["busy"]
    return {"bench": "neighbour", "phase_s": phase_s, "busy_processes": num_busy, "phases": phases,
            "every_lane_serves_after_s": lanes_back,
            "ratios": {"chat_ttft_busy_over_quiet": _ratio(b["chat_ttft_ms_p50"], q["chat_ttft_ms_p50"]),
                       "chat_16_tokens_busy_over_quiet": _ratio(b["chat_16_tokens_ms_p50"], q["chat_16_tokens_ms_p50"]),
                       "embeddings_busy_over_quiet": _ratio(b["embedding_tok_s"], q["embedding_tok_s"])}}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


def markdown(doc: dict, machine: str) -> str:
    lines = [f"# Noisy neighbour ({doc['busy_processes']} busy processes at nice 10, {doc['phase_s']:.0f} s a phase)",
             "", machine, "",
             "| phase | chats | chat TTFT p50 (ms) | 16-token chat p50 (ms) | max (ms) | embeddings tok/s | contention "
             "| homeai's cores | threads |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for phase, m in doc["phases"].items():
        lines.append(f"| {phase} | {m['chats']} | {m['chat_ttft_ms_p50']} | {m['chat_16_tokens_ms_p50']} | "
                     f"{m['chat_16_tokens_ms_max']} | {m['embedding_tok_s']} | {m['contention_at_end']} | "
                     f"{m.get('homeai_cores')} | {m.get('threads_at_end')} |")
    r = doc["ratios"]
    lines += ["", f"busy / quiet: chat TTFT {r['chat_ttft_busy_over_quiet']}, 16-token chat "
              f"{r['chat_16_tokens_busy_over_quiet']} (targets <= 2), embeddings {r['embeddings_busy_over_quiet']} "
              f"(target >= 0.5)", f"every lane answered again {doc['every_lane_serves_after_s']} s after the load "
              f"stopped (target <= 5 s)", ""]
    return "\n".join(lines)


def write(doc: dict, machine: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "neighbour.json").write_text(json.dumps({**doc, "machine": machine}, indent=2))
    (out / "neighbour.md").write_text(markdown(doc, machine))
