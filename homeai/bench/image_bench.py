"""`homeai bench images`: what an image question costs, itself and the household beside it.

Two phases on one engine over the configured model and projector (`[model] mmproj`; without one, a
random-weight projector in a real tower's shape, `--tower`, written for the model: its answers are
noise, its encode costs what that tower's does):
- idle: a chat member asks short questions on a fixed schedule, alone; each answer's time to first
  token (TTFT) is taken from its submit;
- beside images: the same questions on the same schedule, while a camera member (Home Assistant's AI
  Task on a motion event, say) asks about a new snapshot every `--camera-every` seconds, or as soon as
  its last answer ends when it is behind (0: back to back, a saturating stream; each picture new: encoded).
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
    ask_every_s: float = 1.0  # the chat member's schedule
    answer_tokens: int = 16
    camera_tokens: int = 24  # each image question's answer cap
    camera_every_s: float = 2.0  # the camera's schedule (0: back to back)
    size: tuple[int, int] = (640, 480)  # a snapshot's pixels (the projector resizes it)


QUICK = Shape(phase_s=6.0, ask_every_s=1.5, answer_tokens=4, camera_tokens=4, camera_every_s=0.0, size=(96, 64))


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


def chat_phase(engine, runner, shape: Shape, camera: str, limits) -> dict:
    """One phase: the chat member's TTFTs beside the camera (`camera`: "none", "text", its twin of the
    same tokens without a picture, or "images"), and the camera's."""
    from homeai.service.images import decode

    stop = threading.Event()
    asked_ttft: list[float] = []
    encode_ms: list[float] = []
    twin = _twin(runner, shape, limits) if camera == "text" else None
    rng = np.random.default_rng(0)

    def camera_question(n: int, began: float):
        if twin is not None:  # the image's span, new text tokens each time (never a cached prompt)
            tokens, (start, end) = twin
            return tokens[:start] + rng.integers(1000, 40000, end - start).tolist() + tokens[end:]
        picture = decode(snapshot(n, shape.size), limits)  # as the service reads one
        prompt = runner.apply_chat_template([{"role": "user", "content": image_mark(0) + "\n" + CAMERA}])
        return dataclasses.replace(prompt, images=(picture,), holder=f"bench-{n}-{time.monotonic_ns()}")

    def camera_loop() -> None:
        start = time.perf_counter()
        asked = 0
        while not stop.is_set():
            due = start + asked * shape.camera_every_s
            if time.perf_counter() < due and stop.wait(due - time.perf_counter()):
                break
            asked += 1
            began = time.perf_counter()
            prompt = camera_question(next(_SEEDS), began)
            encodes = runner.vision.encodes
            first = None
            for event in engine.submit(prompt, lane="chat", member="camera",
                                       params=SamplingParams(temperature=0, max_tokens=shape.camera_tokens)):
                if isinstance(event, TokenEvent) and first is None:
                    first = time.perf_counter() - began
                if isinstance(event, FinishEvent):
                    break
            if first is not None:
                asked_ttft.append(first)
            if runner.vision.encodes > encodes:
                encode_ms.append(runner.vision.ms_per_token)

    thread = threading.Thread(target=camera_loop, name="bench-camera", daemon=True) if camera != "none" else None
    if thread:
        thread.start()
    chat: list[float] = []
    began = time.perf_counter()
    i = 0
    while time.perf_counter() - began < shape.phase_s:
        due = began + i * shape.ask_every_s
        if time.perf_counter() < due:
            time.sleep(due - time.perf_counter())
        question = f"{QUESTIONS[i % len(QUESTIONS)]} ({next(_SEEDS)})"  # never a cached prompt, in any phase
        tokens = runner.tokenize(runner.apply_chat_template([{"role": "user", "content": question}]))
        ttft = _ttft(engine, tokens, "alice", shape.answer_tokens)
        if ttft is not None:
            chat.append(ttft)
        i += 1
    stop.set()
    if thread:
        thread.join(120)
    out = {"chat_questions": len(chat), "chat_ttft_p50_ms": _p(chat, 0.5), "chat_ttft_p95_ms": _p(chat, 0.95)}
    if camera != "none":
        out |= {"camera_questions": len(asked_ttft), "camera_ttft_p50_ms": _p(asked_ttft, 0.5),
                "camera_ttft_p95_ms": _p(asked_ttft, 0.95)}
    if camera == "images":
        out["encode_ms_per_token"] = round(statistics.median(encode_ms), 3) if encode_ms else None
    return out


