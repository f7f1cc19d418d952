"""Recorded replies in each family's own call form, written from the family's documented form (the
model cards, the chat templates under tests/engine/templates/ and llama.cpp's common/chat.cpp
parsers), with Home Assistant's tools: names with `__`, arguments of each JSON type.

Each `Recorded` says what the reply is: its text without the calls and the calls.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from homeai import tools as tool_calling
from homeai.llama import CONVERTER
from homeai.tools.formats import (CallFormat, Gemma, Gemma4, Generic, Granite, Harmony, Hermes, Llama3, Mistral, Phi4,
                                  QwenXML)

TURN_ON = {"type": "object", "properties": {
    "name": {"type": "string"}, "area": {"type": "string"},
    "domain": {"type": "array", "items": {"type": "string"}}}}
LIGHT_SET = {"type": "object", "properties": {
    "name": {"type": "string"}, "brightness": {"type": "integer", "minimum": 0, "maximum": 100},
    "color": {"enum": ["red", "warm white", "blue"]}}, "required": ["brightness"]}
CLIMATE = {"type": "object", "properties": {
    "temperature": {"type": "number"}, "away": {"type": "boolean"},
    "schedule": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}}}},
    "required": ["temperature"]}
TOOLS = [
    {"type": "function", "function": {"name": "intent__HassTurnOn", "description": "Turns on a device",
                                      "parameters": TURN_ON}},
    {"type": "function", "function": {"name": "intent__HassLightSet", "description": "Sets a light",
                                      "parameters": LIGHT_SET}},
    {"type": "function", "function": {"name": "homeassistant__GetLiveContext",
                                      "description": "The home's state now"}},
    {"type": "function", "function": {"name": "climate__SetTemperature", "description": "Sets the heating",
                                      "parameters": CLIMATE}},
]

KITCHEN = ("intent__HassTurnOn", {"name": "kitchen light"})
DIM = ("intent__HassLightSet", {"name": "kitchen light", "brightness": 40})
CONTEXT = ("homeassistant__GetLiveContext", {})
WARM = ("climate__SetTemperature", {"temperature": 20.5, "away": False, "schedule": {"from": "07:00", "to": "22:00"}})


@dataclass(frozen=True)
class Recorded:
    fmt: type[CallFormat]
    text: str
    content: str | None  # the reply's text around its calls (None: only calls)
    calls: tuple[tuple[str, dict], ...]
    ids: tuple[str | None, ...] = ()  # the ids the model wrote, where it writes them
    source: str | None = None  # a template source that picks the form's variant


def plan_for(fmt: type[CallFormat], source: str | None = None, choice=None, parallel: bool = True):
    return replace(tool_calling.plan(TOOLS, choice, parallel, template_source=None, converter=CONVERTER),
                   format=fmt(source))


REPLIES = {
    "hermes": Recorded(Hermes, (
        "I'll turn on the kitchen light and dim it.\n<tool_call>\n"
        '{"name": "intent__HassTurnOn", "arguments": {"name": "kitchen light"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "intent__HassLightSet", "arguments": {"name": "kitchen light", "brightness": 40}}\n</tool_call>'),
        "I'll turn on the kitchen light and dim it.", (KITCHEN, DIM)),
    "qwen3-coder": Recorded(QwenXML, (
        "<tool_call>\n<function=intent__HassLightSet>\n<parameter=name>\nkitchen light\n</parameter>\n"
        "<parameter=brightness>\n40\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
        "<function=climate__SetTemperature>\n<parameter=temperature>\n20.5\n</parameter>\n<parameter=away>\n"
        'false\n</parameter>\n<parameter=schedule>\n{"from": "07:00", "to": "22:00"}\n</parameter>\n'
        "</function>\n</tool_call>"),
        None, (DIM, WARM)),
    "llama3-json": Recorded(Llama3, '{"name": "intent__HassTurnOn", "parameters": {"name": "kitchen light"}}',
                            None, (KITCHEN,)),
    "llama3.2-python-tag": Recorded(Llama3, (
        '<|python_tag|>{"name": "intent__HassLightSet", "parameters": {"name": "kitchen light", "brightness": 40}}; '
        '{"name": "homeassistant__GetLiveContext", "parameters": {}}'), None, (DIM, CONTEXT)),
    "mistral-list": Recorded(Mistral, (
        '[TOOL_CALLS][{"name": "intent__HassTurnOn", "arguments": {"name": "kitchen light"}, "id": "a1B2c3D4e"}, '
        '{"name": "intent__HassLightSet", "arguments": {"name": "kitchen light", "brightness": 40}, '
        '"id": "Z9y8X7w6v"}]'), None, (KITCHEN, DIM), ("a1B2c3D4e", "Z9y8X7w6v")),
    "mistral-named": Recorded(Mistral, (
        '[TOOL_CALLS]intent__HassTurnOn[ARGS]{"name": "kitchen light"}'
        '[TOOL_CALLS]intent__HassLightSet[CALL_ID]Z9y8X7w6v[ARGS]{"name": "kitchen light", "brightness": 40}'),
        None, (KITCHEN, DIM), (None, "Z9y8X7w6v"), source="{% if tools %}[TOOL_CALLS]{{ n }}[ARGS]{% endif %}"),
    "harmony": Recorded(Harmony, (
        '<|channel|>commentary to=functions.intent__HassLightSet <|constrain|>json<|message|>'
        '{"name": "kitchen light", "brightness": 40}'), None, (DIM,)),
    "harmony-recipient-first": Recorded(Harmony, (
        "<|start|>assistant to=functions.homeassistant__GetLiveContext<|channel|>commentary json<|message|>{}"),
        None, (CONTEXT,)),
    "functiongemma": Recorded(Gemma, (
        "<start_function_call>call:intent__HassLightSet{brightness:40,name:<escape>kitchen light<escape>}"
        "<end_function_call><start_function_call>call:climate__SetTemperature{away:false,schedule:{from:<escape>"
        "07:00<escape>,to:<escape>22:00<escape>},temperature:20.5}<end_function_call>"), None, (DIM, WARM)),
    "gemma4": Recorded(Gemma4, (
        'Turning it on.<|tool_call>call:intent__HassTurnOn{domain:[<|"|>light<|"|>],name:<|"|>kitchen light<|"|>}'
        "<tool_call|>"), "Turning it on.", (("intent__HassTurnOn", {"name": "kitchen light", "domain": ["light"]}),)),
    "granite": Recorded(Granite, (
        '<|tool_call|>[{"name": "intent__HassTurnOn", "arguments": {"name": "kitchen light"}}, '
        '{"name": "homeassistant__GetLiveContext", "arguments": {}}]'), None, (KITCHEN, CONTEXT)),
    "phi4": Recorded(Phi4, (
        '<|tool_call|>{"name": "intent__HassTurnOn", "arguments": {"name": "kitchen light"}}<|/tool_call|>'
        '<|tool_call|>{"name": "intent__HassLightSet", "arguments": {"name": "kitchen light", "brightness": 40}}'
        "<|/tool_call|>"), None, (KITCHEN, DIM)),
    "phi4-functools": Recorded(Phi4, (
        'Sure.\nfunctools[{"name": "homeassistant__GetLiveContext", "arguments": {}}]'), "Sure.", (CONTEXT,)),
    "generic": Recorded(Generic, (
        '{"tool_calls": [{"name": "intent__HassTurnOn", "arguments": {"name": "kitchen light"}}, '
        '{"name": "homeassistant__GetLiveContext", "arguments": {}}]}'), None, (KITCHEN, CONTEXT)),
}

# The same replies with their first call broken (a name no tool has, arguments that do not parse or
# break the schema): each is text, whole or streamed.
MALFORMED = {
    "hermes": '<tool_call>\n{"name": "intent__HassTurnOn", "arguments": {"name": }}\n</tool_call>',
    "qwen3-coder": ("<tool_call>\n<function=intent__HassLightSet>\n<parameter=brightness>\nbright\n</parameter>\n"
                    "</function>\n</tool_call>"),
    "llama3-json": '{"name": "intent__HassTurnOff", "parameters": {"name": "kitchen light"}}',
    "llama3.2-python-tag": '<|python_tag|>{"name": "intent__HassLightSet", "parameters": {"brightness": "high"}}',
    "mistral-list": '[TOOL_CALLS][{"name": "intent__HassTurnOn", "arguments": {"name": "kitchen light"}',
    "mistral-named": '[TOOL_CALLS]intent__HassTurnOn{"name": "kitchen light"}',
    "harmony": "<|channel|>commentary to=functions.intent__HassLightSet <|constrain|>json<|message|>{brightness: 40}",
    "harmony-recipient-first": "<|start|>assistant to=functions.lights__Off<|channel|>commentary json<|message|>{}",
    "functiongemma": "<start_function_call>call:intent__HassLightSet{brightness:<escape>40<escape>}<end_function_call>",
    "gemma4": '<|tool_call>call:intent__HassTurnOn{name:<|"|>kitchen light}<tool_call|>',
    "granite": '<|tool_call|>{"name": "intent__HassTurnOn", "arguments": {"name": ["kitchen light"]}}',
    "phi4": '<|tool_call|>{"name": "intent__HassTurnOn" "arguments": {}}<|/tool_call|>',
    "phi4-functools": "Sure.\nfunctools[intent__HassTurnOn(name='kitchen light')]",
    "generic": '{"tool_calls": [{"name": "intent__HassTurnOn", "arguments": {"name": 3}}]}',
}
