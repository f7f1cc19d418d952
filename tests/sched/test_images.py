"""Images in the pure scheduler: an image is a span of placeholder ids (negative, `homeai.llama.vision`),
read in chunks like any prompt tokens; one a projector reads whole (Gemma 3's images attend to all of
themselves) is never cut by a chunk's end; and no guess is drafted from placeholders."""

from __future__ import annotations

from homeai.sched.draft import DraftSettings, Drafting
from homeai.sched.request import Request, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits
from lanes import DEFAULT_POLICIES
from tests.sched.helpers import FakeRunner, cpu_ms, taught


def image_request(whole: bool, rid="img") -> Request:
    prompt = list(range(10, 30)) + [-(i + 1) for i in range(40)] + list(range(30, 50))  # text, an image, text
    return Request(rid, "chat", "alice", prompt, 0.0, params=SamplingParams(max_tokens=2), images=((20, 60),),
                   whole_images=whole)


def test_a_chunk_ends_before_a_whole_image_or_reads_all_of_it():
    r = image_request(whole=True)
    assert r.chunk_end(0, 16) == 16  # within the text
    assert r.chunk_end(0, 30) == 20  # would end inside the image: stops before it
    assert r.chunk_end(20, 8) == 40  # starts at it: reads all of it, past the room
    assert r.chunk_end(20, 50) == 50  # past its end: as asked
    assert image_request(whole=False).chunk_end(0, 30) == 30  # a causal image is cut anywhere


def read_chunks(whole: bool) -> list[tuple[int, int]]:
    limits = SchedulerLimits(num_cells=1024, num_seqs=8, max_step_tokens=16, embed_max_tokens=256, embed_max_seqs=4,
                             min_chunk=4)
    scheduler = taught(Scheduler(dict(DEFAULT_POLICIES), limits), cpu_ms)
    runner = FakeRunner(cost=cpu_ms)
    request = image_request(whole)
    scheduler.add_request(request)
    chunks, now = [], 0.0
    while not request.output_tokens:
        now += 1.0
        plan = scheduler.schedule(now)
        chunks += [(i.start, i.start + len(i.tokens)) for i in plan.items if i.request_id == request.request_id]
        scheduler.update(plan, runner.run(plan), now)
    return chunks


def test_a_whole_image_is_read_in_one_step_and_a_causal_one_in_chunks():
    whole = read_chunks(whole=True)
    assert (20, 60) in whole and all(not (20 < end < 60) for _, end in whole), whole
    causal = read_chunks(whole=False)
    assert any(20 < end < 60 for _, end in causal), causal
    assert whole[-1][1] == causal[-1][1] == 80  # every prompt token read, the image's counted as tokens


def test_no_guess_is_drafted_from_image_placeholders():
    drafting = Drafting(DraftSettings(enabled=True, max_draft=8, lanes=frozenset({"chat"})))
    # the answer so far ends with the n-gram the prompt has just before its image
    prompt = [5, 6, 7, 8, -1, -2, -3, 9, 10]
    assert drafting.guess("r", prompt, [5, 6, 7, 8], lambda: ()) == []
    prompt = [5, 6, 7, 8, 11, 12, -1, -2]
    assert drafting.guess("q", prompt, [5, 6, 7, 8], lambda: ()) == [11, 12]