CAMERA = "Is someone at the door?"


def _twin(runner, shape: Shape, limits) -> tuple[list[int], tuple[int, int]]:
    """The camera's question as tokens, and its image's span (to fill with text tokens instead)."""
    prompt = runner.apply_chat_template([{"role": "user", "content": image_mark(0) + "\n" + CAMERA}])
    tokens = runner.tokenize(dataclasses.replace(prompt, images=(_picture(shape, limits),), holder="bench-twin"))
    runner.release_images(tokens.holder)
    return list(tokens), tokens.images[0]


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def run(engine, runner, shape: Shape, limits, progress=print) -> dict:
    # warm: a picture and a question, read once before any phase
    chat_phase(engine, runner, dataclasses.replace(shape, phase_s=min(shape.phase_s, 3.0)), "images", limits)
    phases = {}
    for camera in ("none", "text", "images"):
        phases[camera] = chat_phase(engine, runner, shape, camera, limits)
        progress(f"camera {camera}: chat TTFT p95 {phases[camera]['chat_ttft_p95_ms']} ms over "
                 f"{phases[camera]['chat_questions']} questions"
                 + (f"; its own TTFT p50 {phases[camera]['camera_ttft_p50_ms']} ms" if camera != "none" else ""))
    tokens, (start, end) = _twin(runner, shape, limits)
    idle = phases["none"]["chat_ttft_p95_ms"]
    return {"model": runner.info.description, "projector": runner.info.mmproj_path, "image_tokens": end - start,
            "threads": runner.num_threads, "shape": dataclasses.asdict(shape), "idle": phases["none"],
            "beside_text": phases["text"], "beside_images": phases["images"],
            "chat_ttft_p95_ratio": _ratio(phases["images"]["chat_ttft_p95_ms"], idle),
            "chat_ttft_p95_ratio_text": _ratio(phases["text"]["chat_ttft_p95_ms"], idle)}


def _picture(shape: Shape, limits):
    from homeai.service.images import decode

    return decode(snapshot(0, shape.size), limits)


def markdown(report: dict, command: str) -> str:
    rows = [("idle", report["idle"]), ("beside its text twin", report["beside_text"]),
            ("beside image questions", report["beside_images"])]
    lines = [f"# homeai bench images\n\n`{command}`\n",
             f"Model {report['model']}, projector {report['projector']} ({report['image_tokens']} tokens an image), "
             f"{report['threads']} threads. A camera asks every {report['shape']['camera_every_s']:g} s (0: back to "
             "back): about a new snapshot, or its text twin (the same question with text tokens where the image's "
             "are: no picture, no encode).\n",
             "| chat beside | questions | chat TTFT p50 | chat TTFT p95 | camera's TTFT p50 | camera's TTFT p95 |",
             "|---|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {r['chat_questions']} | {r['chat_ttft_p50_ms']} ms | {r['chat_ttft_p95_ms']} ms | "
                     f"{r.get('camera_ttft_p50_ms') or ''} | {r.get('camera_ttft_p95_ms') or ''} |")
    lines.append(f"\nAn encode: {report['beside_images']['encode_ms_per_token']} ms a token. Chat TTFT p95 over idle: "
                 f"beside images **{report['chat_ttft_p95_ratio']}**, beside the text twin "
                 f"{report['chat_ttft_p95_ratio_text']}.\n")
    return "\n".join(lines)


def main(cfg, args) -> int:
    from homeai.app import engine_over, load_runner
    from homeai.bench.random_mmproj import TOWERS, write_mmproj, embedding_length
    from homeai.models import generation_model

    shape = QUICK if args.quick else Shape()
    if args.camera_every is not None:
        shape = dataclasses.replace(shape, camera_every_s=args.camera_every)
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
    command = ("homeai bench images" + (" --quick" if args.quick else "") + f" --tower {args.tower}"
               + (f" --camera-every {args.camera_every:g}" if args.camera_every is not None else ""))
    (out / "images.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "images.md").write_text(markdown(report, command))
    print(markdown(report, command))
    return 0
