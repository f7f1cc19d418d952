"""The reply's markup: control tokens a model writes inside its reply to open a tool call or a
thought, whose text the reply keeps so that its parsers (homeai.tools.formats, homeai.service.thinking)
can see them.

Every other control token (a turn's start or end, BOS) renders as nothing, as llama.cpp renders
control tokens by default: an answer never shows its template's markup. These are llama-server's
"preserved tokens" for the families homeai parses; a control token is kept only when its text is
here and it does not end generation (a token that ends the turn is never text).
"""

from __future__ import annotations

REPLY = frozenset({
    # thinking: Qwen3, DeepSeek-R1 distills, Granite, SmolLM3 (`<think>`), Magistral (`[THINK]`)
    "<think>", "</think>", "[THINK]", "[/THINK]",
    # Hermes / Qwen tool calls, Qwen3-Coder's XML inside them
    "<tool_call>", "</tool_call>",
    # Llama 3.x
    "<|python_tag|>",
    # Mistral: `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` and `[TOOL_CALLS][{...}]`
    "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]",
    # gpt-oss harmony: `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`
    "<|channel|>", "<|message|>", "<|constrain|>", "<|start|>", "<|end|>",
    # Granite 3.x, Phi-4-mini
    "<|tool_call|>", "<|/tool_call|>",
    # Gemma's function calls (FunctionGemma: `<escape>` quotes a string value; Gemma 4: `<|tool_call>`,
    # `<tool_call|>`, and `<|"|>` quoting a string)
    "<start_function_call>", "<end_function_call>", "<escape>", "<|tool_call>", "<tool_call|>", '<|"|>',
})
