"""`homeai bench images`: what an image question costs, itself and the household beside it.

Two phases on one engine over the configured model and projector (`[model] mmproj`; without one, a
random-weight projector in a real tower's shape, `--tower`, written for the model: its answers are
noise, its encode costs what that tower's does):
- idle: a chat member asks short questions on a fixed schedule, alone; each answer's time to first
  token (TTFT) is taken from its submit;
- beside images: the same questions on the same schedule, while a camera member (Home Assistant's AI
  Task, say) asks about a new snapshot as soon as its last answer ends (each picture new: encoded).
The report gives the image questions' TTFT (the picture read and checked, encoded, its tokens read,
the first token), the encode's own time, and `chat_ttft_p95_ratio`: the chat's p95 TTFT beside
images over idle (the issue's target: at most 1.5).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from homeai.engine.prompt import image_mark
from homeai.engine.stream import FinishEvent, TokenEvent
from homeai.sched.request import SamplingParams

_SEEDS = itertools.count(1)  # every snapshot of a process new, whichever phase takes it
QUESTIONS = ["What is the capital of France?", "Name a red fruit.", "How many legs does a spider have?",
             "What colour is the sky on a clear day?", "Say hello in Spanish.", "What is two plus three?",
             "Name a planet.", "What do bees make?"]


@dataclass(frozen=True)
class Shape:
    phase_s: float = 40.0  # seconds of each phase
    ask_every_s: float = 2.5  # the chat member's schedule
    answer_tokens: int = 16
    camera_tokens: int = 24  # each image question's answer cap
    size: tuple[int, int] = (640, 480)  # a snapshot's pixels (the projector resizes it)


QUICK = Shape(phase_s=6.0, ask_every_s=1.5, answer_tokens=4, camera_tokens=4, size=(96, 64))


def snapshot(seed: int, size: tuple[int, int]) -> bytes:
    """A camera snapshot's JPEG (noise: every one new, so each is encoded)."""
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=85)
    return out.getvalue()


def _ttft(engine, prompt, member: str, max_tokens: int) -> float | None:
    began = time.perf_counter()
    first = None
    for event in engine.submit(prompt, lane="chat", member=member,
                               params=SamplingParams(temperature=0, max_tokens=max_tokens)):
        if isinstance(event, TokenEvent) and first is None:
            first = time.perf_counter() - began
        if isinstance(event, FinishEvent):
            break
    return first


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0, 1)


def chat_phase(engine, runner, shape: Shape, with_images: bool, limits) -> dict:
    """One phase: the chat member's TTFTs, and (with images) the camera's."""
    from homeai.service.images import decode

    stop = threading.Event()
    camera: list[float] = []
    encode_ms: list[float] = []

    def camera_loop() -> None:
        while not stop.is_set():
            n = next(_SEEDS)
            began = time.perf_counter()
            picture = decode(snapshot(n, shape.size), limits)  # as the service reads one
            marks = image_mark(0) + "\n"
            prompt = runner.apply_chat_template([{"role": "user", "content": marks + "Is someone at the door?"}])
            prompt = dataclasses.replace(prompt, images=(picture,), holder=f"bench-{n}-{time.monotonic_ns()}")
            encodes = runner.vision.encodes
            first = None
            for event in engine.submit(prompt, lane="chat", member="camera",
                                       params=SamplingParams(temperature=0, max_tokens=shape.camera_tokens)):
                if isinstance(event, TokenEvent) and first is None:
                    first = time.perf_counter() - began
                if isinstance(event, FinishEvent):
                    break
            if first is not None:
                camera.append(first)
            if runner.vision.encodes > encodes:
                encode_ms.append(runner.vision.ms_per_token)

    thread = threading.Thread(target=camera_loop, name="bench-camera", daemon=True) if with_images else None
    if thread:
        thread.start()
    chat: list[float] = []
    began = time.perf_counter()
    i = 0
    while time.perf_counter() - began < shape.phase_s:
        due = began + i * shape.ask_every_s
        if time.perf_counter() < due:
            time.sleep(due - time.perf_counter())
        question = f"{QUESTIONS[i % len(QUESTIONS)]} ({next(_SEEDS)})"  # never a cached prompt, in either phase
        tokens = runner.tokenize(runner.apply_chat_template([{"role": "user", "content": question}]))
        ttft = _ttft(engine, tokens, "alice", shape.answer_tokens)
        if ttft is not None:
            chat.append(ttft)
        i += 1
    stop.set()
    if thread:
        thread.join(120)
    out = {"chat_questions": len(chat), "chat_ttft_p50_ms": _p(chat, 0.5), "chat_ttft_p95_ms": _p(chat, 0.95)}
    if with_images:
        out |= {"image_questions": len(camera), "image_ttft_p50_ms": _p(camera, 0.5),
                "image_ttft_p95_ms": _p(camera, 0.95),
                "encode_ms_per_token": round(statistics.median(encode_ms), 3) if encode_ms else None}
    return out


