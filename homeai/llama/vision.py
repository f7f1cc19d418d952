"""Images in: the vision projector beside the model (`[model] mmproj`, llama.cpp's libmtmd), owned here.

An image in a prompt is a run of placeholder token ids, negative so that no vocabulary holds them:
image `slot`'s i-th token is `-(slot * IMAGE_SPAN + i + 1)`. The scheduler reads them as any prompt
tokens (in chunks, at the lane's priority, counted in fair share and usage); the runner turns each
run of them into the projector's embeddings (`rows`) and reads those into the sequence's cache with
an embeddings batch (`EmbdBatch`) in the same step as everyone's tokens.

A picture is encoded once: its slot and embeddings are kept by its content hash (`Picture.digest`),
so a follow-up question about the same picture is not encoded again, and its placeholder ids are the
same, so the prompt cache finds the earlier turn's cells (the cache stays per member: the ids are
in the member's own text). Slots are never reused while the process lives: a cached prefix of one
image's ids can never stand for another's. Embeddings a live request holds stay (`hold`/`release`);
the rest go oldest first past `budget_bytes`.

An image becomes at most IMAGE_SPAN tokens. Projectors whose models read an image with M-RoPE
positions (the Qwen2-VL family) are refused at load: their image tokens take fewer positions than
tokens, and the scheduler counts one position a token.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import llama_cpp.mtmd_cpp as mt
import numpy as np

from homeai.engine.errors import InvalidRequest
from homeai.llama.model import RunnerError, _quiet_log


IMAGE_SPAN = 4096  # most tokens one image becomes; one slot's placeholder ids
MAX_SLOT = (2**31 - 1) // IMAGE_SPAN - 1  # placeholder ids are int32 (the prompt cache's arrays)


def image_token(slot: int, i: int) -> int:
    return -(slot * IMAGE_SPAN + i + 1)


@dataclass(frozen=True)
class Encoded:
    """One picture as the model reads it: the wrapper tokens and placeholders, and its image's span."""

    slot: int
    tokens: tuple[int, ...]  # the projector's own text around the image (`<start_of_image>`...) and its placeholders
    start: int  # where the placeholders start in `tokens`
    n: int  # how many
    whole: bool  # read in one decode (non-causal attention over the image: Gemma 3), not in chunks


