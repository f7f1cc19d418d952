"""Tool calling and structured output, for every lane: the request's tools validated
(`spec`), the call format its model's chat template writes (`formats`), one request's plan
from prompt to parsed calls (`plan`), and replies held to JSON or a schema (`structured`).
The grammars go to the runner as `SamplingParams.grammar`; nothing here touches llama.cpp
beyond its schema converter (through the runner).
"""

from __future__ import annotations

from typing import Any

from homeai.tools.formats import CallFormat, for_template, generic_messages
from homeai.tools.plan import CallStream, Reply, ToolCall, ToolPlan
from homeai.tools.spec import ToolError, tool_set
from homeai.tools.structured import ollama_format_grammar, response_format_grammar

__all__ = ["CallFormat", "CallStream", "Reply", "ToolCall", "ToolError", "ToolPlan", "for_template",
           "generic_messages", "ollama_format_grammar", "plan", "response_format_grammar"]


def plan(tools: list | None, tool_choice: Any = None, parallel_tool_calls: bool = True, *,
         template_source: str | None) -> ToolPlan | None:
    """The tool plan of a request (None when it offers no tools, or `tool_choice` is "none"),
    in the call format of the model's template. Raises ToolError for bad input."""
    chosen = tool_set(tools, tool_choice, parallel_tool_calls)
    return ToolPlan(chosen, for_template(template_source)) if chosen is not None else None
