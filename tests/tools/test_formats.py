"""Each family's call form, without a model: recorded replies (tests/tools/replies.py) parsed whole
and as a stream delivers them, split at random points; the form chosen from each published
template; the history written as each template takes it.

Run: .venv/bin/python -m pytest tests/tools/test_formats.py
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from homeai import tools as tool_calling
from homeai.service import sampling
from homeai.tools.formats import (Gemma, Gemma4, Generic, Granite, Harmony, Hermes, Llama3, Mistral, Phi4, QwenXML,
                                  for_template)
from lanes import chat
from tests.tools.replies import MALFORMED, REPLIES, plan_for

TEMPLATES = Path(__file__).resolve().parents[1] / "engine" / "templates"

# The call form each published template (tests/engine/templates/) writes.
TEMPLATE_FORMS = {
    "qwen2.5-instruct.jinja": Hermes,
    "Qwen-Qwen3-0.6B.jinja": Hermes,
    "Qwen3-Coder.jinja": QwenXML,
    "llama3.1-instruct.jinja": Llama3,
    "meta-llama-Llama-3.2-3B-Instruct.jinja": Llama3,
    "mistral-7b-instruct-v0.3.jinja": Mistral,
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": Mistral,
    "unsloth-Magistral-Small-2509.jinja": Mistral,
    "openai-gpt-oss-120b.jinja": Harmony,
    "google-gemma-2-2b-it.jinja": Generic,
    "google-gemma-3-it.jinja": Generic,
    "ibm-granite-granite-3.3-2B-Instruct.jinja": Granite,
    "llama-cpp-microsoft-Phi-4-mini-instruct.jinja": Phi4,
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": Generic,
    "HuggingFaceTB-SmolLM3-3B.jinja": Generic,  # Unsloth's copy renders no tools
}


def cut(text: str, rng: random.Random) -> list[str]:
    """`text` in pieces split at random points, as a stream delivers it (some pieces empty or one character)."""
    points = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


def streamed(plan, pieces: list[str]) -> tuple[str, list, tool_calling.Reply]:
    """Content sent, calls sent as they came, and the whole reply, from feeding `pieces`."""
    stream, sent, came = plan.stream(), "", []
    for piece in pieces:
        sent += stream.feed(piece)
        came += stream.new_calls()
    rest, reply = stream.finish()
    return sent + rest, came, reply


def pairs(calls) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_a_recorded_reply_parses_into_its_content_and_calls(family):
    recorded = REPLIES[family]
    reply = plan_for(recorded.fmt, recorded.source).parse(recorded.text)
    assert reply.content == recorded.content
    assert pairs(reply.calls) == list(recorded.calls)


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_the_same_calls_however_the_stream_splits_the_reply(family):
    recorded = REPLIES[family]
    rng = random.Random(family)
    for _ in range(40):
        sent, came, reply = streamed(plan_for(recorded.fmt, recorded.source), cut(recorded.text, rng))
        assert pairs(came) == list(recorded.calls), "each call sent as it was written whole"
        assert reply.calls == tuple(came), "the end adds none, and keeps the ids sent"
        assert sent.strip() == (recorded.content or "") if recorded.text.startswith(recorded.content or "") \
            else sent.strip() == ""
        assert not re.search(r"intent__|homeassistant__|climate__", sent), "no call's markup is sent as text"


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_each_call_is_sent_the_moment_it_is_written_whole(family):
    """Fed a character at a time, the first call comes no later than the character that closes its
    arguments (the closing marker, where there is one, is not waited for)."""
    recorded = REPLIES[family]
    stream, text, first = plan_for(recorded.fmt, recorded.source).stream(), recorded.text, None
    for end in range(1, len(text) + 1):
        stream.feed(text[end - 1])
        if stream.new_calls() and first is None:
            first = end
    name = recorded.calls[0][0]
    second = text.find(recorded.calls[1][0]) if len(recorded.calls) > 1 else len(text)
    assert first is not None and text.find(name) < first <= second


@pytest.mark.parametrize("family", sorted(MALFORMED))
def test_a_malformed_call_stays_text(family):
    recorded, text = REPLIES[family], MALFORMED[family]
    plan = plan_for(recorded.fmt, recorded.source)
    assert plan.parse(text) == tool_calling.Reply(text)
    rng = random.Random(family)
    for _ in range(10):
        sent, came, reply = streamed(plan, cut(text, rng))
        assert sent == text and came == [] and reply == tool_calling.Reply(text)


def test_names_with_double_underscores_pass_unchanged():
    names = {name for recorded in REPLIES.values() for name, _ in recorded.calls}
    assert names == {"intent__HassTurnOn", "intent__HassLightSet", "homeassistant__GetLiveContext",
                     "climate__SetTemperature"}


@pytest.mark.parametrize("family", ["mistral-list", "mistral-named"])
def test_mistral_call_ids_are_kept_and_made_nine_characters(family):
    recorded = REPLIES[family]
    reply = plan_for(recorded.fmt, recorded.source).parse(recorded.text)
    for call, written in zip(reply.calls, recorded.ids):
        assert call.id == written if written else re.fullmatch(r"[A-Za-z0-9]{9}", call.id)


def test_without_parallel_calls_only_the_first_is_taken():
    for family in ("hermes", "qwen3-coder", "mistral-named", "functiongemma", "phi4"):
        recorded = REPLIES[family]
        plan = plan_for(recorded.fmt, recorded.source, parallel=False)
        _sent, came, _reply = streamed(plan, [recorded.text])
        assert pairs(came) == [recorded.calls[0]], family


def test_xml_values_take_the_schemas_types():
    reply = plan_for(QwenXML).parse(REPLIES["qwen3-coder"].text)
    temperature = reply.calls[1].arguments
    assert temperature == {"temperature": 20.5, "away": False, "schedule": {"from": "07:00", "to": "22:00"}}
    text = "<tool_call>\n<function=intent__HassTurnOn>\n<parameter=name>\n42\n</parameter>\n</function>\n</tool_call>"
    assert plan_for(QwenXML).parse(text).calls[0].arguments == {"name": "42"}, "a string stays text"


def test_a_harmony_call_may_end_at_the_end_of_the_text():
    """`<|call|>` ends generation and is never text: the arguments' closing brace ends the call."""
    text = REPLIES["harmony"].text
    cut_short = text[:-1]
    assert plan_for(Harmony).parse(cut_short).calls == ()
    for end in ("<|call|>", "<|end|>"):  # the message's end, if the splitter passes one on, is no text
        reply = plan_for(Harmony).parse(text + end)
        assert reply.content is None and pairs(reply.calls) == list(REPLIES["harmony"].calls)