class Vision:
    """The projector: pictures to placeholder tokens and embeddings, kept by content hash."""

    def __init__(self, path: Path, model, n_embd: int, threads: int, gpu: bool, budget_bytes: int = 256 << 20):
        quiet_mtmd()
        params = mt.mtmd_context_params_default()
        params.use_gpu = gpu
        # On a CPU an encode takes one core, and the steps the rest while it runs (`busy`, the runner's
        # `_follow_cores`): a step's threads wait at every barrier for the slowest, so sharing a core
        # with an encode slows a whole step; on a GPU the encode runs there.
        self.threads, self.on_gpu = (threads if gpu else 1), gpu
        params.n_threads = self.threads
        params.print_timings = False
        params.warmup = False
        self._marker_bytes = mt.mtmd_default_marker()  # (one picture is tokenized at a time, its marker alone)
        self.ctx = mt.mtmd_init_from_file(str(path).encode(), model, params)
        if not self.ctx:
            raise RunnerError(f"llama.cpp could not load the projector {path} for this model")
        if not mt.mtmd_support_vision(self.ctx):
            self.close()
            raise RunnerError(f"the projector {path} reads no images (an audio projector?)")
        if mt.mtmd_decode_use_mrope(self.ctx):
            self.close()
            raise RunnerError(f"the projector {path} places images with M-RoPE positions (the Qwen2-VL family), "
                              "which homeai does not read yet")
        self.path, self.n_embd, self.budget_bytes = path, n_embd, budget_bytes
        # an image attends to all of itself (Gemma 3): read whole, in one decode with causal attention off
        self.whole = bool(mt.mtmd_decode_use_non_causal(self.ctx, None))
        self._lock = threading.Lock()  # mtmd's context is not thread-safe; requests are tokenized in workers
        self._by_digest: dict[str, Encoded] = {}
        self._embd: OrderedDict[int, np.ndarray] = OrderedDict()  # slot -> (n, n_embd) float32, oldest first
        self._held: dict[str, tuple[int, ...]] = {}  # request id -> the slots it holds
        self._holds: dict[int, int] = {}  # slot -> live requests holding it
        self._next_slot = 0
        self.busy = False  # an encode is running (read by the step loop, between steps)
        # Every encode on one thread of its own (mtmd's context is not thread-safe), niced below the steps:
        # on a CPU an encode shares the cores with the step loop, and it takes what the steps leave.
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="homeai-vision",
                                           initializer=_below_the_steps)
        # What encoding costs on this box, learnt (an image is one unit of work: `encode`)
        self.encodes = self.reused = 0
        self.ms_per_token = 0.0

    # ---- pictures in ------------------------------------------------------------------------

    def encoded(self, picture, holder: str) -> Encoded:
        """`picture`'s tokens, encoding it unless its embeddings are kept; they stay, held by `holder`
        (a prompt being made: `hold` hands them to its request, `release` lets them go). The encode runs
        on the projector's own thread, at a lower priority than the steps (`_encoder`), and holds no lock
        a step waits on."""
        with self._lock:
            known = self._by_digest.get(picture.digest)
            if known is not None and known.slot in self._embd:
                self._embd.move_to_end(known.slot)
                self.reused += 1
                self._take(holder, known.slot)
                return known
            slot = known.slot if known is not None else self._new_slot()
        encoded, rows = self._encoder.submit(self._encode, picture, slot).result()
        with self._lock:
            self._by_digest[picture.digest] = encoded
            self._embd[slot] = rows
            self._take(holder, slot)
            self._evict()
            return encoded

    def _take(self, holder: str, slot: int) -> None:
        self._held[holder] = self._held.get(holder, ()) + (slot,)
        self._holds[slot] = self._holds.get(slot, 0) + 1

    def _new_slot(self) -> int:
        if self._next_slot > MAX_SLOT:
            raise InvalidRequest("this server has read as many different images as it can until it restarts",
                                 "images", "too_many_images")
        self._next_slot += 1
        return self._next_slot - 1

    def _encode(self, picture, slot: int) -> tuple[Encoded, np.ndarray]:
        data = (ctypes.c_uint8 * len(picture.rgb)).from_buffer_copy(picture.rgb)
        bitmap = mt.mtmd_bitmap_init(picture.width, picture.height, data)
        chunks = mt.mtmd_input_chunks_init()
        try:
            text = mt.mtmd_input_text(self._marker_bytes, len(self._marker_bytes), False, True)
            bitmaps = (mt.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:
                raise InvalidRequest(f"the projector could not read this image (mtmd_tokenize: {rc})", "images",
                                     "invalid_image")
            tokens: list[int] = []
            start = n = -1
            whole = False
            rows = None
            for i in range(mt.mtmd_input_chunks_size(chunks)):
                chunk = mt.mtmd_input_chunks_get(chunks, i)
                kind = mt.mtmd_input_chunk_get_type(chunk)
                if kind == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    count = ctypes.c_size_t(0)
                    ids = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                    tokens += [ids[j] for j in range(count.value)]
                    continue
                if kind != mt.MTMD_INPUT_CHUNK_TYPE_IMAGE or rows is not None:
                    raise InvalidRequest("the projector made something other than one image of it", "images",
                                         "invalid_image")
                n = mt.mtmd_input_chunk_get_n_tokens(chunk)
                if n > IMAGE_SPAN or mt.mtmd_input_chunk_get_n_pos(chunk) != n:
                    raise InvalidRequest(f"this image becomes {n} tokens, more than one image may ({IMAGE_SPAN})",
                                         "images", "image_too_large")
                whole = self.whole
                rows = self._run_encoder(chunk, n)
                start = len(tokens)
                tokens += [image_token(slot, j) for j in range(n)]
            if rows is None:
                raise InvalidRequest("the projector made no image of it", "images", "invalid_image")
            return Encoded(slot, tuple(tokens), start, n, whole), rows
        finally:
            mt.mtmd_input_chunks_free(chunks)
            mt.mtmd_bitmap_free(bitmap)

    def _run_encoder(self, chunk, n: int) -> np.ndarray:  # (on the encoder thread)
        began = time.perf_counter()
        self.busy = True
        try:
            rc = mt.mtmd_encode_chunk(self.ctx, chunk)
        finally:
            self.busy = False
        if rc != 0:
            raise InvalidRequest(f"the projector failed on this image (mtmd_encode_chunk: {rc})", "images",
                                 "invalid_image")
        ptr = mt.mtmd_get_output_embd(self.ctx)
        rows = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                     shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy()
        ms = (time.perf_counter() - began) * 1000.0
        self.encodes += 1
        # learnt as llama.cpp's step costs are: recent encodes weigh most
        per_token = ms / max(n, 1)
        self.ms_per_token = per_token if self.encodes == 1 else 0.8 * self.ms_per_token + 0.2 * per_token
        return rows

    # ---- which embeddings stay ----------------------------------------------------------------

    def hold(self, holder: str, request_id: str) -> None:
        """The images `holder`'s prompt holds are now its queued request's: they stay until `release`."""
        with self._lock:
            slots = self._held.pop(holder, ())
            if slots:
                self._held[request_id] = slots

    def release(self, request_id: str) -> None:
        with self._lock:
            for slot in self._held.pop(request_id, ()):
                left = self._holds[slot] - 1
                if left:
                    self._holds[slot] = left
                else:
                    del self._holds[slot]
            self._evict()

    def _evict(self) -> None:
        size = sum(rows.nbytes for rows in self._embd.values())
        for slot in list(self._embd):
            if size <= self.budget_bytes:
                return
            if slot not in self._holds:
                size -= self._embd.pop(slot).nbytes

    # ---- read into the cache ----------------------------------------------------------------

    def rows(self, tokens: np.ndarray) -> np.ndarray:
        """The embeddings of placeholder ids `tokens` (negative), in order."""
        ids = -tokens.astype(np.int64) - 1
        slots, index = ids // IMAGE_SPAN, ids % IMAGE_SPAN
        out = np.empty((len(tokens), self.n_embd), dtype=np.float32)
        with self._lock:
            for slot in np.unique(slots).tolist():
                rows = self._embd.get(slot)
                if rows is None:
                    raise RunnerError(f"image slot {slot}'s embeddings are gone while a request reads them")
                where = slots == slot
                out[where] = rows[index[where]]
        return out

    def stats(self) -> dict:
        with self._lock:
            return {"encodes": self.encodes, "reused": self.reused, "encode_ms_per_token": round(self.ms_per_token, 3),
                    "kept_images": len(self._embd), "kept_bytes": sum(r.nbytes for r in self._embd.values())}

    def close(self) -> None:
        self._encoder.shutdown(wait=True)
        if self.ctx:
            mt.mtmd_free(self.ctx)
            self.ctx = None


ENCODE_NICE = 10  # the encoder thread's niceness (its compute threads, created by it, inherit it)


def _below_the_steps() -> None:
    """The encoder thread's priority under the step loop's (Linux: a thread's own niceness)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ENCODE_NICE)
    except (OSError, AttributeError):  # not Linux, or not allowed: the encode runs at the steps' priority
        pass


def quiet_mtmd() -> None:
    """libmtmd logs each tensor and each encode: only its errors are kept, as llama.cpp's (`model.init_backend`)."""
    mt.mtmd_log_set(_quiet_log, ctypes.c_void_p(0))


def runs(tokens: list[int]) -> list[tuple[bool, int, list[int]]]:
    """A chunk's tokens in runs of text and of image placeholders: (is_image, offset, tokens) each."""
    out: list[tuple[bool, int, list[int]]] = []
    begin = 0
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or (tokens[i] < 0) != (tokens[begin] < 0):
            out.append((tokens[begin] < 0, begin, tokens[begin:i]))
            begin = i
    return out
