"""How a model writes a tool call, one class per family, chosen from its chat template's markers
(`for_template`).

* `generic`: templates that know no tools (SmolLM2, Gemma 3): `{"tool_calls": [...]}` (generic.py).
* `hermes` (Qwen2.5, Qwen3, Granite 4), `llama3` (JSON and `<|python_tag|>`), `granite` (3.x,
  `<|tool_call|>[...]`), `phi4` (`<|tool_call|>{...}<|/tool_call|>`, `functools[...]`) (json_forms.py).
* `mistral`: `[TOOL_CALLS][...]` and `[TOOL_CALLS]NAME[ARGS]{...}`, with 9-character call ids (mistral.py).
* `qwen-xml` (Qwen3-Coder `<function=NAME><parameter=P>`), `gemma` (FunctionGemma) and `gemma4`
  (`call:NAME{key:<escape>value<escape>}`) (keyed.py).
* `harmony`: gpt-oss's calls in the commentary channel (harmony.py).

Each format gives the grammar that holds a call to the tools' schemas (lazy, triggered at the
call's opening, when the model may also answer in text; from the first token when a call is
forced), finds the calls in a reply (whole or as a stream delivers it), and names the literals a
call opens with, so a stream can hold back text that may be one.
"""

from __future__ import annotations

from homeai.tools.formats.base import MAX_CALLS, Block, CallFormat, RawCall, SchemaConverter
from homeai.tools.formats.generic import Generic, generic_messages
from homeai.tools.formats.harmony import Harmony
from homeai.tools.formats.json_forms import Granite, Hermes, Llama3, Phi4
from homeai.tools.formats.keyed import Gemma, Gemma4, QwenXML
from homeai.tools.formats.mistral import Mistral

__all__ = ["FORMATS", "MAX_CALLS", "Block", "CallFormat", "Gemma", "Gemma4", "Generic", "Granite", "Harmony",
           "Hermes", "Llama3", "Mistral", "Phi4", "QwenXML", "RawCall", "SchemaConverter", "for_template",
           "generic_messages"]

FORMATS = (Generic, Hermes, QwenXML, Llama3, Mistral, Granite, Phi4, Gemma, Gemma4, Harmony)

# The markers that tell a template's family, the first that matches deciding (Qwen3-Coder's
# template has `<tool_call>` as Hermes's does, and `<function=` too).
_MARKERS: tuple[tuple[tuple[str, ...], type[CallFormat]], ...] = (
    (("to=functions.", "<|channel|>"), Harmony),
    (("<function=",), QwenXML),
    (("<start_function_call>",), Gemma),
    (("<|tool_call>",), Gemma4),
    (("[TOOL_CALLS]",), Mistral),
    (("<|/tool_call|>", "<|tool|>"), Phi4),
    (("<|tool_call|>",), Granite),
    (("<tool_call>",), Hermes),
    (("<|python_tag|>", "<|start_header_id|>"), Llama3),
)


def for_template(source: str | None) -> CallFormat:
    """The call format a chat template writes (generic when it renders no tools)."""
    if not source or "tools" not in source:
        return Generic(source)
    for markers, fmt in _MARKERS:
        if any(marker in source for marker in markers):
            return fmt(source)
    return Generic(source)