def test_text_that_only_looks_like_an_opening_is_sent_in_the_end():
    for fmt, looks in ((QwenXML, "see <functions> here"), (Gemma, "a <start_func> b"), (Phi4, "func tools[1]"),
                       (Harmony, "<|channel|>commentary to=fun")):
        sent, came, reply = streamed(plan_for(fmt), list(looks))
        assert sent == looks and came == [] and reply == tool_calling.Reply(looks), fmt.name


# ---- the form chosen from the template --------------------------------------------------------------


def fixture_templates() -> list[str]:
    return sorted(p.name for p in TEMPLATES.glob("*.jinja"))


@pytest.mark.parametrize("name", fixture_templates())
def test_the_form_is_chosen_from_each_published_template(name):
    assert name in TEMPLATE_FORMS, f"{name}: say which call form it writes"
    chosen = for_template((TEMPLATES / name).read_text())
    assert type(chosen) is TEMPLATE_FORMS[name], (name, chosen)


def test_the_form_is_chosen_by_the_templates_markers():
    assert isinstance(for_template(None), Generic)
    assert isinstance(for_template("{% for m in messages %}{{ m.content }}{% endfor %}"), Generic)
    cases = {"<tool_call>": Hermes, "<tool_call><function=": QwenXML, "<|python_tag|>": Llama3,
             "<|start_header_id|>": Llama3, "[TOOL_CALLS]": Mistral, "<|channel|>to=functions.": Harmony,
             "<start_function_call>": Gemma, "<|tool_call>": Gemma4, "<|start_of_role|><|tool_call|>": Granite,
             "<|tool_call|><|/tool_call|>": Phi4, "<|tool|>": Phi4}
    for markers, fmt in cases.items():
        assert type(for_template("{% if tools %}" + markers + "{% endif %}")) is fmt, markers


# ---- the history, as each template takes it ----------------------------------------------------------

HISTORY = [
    {"role": "system", "content": "You control the home."},
    {"role": "user", "content": "Kitchen light on."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "intent__HassTurnOn", "arguments": {"name": "kitchen light"}}}]},
    {"role": "tool", "content": '{"data": {"success": [{"name": "kitchen light"}]}, "error": null}'},
    {"role": "assistant", "content": "Done."},
]


