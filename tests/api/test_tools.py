"""Tool calling and structured output on `/v1/chat/completions` and `/v1/completions`, through the
real `openai` client against a real server over the embedded SmolLM2 (whose template knows no
tools: the generic call format, its replies held to the tools' schemas by a grammar).

Run: .venv/bin/python -m pytest tests/api/test_tools.py
"""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import openai
import pytest

from homeai import tools as tool_calling
from homeai.llama import CONVERTER
from homeai.sched.request import Grammar
from homeai.tools.formats import Generic, Hermes, Llama3, Mistral
from tests.api.conftest import api_config

pytestmark = pytest.mark.model

GREEDY = {"temperature": 0, "seed": 11, "max_tokens": 96}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
LIGHT = {"type": "object", "properties": {"name": {"type": "string"}, "area": {"type": "string"},
                                          "domain": {"enum": ["light", "switch"]}}, "required": ["name", "domain"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "turn_on", "description": "Turn a device on", "parameters": LIGHT}}]
ASK = [{"role": "user", "content": "What is the weather in Paris? Use celsius."}]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    # Without the prompt cache a repeated request is read the same way each time, so greedy runs
    # compared here (whole and streamed, with and without a stop) take the same numeric path: a
    # prompt read after a cached prefix differs in the last bits of its logits.
    return api_config(module_tmp, scheduler={"prompt_cache": False})


def schema_of(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def check_calls(message) -> list:
    """The message's calls, each naming a tool and with arguments that validate against its schema."""
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))
    return message.tool_calls


# ---- forced calls -------------------------------------------------------------------------------


def test_required_forces_a_call_that_fits_the_schema(client):
    reply = client.chat.completions.create(model="homeai", messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    check_calls(choice.message)


def test_a_named_choice_forces_that_tool(client):
    reply = client.chat.completions.create(
        model="homeai", messages=[{"role": "user", "content": "Turn on the kitchen light."}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "turn_on"}}, **GREEDY)
    calls = check_calls(reply.choices[0].message)
    assert {c.function.name for c in calls} == {"turn_on"}


def test_parallel_tool_calls_false_gives_one_call(client):
    reply = client.chat.completions.create(model="homeai", messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, **GREEDY)
    assert len(check_calls(reply.choices[0].message)) == 1


def test_tool_choice_none_answers_in_text(client):
    reply = client.chat.completions.create(model="homeai", messages=ASK, tools=TOOLS, tool_choice="none", **GREEDY)
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.message.content and choice.finish_reason != "tool_calls"


def test_auto_answers_in_text_or_with_valid_calls(client):
    reply = client.chat.completions.create(model="homeai", messages=[{"role": "user", "content": "Tell me a joke."}],
                                           tools=TOOLS, **GREEDY)
    message = reply.choices[0].message
    if message.tool_calls:
        check_calls(message)
    else:
        assert message.content


# ---- the round trip, whole and streamed ------------------------------------------------------------


def round_trip_messages(call) -> list[dict]:
    return [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]


def test_round_trip_call_result_answer(client):
    first = client.chat.completions.create(model="homeai", messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    call = check_calls(first.choices[0].message)[0]
    final = client.chat.completions.create(model="homeai", messages=round_trip_messages(call), tools=TOOLS,
                                           tool_choice="none", **GREEDY)
    assert final.choices[0].message.content and final.choices[0].finish_reason in ("stop", "length")


def test_a_tool_result_without_an_id_is_taken(client):
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "21 degrees and clear"}]
    reply = client.chat.completions.create(model="homeai", messages=messages, tools=TOOLS, **GREEDY)
    assert reply.choices[0].message.content or reply.choices[0].message.tool_calls


def streamed(client, **kwargs) -> tuple[str, dict[int, dict], str]:
    """A streamed reply reassembled: content, calls by index, finish reason."""
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or ():
            call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            if part.id:
                assert call["id"] is None, "the id comes once, in the call's first delta"
                call["id"], call["name"] = part.id, part.function.name
                assert part.type == "function" and part.function.arguments == ""
            elif part.function and part.function.arguments:
                call["arguments"] += part.function.arguments
        reason = chunk.choices[0].finish_reason or reason
    return content, calls, reason


