"""A member's share of the interactive readers through the real engine and model: beside another
member's flood of chats, a member's chat is let in at once (the flood's newest answer gives way
and still comes out whole), not after the flood's queue. Order and counts are compared, never times."""

from __future__ import annotations

import time

from homeai.sched.request import SamplingParams, Status


def chat(runner, text: str) -> list[int]:
    return runner.tokenize(runner.apply_chat_template([{"role": "user", "content": text}]))


ANSWER = 96  # alice's answers: long enough that her first still runs while bob's chat is let in and read
FLOOD = 6  # alice's chats: four readers (two sequence ids a cache, two caches) and two waiting


def test_a_members_chat_goes_before_another_members_queued_flood(runner, make_engine):
    # Two sequence ids per cache: a chat goes in whichever of its two caches has room (the interactive
    # one, then the main one: issue 54), so alice's readers fill all four before her first answer ends.
    engine = make_engine(num_seqs=2)
    flood = [engine.submit(chat(runner, f"Tell me a long story about lighthouse number {i}."), lane="chat",
                           member="alice", params=SamplingParams(temperature=0.8, seed=i, max_tokens=ANSWER,
                                                                 ignore_eos=True))
             for i in range(FLOOD)]
    deadline = time.monotonic() + 120
    while True:  # until alice's readers all decode (as many as the lane lets in) and the rest of her flood waits
        with engine.lock:
            running = [s for s in flood if s.request.status is Status.RUNNING]
            queued = [s.request for s in flood if s.request.status is Status.WAITING]
            if running and queued and all(s.request.is_decoding for s in running):
                answering = [s.request for s in running]
                bob = engine.submit(chat(runner, "Tell me a short story about a lighthouse."), lane="chat",
                                    member="bob", params=SamplingParams(temperature=0, max_tokens=8))
                break
        assert time.monotonic() < deadline, "alice's flood never filled the lane"
        time.sleep(0.02)
    bob_events = list(bob)
    alice_events = {s.request_id: list(s) for s in flood}
    assert bob.finished.reason in ("stop", "length") and bob.request.output_tokens
    assert queued, "part of alice's flood waited when bob's chat came"
    assert all(bob.request.first_token_time < r.finish_time for r in answering), \
        "bob's first token comes before any of alice's answers ends: he does not wait for a reader to finish"
    assert all(bob.request.first_token_time < r.first_token_time for r in queued), \
        "and before any of alice's queued chats is answered"
    preempted = [s for s in flood if s.request.num_preemptions]
    assert preempted, "alice's newest answer gave way for bob's"
    for s in flood:  # every answer whole: none lost or repeated across the preemption
        streamed = [e.token for e in alice_events[s.request_id] if hasattr(e, "token")]
        assert s.finished.reason == "length" and streamed == s.request.output_tokens and len(streamed) == ANSWER
    assert [e.token for e in bob_events if hasattr(e, "token")] == bob.request.output_tokens
