"""The speech-out pool's bookkeeping without piper (`homeai.speech.synthesis_queue`): admission's
three bounds (a member's own cap, the pool, the voice lane's reserve) and the order sentences are
made in (priority, then the member served least, then arrival); the config's bounds on them.

Run: .venv/bin/python -m pytest tests/speech/test_synthesis_queue.py
"""

from __future__ import annotations

import pytest

from homeai.config import ConfigError, from_dict
from homeai.speech.base import SynthesisBusy, SynthesisOverCap
from homeai.speech.synthesis_queue import PRIORITY_BACKGROUND, PRIORITY_CHAT, PRIORITY_VOICE, Admission, FairQueue

CHUNK = 1000  # bytes of audio a chunk: every chunk costs the same here unless a test says otherwise


# ---- admission -----------------------------------------------------------------------------

def test_a_member_over_their_own_cap_is_refused_as_theirs_and_others_are_not():
    admission = Admission(max_pending=24, max_pending_per_member=8, voice_reserve=4)
    for _ in range(8):
        admission.open("alice", PRIORITY_CHAT)
    with pytest.raises(SynthesisOverCap, match=r"tts\.max_pending_per_member = 8"):
        admission.open("alice", PRIORITY_CHAT)
    with pytest.raises(SynthesisOverCap):  # the voice lane counts against the same cap
        admission.open("alice", PRIORITY_VOICE)
    admission.open("bob", PRIORITY_CHAT)
    admission.open("carol", PRIORITY_VOICE)
    assert (admission.open_of("alice"), admission.num_open) == (8, 10)
    admission.close("alice")
    admission.open("alice", PRIORITY_CHAT)  # one ended: room for one more of hers
    assert admission.open_of("alice") == 8


def test_the_reserve_is_kept_for_voice_and_a_full_pool_is_the_boxs_busy():
    admission = Admission(max_pending=6, max_pending_per_member=2, voice_reserve=2)
    for member in ("a", "a", "b", "b"):
        admission.open(member, PRIORITY_BACKGROUND)
    with pytest.raises(SynthesisBusy) as caught:  # chat and background stop short of the reserve
        admission.open("c", PRIORITY_CHAT)
    assert not isinstance(caught.value, SynthesisOverCap)
    assert "tts.max_pending" in str(caught.value) and "voice lane" in str(caught.value)
    admission.open("c", PRIORITY_VOICE)
    admission.open("d", PRIORITY_VOICE)
    with pytest.raises(SynthesisBusy) as caught:  # voice may take the reserve, not more
        admission.open("e", PRIORITY_VOICE)
    assert not isinstance(caught.value, SynthesisOverCap) and admission.num_open == 6


def test_the_cap_is_checked_before_the_pool():
    """A member at their cap on a full pool is told it is theirs (429), not the box's (503)."""
    admission = Admission(max_pending=2, max_pending_per_member=2, voice_reserve=0)
    admission.open("alice", PRIORITY_CHAT)
    admission.open("alice", PRIORITY_CHAT)
    with pytest.raises(SynthesisOverCap):
        admission.open("alice", PRIORITY_CHAT)
    with pytest.raises(SynthesisBusy) as caught:
        admission.open("bob", PRIORITY_CHAT)
    assert not isinstance(caught.value, SynthesisOverCap)


# ---- order ---------------------------------------------------------------------------------

def run(queue: FairQueue, chunks: dict[str, int], cost=lambda item: CHUNK) -> list[str]:
    """Take items one at a time as one worker does, each making one chunk; `chunks` says how many
    each item has. The order the chunks were made in."""
    left = dict(chunks)
    order = []
    while (item := queue.take()) is not None:
        order.append(item)
        queue.charge(item, cost(item))
        left[item] -= 1
        if left[item]:
            queue.put_back(item)
        else:
            queue.drop(item)
    return order


def test_members_take_turns_within_a_priority_not_arrival():
    queue = FairQueue()
    for i in range(8):
        queue.add(f"alice{i}", priority=PRIORITY_CHAT, member="alice")
    queue.add("bob", priority=PRIORITY_CHAT, member="bob")
    order = run(queue, {**{f"alice{i}": 2 for i in range(8)}, "bob": 3})
    assert [o for o in order[:6]] == ["alice0", "bob", "alice0", "bob", "alice1", "bob"]
    assert order[6:] == [f"alice{i}" for i in range(1, 8) for _ in range(2)][1:]