def test_streamed_call_deltas_reassemble_to_the_whole_call(client):
    kwargs = dict(model="homeai", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  **GREEDY)
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    content, calls, reason = streamed(client, **kwargs)
    assert reason == "tool_calls" and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole]


def test_streamed_round_trip(client):
    _, calls, reason = streamed(client, model="homeai", messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    assert reason == "tool_calls"
    call = calls[0]
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "21 degrees and clear"}]
    content, calls, reason = streamed(client, model="homeai", messages=messages, tools=TOOLS, tool_choice="none", **GREEDY)
    assert content and not calls and reason in ("stop", "length")


def test_streamed_text_under_auto_matches_the_whole_text(client):
    kwargs = dict(model="homeai", messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS, **GREEDY)
    whole = client.chat.completions.create(**kwargs).choices[0].message
    content, calls, reason = streamed(client, **kwargs)
    if whole.tool_calls or calls:  # the model chose a call: the same choice, streamed as deltas
        assert reason == "tool_calls" and content == ""
        assert [c["name"] for c in calls.values()] == [c.function.name for c in whole.tool_calls or ()]
    else:
        assert content == whole.content and reason in ("stop", "length")
        assert '{"tool_calls"' not in content


# ---- structured output ---------------------------------------------------------------------------

TEXT = {"type": "string", "maxLength": 40}  # bounded: a greedy small model may otherwise write one string forever
SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": TEXT, "age": {"type": "integer"}},
                   "required": ["name", "age"]}}, "required": ["person"]},
    "enum": {"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "calm"]}}, "required": ["mood"]},
    "array": {"type": "object", "properties": {"items": {"type": "array", "items": TEXT,
                                                         "minItems": 1, "maxItems": 3}}, "required": ["items"]},
    "required": {"type": "object", "properties": {"title": TEXT, "done": {"type": "boolean"},
                                                  "note": TEXT}, "required": ["title", "done"]},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_output_validates(client, name):
    reply = client.chat.completions.create(
        model="homeai", messages=[{"role": "user", "content": "Describe a family member's day as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}},
        temperature=0, max_tokens=160)
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMAS[name])


def test_json_object_output_is_an_object(client):
    # A free-form object has no bound, and this small model can repeat keys until the length cut
    # (llama.cpp is not batch-invariant, so whether greedy text runs on depends on its neighbours).
    # Each reply is held to an object; of three asks, the ones that end are whole objects (those that
    # end here take 17-77 tokens, the third runs to any cut: 128 keeps it short).
    ended = []
    for ask in ("A shopping list as JSON.", "A shopping list as JSON, please.", "Today's chores as JSON."):
        reply = client.chat.completions.create(model="homeai", messages=[{"role": "user", "content": ask}],
                                               response_format={"type": "json_object"}, temperature=0, max_tokens=128)
        content = reply.choices[0].message.content
        assert content.lstrip().startswith("{"), content
        if reply.choices[0].finish_reason == "stop":
            ended.append(json.loads(content))
    assert ended and all(isinstance(obj, dict) for obj in ended)


def test_completions_take_response_format(client):
    reply = client.completions.create(model="homeai", prompt="The family's pets:", temperature=0, max_tokens=160,
                                      extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                          "name": "pets", "schema": SCHEMAS["array"]}}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].text), SCHEMAS["array"])


# ---- bad input ---------------------------------------------------------------------------------


def refused(client, **kwargs) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="homeai", max_tokens=8, **kwargs)
    return caught.value


@pytest.mark.parametrize("tools,choice,param", [
    ([{"type": "function", "function": {"description": "no name"}}], None, "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "x", "parameters": {"type": "object", "properties": {"a": {"type": 3}}}}}],
     None, "tools.0.function.parameters"),
    ([{"type": "function", "function": {"name": "x", "parameters": {"type": "object", "properties": {
        "a": {"not": {"type": "string"}}}}}}], None, "tools.0.function.parameters"),
    (TOOLS, {"type": "function", "function": {"name": "unknown"}}, "tool_choice"),
    (TOOLS, "sometimes", "tool_choice"),
])
def test_bad_tools_are_400_naming_the_field(client, tools, choice, param):
    kwargs = {"tool_choice": choice} if choice is not None else {}
    error = refused(client, messages=ASK, tools=tools, **kwargs)
    assert error.body["param"] == param, error.body
    assert error.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("response_format,param", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}, "response_format.json_schema.name"),
    ({"type": "xml"}, "response_format.type"),
])
def test_bad_response_formats_are_400_naming_the_field(client, response_format, param):
    error = refused(client, messages=ASK, response_format=response_format)
    assert error.body["param"] == param, error.body