def run(engine, runner, shape: Shape, limits, progress=print) -> dict:
    # warm: a picture and a question, read once before either phase
    chat_phase(engine, runner, dataclasses.replace(shape, phase_s=min(shape.phase_s, 3.0)), True, limits)
    idle = chat_phase(engine, runner, shape, False, limits)
    progress(f"idle: chat TTFT p95 {idle['chat_ttft_p95_ms']} ms over {idle['chat_questions']} questions")
    busy = chat_phase(engine, runner, shape, True, limits)
    progress(f"beside images: chat TTFT p95 {busy['chat_ttft_p95_ms']} ms; image TTFT p50 "
             f"{busy['image_ttft_p50_ms']} ms over {busy['image_questions']} pictures")
    tokens = runner.tokenize(dataclasses.replace(
        runner.apply_chat_template([{"role": "user", "content": image_mark(0) + "\nx"}]),
        images=(_picture(shape, limits),), holder="bench-count"))
    runner.release_images(tokens.holder)
    (start, end), = tokens.images
    ratio = (busy["chat_ttft_p95_ms"] / idle["chat_ttft_p95_ms"]
             if busy["chat_ttft_p95_ms"] and idle["chat_ttft_p95_ms"] else None)
    return {"model": runner.info.description, "projector": runner.info.mmproj_path, "image_tokens": end - start,
            "threads": runner.num_threads, "shape": dataclasses.asdict(shape), "idle": idle, "beside_images": busy,
            "chat_ttft_p95_ratio": round(ratio, 2) if ratio else None}


def _picture(shape: Shape, limits):
    from homeai.service.images import decode

    return decode(snapshot(0, shape.size), limits)


def markdown(report: dict, command: str) -> str:
    idle, busy = report["idle"], report["beside_images"]
    return "\n".join([
        f"# homeai bench images\n\n`{command}`\n",
        f"Model {report['model']}, projector {report['projector']} ({report['image_tokens']} tokens an image), "
        f"{report['threads']} threads.\n",
        "| | chat TTFT p50 | chat TTFT p95 | image TTFT p50 | image TTFT p95 | encode ms a token |",
        "|---|---|---|---|---|---|",
        f"| idle | {idle['chat_ttft_p50_ms']} ms | {idle['chat_ttft_p95_ms']} ms | | | |",
        f"| beside image questions | {busy['chat_ttft_p50_ms']} ms | {busy['chat_ttft_p95_ms']} ms | "
        f"{busy['image_ttft_p50_ms']} ms | {busy['image_ttft_p95_ms']} ms | {busy['encode_ms_per_token']} |",
        f"\nchat TTFT p95 beside images / idle: **{report['chat_ttft_p95_ratio']}** "
        f"({busy['image_questions']} pictures, {idle['chat_questions']} and {busy['chat_questions']} chat questions)\n"])


def main(cfg, args) -> int:
    from homeai.app import engine_over, load_runner
    from homeai.bench.random_mmproj import TOWERS, write_mmproj, embedding_length
    from homeai.models import generation_model

    shape = QUICK if args.quick else Shape()
    with tempfile.TemporaryDirectory() as tmp:
        if not cfg.model.mmproj:
            tower, size, patch = TOWERS[args.tower]
            proj = Path(tmp) / f"mmproj-random-{args.tower}.gguf"
            write_mmproj(proj, embedding_length(generation_model(cfg)), image_size=size, patch_size=patch, tower=tower)
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, mmproj=str(proj)))
            print(f"no [model] mmproj: a random {args.tower} projector ({size} px, patch {patch})", flush=True)
        runner = load_runner(cfg, embeddings=False, grammar=False)
        engine = engine_over(cfg, runner).start()
        try:
            report = run(engine, runner, shape, cfg.limits)
        finally:
            engine.stop()
            runner.close()
    report["tower"] = None if cfg.model.mmproj and "mmproj-random" not in cfg.model.mmproj else args.tower
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "homeai bench images" + (" --quick" if args.quick else "") + f" --tower {args.tower}"
    (out / "images.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "images.md").write_text(markdown(report, command))
    print(markdown(report, command))
    return 0