def test_mistral_history_gets_ids_its_template_takes_the_same_every_turn():
    plan = plan_for(Mistral, "{{ tool_calls }}[TOOL_CALLS][ARGS]")
    first, again = plan.messages(HISTORY), plan.messages(HISTORY)
    ident = first[2]["tool_calls"][0]["id"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", ident) and first[3]["tool_call_id"] == ident
    assert again == first
    kept = [*HISTORY[:2], {**HISTORY[2], "tool_calls": [{**HISTORY[2]["tool_calls"][0], "id": "a1B2c3D4e"}]},
            {**HISTORY[3], "tool_call_id": "a1B2c3D4e"}]
    assert plan.messages(kept)[2]["tool_calls"][0]["id"] == "a1B2c3D4e"


def test_a_template_that_shows_only_text_gets_the_calls_written_as_the_model_writes_them():
    granite = plan_for(Granite, (TEMPLATES / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text())
    out = granite.messages(HISTORY)
    assert out[2] == {"role": "assistant", "content": '<|tool_call|>[{"name": "intent__HassTurnOn", '
                                                      '"arguments": {"name": "kitchen light"}}]'}
    assert all(isinstance(m["content"], str) for m in out)
    assert plan_for(Hermes, "{{ message.tool_calls }}<tool_call>").messages(HISTORY) == \
        [{**m, "content": m["content"] or ""} for m in HISTORY]


def test_phi4s_own_template_gets_the_tools_in_the_system_message():
    source = "{% if message['role'] == 'system' and 'tools' in message %}{{ message['tools'] }}<|tool|>{% endif %}"
    out = plan_for(Phi4, source).messages(HISTORY)
    assert '"name": "intent__HassTurnOn"' in out[0]["tools"] and out[0]["content"] == "You control the home."


def test_every_form_writes_a_call_it_reads_back():
    calls = [{"id": None, "name": name, "arguments": args} for name, args in (REPLIES["qwen3-coder"].calls)]
    for fmt in (Hermes, QwenXML, Llama3, Mistral, Granite, Phi4, Gemma, Gemma4, Harmony):
        for source in (None, "[ARGS]") if fmt is Mistral else (None,):
            plan = plan_for(fmt, source)
            written = plan.format.write(calls)
            assert pairs(plan.parse(written).calls) == [(c["name"], c["arguments"]) for c in calls], (fmt, written)


def test_mistrals_grammar_holds_the_form_its_template_writes():
    assert "[ARGS]" in plan_for(Mistral, "[ARGS]").grammar().text
    assert "[ARGS]" not in plan_for(Mistral).grammar().text


def test_functiongemma_ends_its_reply_at_the_end_of_its_call():
    assert plan_for(Gemma).stops == ("<end_function_call>",) and plan_for(Hermes).stops == ()
    # the form's stop joins the request's own (the sampler's params, as `Service.chat` makes them),
    # past the request's MAX_STOPS, which count what a client sent
    asked = sampling.SamplingAsk(stop=[f"s{i}" for i in range(sampling.MAX_STOPS)])
    params = sampling.params(asked, chat.POLICY, None, plan_for(Gemma).stops)
    assert params.stop == (*asked.stop, "<end_function_call>")
    assert sampling.params(asked, chat.POLICY, None, plan_for(Hermes).stops).stop == tuple(asked.stop)


HA_HISTORY = [  # Home Assistant's tool loop: a call (`content: null`, as OpenAI clients send it), its
    # `{data, error}` result, the answer, the next ask
    {"role": "system", "content": "You control the home."},
    {"role": "user", "content": "Kitchen light on."},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_8f2a", "type": "function", "function": {
        "name": "intent__HassTurnOn", "arguments": {"name": "kitchen light"}}}]},
    {"role": "tool", "tool_call_id": "call_8f2a", "content": '{"data": {"success": [{"name": "kitchen light"}]}, '
                                                             '"error": null}'},
    {"role": "assistant", "content": "Done."},
    {"role": "user", "content": "And dim it."},
]


@pytest.mark.parametrize("name", fixture_templates())
def test_each_published_template_renders_the_history_as_its_form_gives_it(name):
    """The call, its result and the tools (named with `__`) reach the prompt: Mistral's with ids its
    template takes, Granite 3's with the call written as the model writes it."""
    from homeai.engine.template import ChatTemplate

    source = (TEMPLATES / name).read_text()
    plan = plan_for(type(for_template(source)), source)
    prompt = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(plan.messages(HA_HISTORY),
                                                                           plan.template_tools())
    assert prompt.count("intent__HassTurnOn") >= (2 if plan.format.tools_in_template else 1), prompt
    assert "kitchen light" in prompt and "success" in prompt and "And dim it." in prompt
    assert "homeassistant__GetLiveContext" in prompt