def test_empty_tools_are_no_tools(client):
    reply = client.chat.completions.create(model="homeai", messages=ASK, tools=[], **GREEDY)
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None


# ---- the call formats, without a server -------------------------------------------------------

NATIVE_REPLIES = {
    Hermes: 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
            '</tool_call>',
    Llama3: '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
    Mistral: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
    Generic: '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]}',
}


def plan_in(fmt, choice=None, parallel=True) -> tool_calling.ToolPlan:
    return replace(tool_calling.plan(TOOLS, choice, parallel, template_source=None, converter=CONVERTER), format=fmt())


@pytest.mark.parametrize("fmt", sorted(NATIVE_REPLIES, key=lambda f: f.name), ids=lambda f: f.name)
def test_each_format_parses_its_calls_and_streams_them_whole(fmt):
    plan, text = plan_in(fmt), NATIVE_REPLIES[fmt]
    reply = plan.parse(text)
    assert [(c.name, c.arguments) for c in reply.calls] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    stream = plan.stream()
    sent = "".join(stream.feed(text[i:i + 3]) for i in range(0, len(text), 3))
    rest, streamed = stream.finish()
    assert "get_weather" not in sent + rest and [c.name for c in streamed.calls] == ["get_weather"]


PARIS = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
LAMP = '{"name": "turn_on", "arguments": {"name": "lamp", "domain": "light"}}'
TWO_CALLS = {  # Llama 3 writes one call a reply
    Hermes: f"Checking.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{LAMP}\n</tool_call>",
    Mistral: f"[TOOL_CALLS][{PARIS}, {LAMP}]",
    Generic: f'{{"tool_calls": [{PARIS}, {LAMP}]}}',
    Llama3: PARIS.replace("arguments", "parameters"),
}


@pytest.mark.parametrize("fmt", sorted(TWO_CALLS, key=lambda f: f.name), ids=lambda f: f.name)
def test_each_call_is_sent_as_soon_as_it_is_written_whole(fmt):
    text, stream = TWO_CALLS[fmt], plan_in(fmt).stream()
    came = []  # (characters fed, call)
    for end in range(1, len(text) + 1):
        stream.feed(text[end - 1])
        came += [(end, call) for call in stream.new_calls()]
    rest, reply = stream.finish()
    names = ["get_weather"] if fmt is Llama3 else ["get_weather", "turn_on"]
    assert [c.name for _, c in came] == names and rest == ""
    assert reply.calls == tuple(c for _, c in came)  # the end adds none, and keeps the ids sent
    first_end = text.index("celsius") + len('celsius"}}')
    assert came[0][0] == first_end  # the first call, the moment its object closes


def test_a_call_cut_short_after_one_was_sent_is_dropped():
    stream = plan_in(Generic).stream()
    assert stream.feed(f'{{"tool_calls": [{PARIS}, {{"name": "turn_on", "argu') == ""
    sent = stream.new_calls()
    assert [c.name for c in sent] == ["get_weather"]
    assert stream.finish() == ("", tool_calling.Reply(None, tuple(sent)))


def test_a_reply_cut_short_in_a_later_call_keeps_the_calls_written_whole():
    """The length limit mid-way through a second call: the first is still a call, streamed or
    not (a voice turn used to speak the JSON)."""
    cut = f'{{"tool_calls": [{PARIS}, {{"name": "turn_on", "argu'
    parsed = plan_in(Generic).parse(cut)
    assert parsed.content is None and [c.name for c in parsed.calls] == ["get_weather"]
    stream = plan_in(Generic).stream()
    stream.feed(cut)  # nothing asked for the calls as they came (the voice socket sends them at the end)
    rest, reply = stream.finish()
    assert rest == "" and [c.name for c in reply.calls] == ["get_weather"]


def test_without_parallel_calls_only_the_first_is_sent():
    plan = replace(tool_calling.plan(TOOLS, None, False, template_source=None, converter=CONVERTER), format=Generic())
    stream = plan.stream()
    stream.feed(TWO_CALLS[Generic])
    assert [c.name for c in stream.new_calls()] == ["get_weather"] and stream.new_calls() == []