def test_priority_comes_before_share():
    queue = FairQueue()
    queue.add("alice-background", priority=PRIORITY_BACKGROUND, member="alice")
    queue.add("bob-chat", priority=PRIORITY_CHAT, member="bob")
    queue.add("carol-voice", priority=PRIORITY_VOICE, member="carol")
    queue.add("alice-voice", priority=PRIORITY_VOICE, member="alice")
    order = run(queue, {"alice-background": 1, "bob-chat": 2, "carol-voice": 2, "alice-voice": 1})
    assert order[:3] == ["carol-voice", "alice-voice", "carol-voice"]
    assert order[3:] == ["bob-chat", "bob-chat", "alice-background"]


def test_share_is_counted_in_audio_made_not_turns():
    """bob's sentences are three times alice's length: alice gets three turns to his one (level
    with him, the one served longest ago goes first)."""
    queue = FairQueue()
    queue.add("alice", priority=PRIORITY_CHAT, member="alice")
    queue.add("bob", priority=PRIORITY_CHAT, member="bob")
    order = run(queue, {"alice": 9, "bob": 3}, cost=lambda item: 3 * CHUNK if item == "bob" else CHUNK)
    assert order == ["alice", "bob", "alice", "alice", "bob", "alice", "alice", "alice", "bob",
                     "alice", "alice", "alice"]


def test_a_newcomer_starts_level_with_those_waiting_not_at_zero():
    """alice has been served a lot alone; bob arriving does not get her backlog of turns, nor
    she his: they alternate from there."""
    queue = FairQueue()
    queue.add("alice", priority=PRIORITY_CHAT, member="alice")
    for _ in range(50):
        item = queue.take()
        queue.charge(item, CHUNK)
        queue.put_back(item)
    queue.add("bob", priority=PRIORITY_CHAT, member="bob")
    order = run(queue, {"alice": 3, "bob": 3})
    assert order == ["bob", "alice", "bob", "alice", "bob", "alice"]


def test_an_idle_member_is_not_held_to_what_they_were_served():
    queue = FairQueue()
    queue.add("bob1", priority=PRIORITY_CHAT, member="bob")
    assert run(queue, {"bob1": 20}) == ["bob1"] * 20  # alone: served much, then idle
    queue.add("alice", priority=PRIORITY_CHAT, member="alice")
    queue.add("bob2", priority=PRIORITY_CHAT, member="bob")
    assert run(queue, {"alice": 2, "bob2": 2}) == ["alice", "bob2", "alice", "bob2"]


def test_a_dropped_item_leaves_the_line_whether_waiting_or_taken():
    queue = FairQueue()
    for name in ("a", "b", "c"):
        queue.add(name, priority=PRIORITY_CHAT, member="alice")
    queue.drop("b")  # its listener left while it waited
    taken = queue.take()
    assert taken == "a" and len(queue) == 1
    queue.drop("a")  # left while it ran: never put back
    queue.drop("a")  # twice is harmless
    assert queue.take() == "c" and queue.take() is None
    queue.drop("c")
    assert len(queue) == 0 and queue.take() is None


# ---- the config's bounds -------------------------------------------------------------------

@pytest.mark.parametrize("tts, key", [({"max_pending": 0}, "tts.max_pending"),
                                      ({"max_pending_per_member": 0}, "tts.max_pending_per_member"),
                                      ({"max_pending": 4, "max_pending_per_member": 5}, "tts.max_pending_per_member"),
                                      ({"voice_reserve": -1}, "tts.voice_reserve"),
                                      ({"max_pending": 4, "max_pending_per_member": 2, "voice_reserve": 4},
                                       "tts.voice_reserve")])
def test_the_pools_bounds_are_checked_naming_the_key(tts, key):
    with pytest.raises(ConfigError, match=key):
        from_dict({"tts": tts}, "(test)")


def test_the_defaults_leave_room_for_a_neighbour_beside_a_member_at_their_cap():
    cfg = from_dict({}, "(test)").tts
    assert cfg.max_pending - cfg.voice_reserve >= 2 * cfg.max_pending_per_member
    assert cfg.voice_reserve >= 1
