"""Tool calling and structured output, for every lane: the request's tools validated (`spec`), the
call format its model's chat template writes (`formats`, a module per kind of form), one
request's plan from prompt to parsed calls (`plan`), and replies held to JSON or a schema (`structured`).
The grammars go to the runner as `SamplingParams.grammar`, once `checked_grammar` has bounded
them (`bounds`) and had the runner's grammar checker build them. Nothing here imports llama.cpp:
its JSON-schema converter is handed in as a value (`SchemaConverter`, the runner's
`schema_converter`) to `plan` and to the structured-output grammars.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from homeai.config import GrammarConfig
from homeai.sched.request import Grammar

from homeai.tools.formats import CallFormat, SchemaConverter, for_template, generic_messages
from homeai.tools.plan import CallStream, Reply, ToolCall, ToolPlan
from homeai.tools.spec import ToolError, tool_set
from homeai.tools.structured import ollama_format_grammar, response_format_grammar

__all__ = ["CallFormat", "CallStream", "Reply", "SchemaConverter", "ToolCall", "ToolError", "ToolPlan",
           "checked_grammar", "for_template", "generic_messages", "ollama_format_grammar", "plan", "response_format_grammar"]

log = logging.getLogger("homeai.tools")


def plan(tools: list | None, tool_choice: Any = None, parallel_tool_calls: bool = True, *,
         template_source: str | None, converter: SchemaConverter) -> ToolPlan | None:
    """The tool plan of a request (None when it offers no tools, or `tool_choice` is "none"),
    in the call format of the model's template, its grammar built by `converter`. Raises ToolError
    for bad input."""
    chosen = tool_set(tools, tool_choice, parallel_tool_calls)
    return ToolPlan(chosen, for_template(template_source), converter) if chosen is not None else None


def checked_grammar(make: Callable[[GrammarConfig], Grammar | None], runner, limits: GrammarConfig,
                    member: str = "") -> Grammar | None:
    """`make(limits)`, the request's grammar within the `[grammar]` limits, once the runner's grammar
    checker has built it within `limits.build_timeout_s` (a blocking call: run it off the event loop),
    in `member`'s turn (the caller's fair-share key: a member's new grammars wait behind each other,
    not in front of another's; the checker's GrammarBusy when `member` has too many waiting).
    Raises ToolError naming the field; a refused grammar is logged in one short line."""
    try:
        grammar = make(limits)
        reason = runner.check_grammar(grammar, limits.build_timeout_s, member) if grammar is not None else None
        if reason:
            raise ToolError(reason, grammar.param)
        return grammar
    except ToolError as e:
        log.info("grammar refused: %.300s", str(e).replace("\n", " "))
        raise