def test_a_whole_call_that_breaks_its_schema_is_not_sent():
    stream = plan_in(Generic).stream()
    stream.feed(TWO_CALLS[Generic].replace('"celsius"', '"kelvin"'))
    assert stream.new_calls() == []
    assert stream.finish()[1].calls == ()  # and the reply is text, as a whole reply that breaks it is


@pytest.mark.parametrize("fmt", sorted(NATIVE_REPLIES, key=lambda f: f.name), ids=lambda f: f.name)
def test_a_call_that_breaks_its_schema_is_text(fmt):
    text = NATIVE_REPLIES[fmt].replace('"celsius"', '"kelvin"')
    assert plan_in(fmt).parse(text) == tool_calling.Reply(text)


def test_text_that_only_looks_like_a_call_opening_is_sent_in_the_end():
    stream = plan_in(Hermes).stream()
    assert stream.feed("a <tool") == "a "
    assert stream.feed("box> b") == "<toolbox> b"
    assert stream.finish() == ("", tool_calling.Reply("a <toolbox> b"))


def test_format_from_the_template():
    assert isinstance(tool_calling.for_template(None), Generic)
    assert isinstance(tool_calling.for_template("{% for m in messages %}{{ m.content }}{% endfor %}"), Generic)
    assert isinstance(tool_calling.for_template("{% if tools %}<tool_call>{% endif %}"), Hermes)
    assert isinstance(tool_calling.for_template("{% if tools %}[TOOL_CALLS]{% endif %}"), Mistral)
    assert isinstance(tool_calling.for_template("<|start_header_id|>{% if tools %}{% endif %}"), Llama3)


@pytest.mark.parametrize("choice", [None, "required", {"type": "function", "function": {"name": "turn_on"}}])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("fmt", sorted(NATIVE_REPLIES, key=lambda f: f.name), ids=lambda f: f.name)
def test_every_formats_grammar_parses_in_llama_cpp(runner, fmt, choice, parallel):
    grammar = plan_in(fmt, choice, parallel).grammar()
    assert grammar.lazy == (choice is None)
    assert runner.grammar_ok(grammar)


def test_an_unparsable_grammar_is_refused_at_submit(make_engine):
    from homeai.engine.engine import InvalidRequest
    from homeai.sched.request import SamplingParams

    engine = make_engine()
    with pytest.raises(InvalidRequest) as refused:
        engine.submit("hello", params=SamplingParams(grammar=Grammar("root ::= undefined-rule", param="format")))
    assert refused.value.param == "format"


def test_a_tool_grammar_is_triggered_where_llama_cpp_starts_it():
    """The engine marks an output held (read whole: it decodes at the machine's speed, not reading
    pace) from the token that starts its grammar, found as llama.cpp finds it."""
    generic, hermes = plan_in(Generic).grammar(), plan_in(Hermes).grammar()
    assert generic.triggered('{"tool', 7) and generic.triggered(" {", 7)
    assert not generic.triggered("Here is an example: {", 7) and not generic.triggered("{}", 7)
    assert hermes.triggered("Checking.\n<tool_call>", 7) and not hermes.triggered("Checking.", 7)
    assert Grammar("root ::= x", trigger_tokens=(7,)).triggered("", 7)


def test_an_output_held_to_a_grammar_from_its_start_is_held_from_its_start(make_engine):
    from homeai.sched.request import SamplingParams

    engine = make_engine()
    held = engine.submit("Yes or no?", params=SamplingParams(max_tokens=4, grammar=Grammar('root ::= "yes" | "no"')))
    free = engine.submit("Yes or no?", params=SamplingParams(max_tokens=4))
    assert held.request.held and not free.request.held
    for stream in (held, free):
        list(stream)
    assert held.finished.reason == "stop"


def test_a_trigger_for_tool_names_with_dashes_parses_in_llama_cpp(runner):
    named = [{"type": "function", "function": {"name": "light-on_2", "parameters": LIGHT}}]
    for fmt in NATIVE_REPLIES:
        plan = replace(tool_calling.plan(named, None, template_source=None, converter=CONVERTER), format=fmt())
        assert runner.grammar_ok(plan.grammar())
