"""The prompt cache seen from outside: `usage.prompt_tokens_details.cached_tokens` through the
`openai` client (whole and streamed), the lanes view and Prometheus, on a real server."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families


pytestmark = pytest.mark.model

SYSTEM = {"role": "system", "content": "You help a household. Devices: " +
          ", ".join(f"{room} lamp {k}" for room in ("kitchen", "hall", "study") for k in range(8)) + "."}


def test_a_conversations_next_turn_reads_only_its_new_tokens(client, http):
    first = [SYSTEM, {"role": "user", "content": "Which lamps are in the study?"}]
    turn1 = client.chat.completions.create(model="homeai", messages=first, max_tokens=8, temperature=0)
    assert turn1.usage.prompt_tokens_details.cached_tokens == 0, "nothing was cached yet"
    history = first + [{"role": "assistant", "content": turn1.choices[0].message.content},
                       {"role": "user", "content": "Turn the first one off."}]
    turn2 = client.chat.completions.create(model="homeai", messages=history, max_tokens=8, temperature=0)
    cached = turn2.usage.prompt_tokens_details.cached_tokens
    assert turn1.usage.prompt_tokens - 2 <= cached < turn2.usage.prompt_tokens, (turn1.usage, turn2.usage)

    stream = client.chat.completions.create(model="homeai", messages=history, max_tokens=4, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens_details.cached_tokens == turn2.usage.prompt_tokens - 1, \
        "the same prompt again: all but its last token from the cache"

    lanes = http.get("/api/lanes").json()
    chat = lanes["lanes"]["chat"]["prompt_cache"]
    assert chat["requests"] >= 3 and chat["hits"] >= 2 and 0 < chat["hit_rate"] < 1
    assert lanes["kv"]["cells_cached"] > 0 and sum(c["entries"] for c in lanes["kv"]["caches"].values()) >= 1

    families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    hit_tokens = {s.labels["lane"]: s.value for s in families["homeai_prompt_cache_hit_tokens"].samples
                  if s.name == "homeai_prompt_cache_hit_tokens_total"}
    assert hit_tokens["chat"] == chat["cached_tokens"] and hit_tokens["voice"] == 0
    rate = {s.labels["lane"]: s.value for s in families["homeai_prompt_cache_hit_rate"].samples}
    assert rate["chat"] == pytest.approx(chat["hit_rate"], abs=1e-4)
    cells = sum(s.value for s in families["homeai_prompt_cache_cells"].samples)
    assert cells == lanes["kv"]["cells_cached"]


def test_a_legacy_completion_reports_cached_tokens_too(client):
    text = SYSTEM["content"] + " Question: which room has the most lamps?"
    client.completions.create(model="homeai", prompt=text, max_tokens=2, temperature=0)
    again = client.completions.create(model="homeai", prompt=text + " Answer briefly.", max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
