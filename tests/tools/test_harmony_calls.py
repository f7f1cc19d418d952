"""gpt-oss's calls through the thinking splitter first, as an answer reads them: the analysis
channel goes to thinking, a commentary message that calls a function reaches the harmony format
verbatim, and its call comes out whole however the stream splits the reply.

Run: .venv/bin/python -m pytest tests/tools/test_harmony_calls.py
"""

from __future__ import annotations

import random

import pytest

from homeai.service.thoughts import HarmonySplitter
from homeai.tools.formats import Harmony
from tests.tools.replies import DIM, plan_for

RAW = {  # what gpt-oss writes after the prompt's `<|start|>assistant` (`<|call|>` ends generation: never text)
    "after-analysis": ("<|channel|>analysis<|message|>The user wants the kitchen light dimmed.<|end|><|start|>assistant"
                       "<|channel|>commentary to=functions.intent__HassLightSet <|constrain|>json<|message|>"
                       '{"name": "kitchen light", "brightness": 40}', "The user wants the kitchen light dimmed.",
                       [DIM], None),
    "recipient-first": (' to=functions.homeassistant__GetLiveContext<|channel|>commentary json<|message|>{}', "",
                        [("homeassistant__GetLiveContext", {})], None),
    "no-call": ("<|channel|>analysis<|message|>Just answer.<|end|><|start|>assistant<|channel|>final<|message|>"
                "The light is on.", "Just answer.", [], "The light is on."),
}


@pytest.mark.parametrize("name", sorted(RAW))
def test_a_harmony_reply_split_anywhere_gives_its_thoughts_content_and_calls(name):
    raw, thoughts, calls, content = RAW[name]
    rng = random.Random(name)
    for _ in range(30):
        points = sorted(rng.sample(range(1, len(raw)), 8))
        splitter, stream = HarmonySplitter(), plan_for(Harmony).stream()
        thought, sent, came = "", "", []
        for piece in (raw[a:b] for a, b in zip([0, *points], [*points, len(raw)])):
            t, c = splitter.feed(piece)
            thought, sent = thought + t, sent + stream.feed(c)
            came += stream.new_calls()
        t, c = splitter.finish()
        stream.feed(c)
        rest, reply = stream.finish()
        assert thought + t == thoughts and (sent + rest) == (content or "")
        assert [(c.name, c.arguments) for c in came] == calls and reply.content == content
