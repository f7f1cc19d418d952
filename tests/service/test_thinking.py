"""Thinking without a model: each family's form read from its published template (tests/engine/templates),
the prompt rendered with thinking on and off, and replies as the families write them split into
thoughts and content, the same however a stream cuts them.

Run: .venv/bin/python -m pytest -q tests/service/test_thinking.py
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from homeai.engine.prompt import ChatPrompt, Part, Source
from homeai.engine.template import ChatTemplate
from homeai.service import speaking, thinking, thoughts
from homeai.service.asks import ThinkAsk

TEMPLATES = Path(__file__).parents[1] / "engine" / "templates"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "templates"
HI = [{"role": "user", "content": "What is the capital of France?"}]

# Replies as each family writes them (the markup as the runner renders it: `markup.REPLY`).
QWEN3 = ("<think>\nOkay, the user asks for the capital of France. That is Paris.\n</think>\n\n"
         "The capital of France is Paris.", "Okay, the user asks for the capital of France. That is Paris.",
         "The capital of France is Paris.")
R1 = ("Okay, so the question is about France.\nIts capital is Paris.\n</think>\n\nParis.",
      "Okay, so the question is about France.\nIts capital is Paris.", "Paris.")
MAGISTRAL = ("[THINK]The user wants 2+2. That is 4.[/THINK]2 + 2 = 4.", "The user wants 2+2. That is 4.", "2 + 2 = 4.")
GRANITE = ("<think>Paris is the capital.</think><response>It is Paris.</response>", "Paris is the capital.",
           "It is Paris.")
HARMONY_FINAL = ("<|channel|>analysis<|message|>User asks capital of France. Answer: Paris.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>The capital of France is **Paris**.",
                 "User asks capital of France. Answer: Paris.", "The capital of France is **Paris**.")
CALL = '<|channel|>commentary to=functions.intent__HassTurnOn <|constrain|>json<|message|>{"name":"kitchen light"}'
HARMONY_CALL = ("<|channel|>analysis<|message|>Need to turn on the kitchen light; use HassTurnOn.<|end|>"
                "<|start|>assistant" + CALL, "Need to turn on the kitchen light; use HassTurnOn.", CALL)
CALL_B = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}'
HARMONY_CALL_B = ("<|channel|>analysis<|message|>Weather: call the tool.<|end|>" + CALL_B,
                  "Weather: call the tool.", CALL_B)
HARMONY_PREAMBLE = ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary<|message|>"
                    "Checking now.<|end|>" + CALL_B, "Think.", "Checking now." + CALL_B)


def pieces(text: str, seed: int) -> list[str]:
    """`text` cut at random points (one character to a dozen at a time), as a stream may deliver it."""
    rng = random.Random(seed)
    out, at = [], 0
    while at < len(text):
        n = rng.randint(1, 12)
        out.append(text[at:at + n])
        at += n
    return out


def split(splitter: thoughts.Splitter, parts: list[str]) -> tuple[str, str]:
    thought, content = [], []
    for part in parts:
        t, c = splitter.feed(part)
        thought.append(t)
        content.append(c)
    t, c = splitter.finish()
    return "".join(thought) + t, "".join(content) + c


@pytest.mark.parametrize("make, case", [
    (lambda: thoughts.TagSplitter("<think>", "</think>"), QWEN3),
    (lambda: thoughts.TagSplitter("<think>", "</think>", thinking=True), R1),
    (lambda: thoughts.TagSplitter("[THINK]", "[/THINK]"), MAGISTRAL),
    (lambda: thoughts.TagSplitter("<think>", "</think>", answer_tags=("<response>", "</response>")), GRANITE),
    (thoughts.HarmonySplitter, HARMONY_FINAL),
    (thoughts.HarmonySplitter, HARMONY_CALL),
    (thoughts.HarmonySplitter, HARMONY_CALL_B),
    (thoughts.HarmonySplitter, HARMONY_PREAMBLE),
], ids=["qwen3", "r1-distill", "magistral", "granite", "harmony-final", "harmony-call", "harmony-call-header",
        "harmony-preamble"])
def test_a_reply_splits_the_same_however_it_is_cut(make, case):
    text, thought, content = case
    assert split(make(), [text]) == (thought, content)
    assert split(make(), list(text)) == (thought, content)  # a character at a time
    for seed in range(40):
        assert split(make(), pieces(text, seed)) == (thought, content), seed


def test_thoughts_are_taken_only_where_the_reply_starts():
    said = "Tags like <think> are how models mark thoughts."
    assert split(thoughts.TagSplitter("<think>", "</think>"), pieces(said, 1)) == ("", said)
    # a reply that stops mid-thought (its length reached) is all thought
    cut_short = ["<think>\nHmm, let me", " see  "]
    assert split(thoughts.TagSplitter("<think>", "</think>"), cut_short) == ("Hmm, let me see", "")
    # the prompt opened the thought and the model wrote the tag again
    assert split(thoughts.TagSplitter("<think>", "</think>", thinking=True), ["<think>\nA.</think>B"]) == ("A.", "B")


def test_a_harmony_reply_without_headers_is_content():
    assert split(thoughts.HarmonySplitter(), pieces("Just an answer.", 3)) == ("", "Just an answer.")
    long = "x" * 400 + "<|message|>y"
    assert split(thoughts.HarmonySplitter(), pieces(long, 5)) == ("", long)


def test_a_harmony_call_closed_with_end_keeps_its_end_for_the_tool_parser():
    text = CALL + "<|end|><|start|>assistant<|channel|>final<|message|>Done."
    for seed in range(10):
        assert split(thoughts.HarmonySplitter(), pieces(text, seed)) == ("", CALL + "<|end|>Done.")


def test_spoken_text_leaves_a_thought_out():
    assert thinking.spoken("<think>secret plan</think>\n\nThe lights are on.") == "The lights are on."
    assert thinking.spoken("The lights are on.") == "The lights are on."

    async def said(parts: list[str]) -> list[str]:  # speech out of text arriving in pieces (Wyoming's chunks)
        async def arriving():
            for part in parts:
                yield part
        return [sentence async for sentence in speaking._cut(arriving())]

    sentences = asyncio.run(said(["<thi", "nk>The plan: say hi.</th", "ink>\n\nHello there, everyone", ". Bye."]))
    assert "plan" not in " ".join(sentences) and "".join(sentences).replace(" ", "") == "Hellothere,everyone.Bye."


# ---- the forms, from the published templates --------------------------------------------


def template(name: str, directory: Path = TEMPLATES) -> ChatTemplate:
    return ChatTemplate((directory / name).read_text(), bos_token="<s>", eos_token="</s>")


def test_qwen3_switches_with_enable_thinking_and_closes_the_thought_itself():
    qwen3 = template("Qwen-Qwen3-0.6B.jinja")
    form = thinking.form_of(qwen3)
    assert (form.kind, form.switch, form.history) == ("switch", "enable_thinking", "reasoning_content")
    off = qwen3.render(HI, extra=thinking.variables(form, ThinkAsk(on=False)))
    on = qwen3.render(HI, extra=thinking.variables(form, ThinkAsk(on=True)))
    default = qwen3.render(HI, extra=thinking.variables(form, ThinkAsk()))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n") and default == on
    # chat_template_kwargs decide as llama-server takes them
    assert thinking.on(form, ThinkAsk(on=True, kwargs={"enable_thinking": False})) is False


def test_granite_switches_with_thinking():
    granite = template("ibm-granite-granite-3.3-2B-Instruct.jinja")
    form = thinking.form_of(granite)
    assert (form.kind, form.switch, form.answer_tags) == ("switch", "thinking", ("<response>", "</response>"))
    on = granite.render(HI, extra=thinking.variables(form, ThinkAsk(on=True)))
    off = granite.render(HI, extra=thinking.variables(form, ThinkAsk(on=False)))
    assert "between <think></think>" in on and "<think>" not in off


def test_a_template_that_cannot_think():
    assert not thinking.form_of(template("qwen2.5-instruct.jinja")).can_think
    assert not thinking.form_of(None).can_think


def opened_prompt(text: str) -> ChatPrompt:
    return ChatPrompt((Part("<|im_start|>user\n", Source.TEMPLATE), Part("Hi", Source.MEMBER),
                       Part(text, Source.TEMPLATE)))


def test_a_prompt_that_opens_the_thought_is_closed_when_thinking_is_off():
    opened = template("chatml-think.jinja", FIXTURES)
    form = thinking.form_of(opened)
    assert form.kind == "opened" and form.can_stop
    prompt = opened_prompt("<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert thinking.opens_thought(prompt, form)
    closed = thinking.closed(prompt, form, ThinkAsk(on=False))
    assert closed.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not thinking.opens_thought(closed, form)
    assert thinking.closed(prompt, form, ThinkAsk()) is prompt
    assert thinking.splitter(form, opened=True).state == "opened" and thinking.splitter(form).state == "start"


def test_chat_template_kwargs_are_checked():
    check = lambda kwargs: thinking.check_kwargs(kwargs, max_names=4, max_chars=100)  # noqa: E731
    assert check({"enable_thinking": False}) is None
    assert "own input" in check({"messages": []})
    assert "not a template variable name" in check({"a-b": 1})
    assert "at most 4" in check({f"v{i}": i for i in range(5)})
    assert "over 100" in check({"v": "x" * 200})


@pytest.mark.parametrize("make, alphabet", [
    (lambda: thoughts.TagSplitter("<think>", "</think>"), ["<think>", "</think>", "<", "</th", "a", " ", "\n"]),
    (lambda: thoughts.TagSplitter("<think>", "</think>", thinking=True, answer_tags=("<response>", "</response>")),
     ["<think>", "</think>", "<response>", "</response>", "<re", "b", " "]),
    (thoughts.HarmonySplitter, ["<|start|>assistant", "<|channel|>", "analysis", "final", "commentary",
                                " to=functions.f", "<|message|>", "<|end|>", "<|", "x", " "]),
], ids=["tags", "opened-granite", "harmony"])
def test_any_text_splits_the_same_however_it_is_cut(make, alphabet):
    """Whatever the text (tags, their beginnings, white space in any order), every cut gives what the whole gives."""
    rng = random.Random(50)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        whole = split(make(), [text])
        assert split(make(), list(text)) == whole, text
        assert split(make(), pieces(text, rng.randint(0, 10**6))) == whole, text


def test_gpt_oss_always_thinks_at_the_effort_asked():
    oss = template("openai-gpt-oss-120b.jinja")
    form = thinking.form_of(oss)
    assert (form.kind, form.history, form.can_stop) == ("harmony", "thinking", False)
    for ask, effort in ((ThinkAsk(), "medium"), (ThinkAsk(on=True, effort="high"), "high"),
                        (ThinkAsk(on=False), "low"), (ThinkAsk(on=True, effort="minimal"), "low")):
        rendered = oss.render(HI, extra=thinking.variables(form, ask))
        assert f"Reasoning: {effort}\n" in rendered and rendered.endswith("<|start|>assistant"), ask
    assert isinstance(thinking.splitter(form), thoughts.HarmonySplitter)


CALLED = [{"role": "user", "content": "Turn on the kitchen light."},
          {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
              "name": "intent__HassTurnOn", "arguments": '{"name": "kitchen light"}'}}]},
          {"role": "tool", "tool_call_id": "c1", "name": "intent__HassTurnOn",
           "content": '{"data": {"success": true}}'}]


@pytest.mark.parametrize("name, field, shown", [
    ("openai-gpt-oss-120b.jinja", "reasoning_content",
     "<|channel|>analysis<|message|>I should call HassTurnOn.<|end|>"),
    ("Qwen-Qwen3-0.6B.jinja", "thinking", "<think>\nI should call HassTurnOn.\n</think>"),
])
def test_earlier_thoughts_go_to_a_template_that_reads_them(name, field, shown):
    """Ollama's `thinking` and OpenAI's `reasoning_content` both reach the field the template reads."""
    chat = template(name)
    form = thinking.form_of(chat)
    messages = [CALLED[0], {**CALLED[1], field: "I should call HassTurnOn."}, CALLED[2]]
    assert shown in chat.render(thinking.history(messages, form), extra=thinking.variables(form, ThinkAsk()))


def test_earlier_thoughts_are_dropped_for_a_template_that_does_not_read_them():
    form = thinking.form_of(template("qwen2.5-instruct.jinja"))
    messages = [CALLED[0], {**CALLED[1], "thinking": "secret"}, CALLED[2]]
    assert all("thinking" not in m and "reasoning_content" not in m for m in thinking.history(messages, form))


def test_the_r1_distill_opens_the_thought_when_asked():
    """llama.cpp's copy of the R1 distill template switches with `enable_thinking` (off unless set):
    on, its generation prompt opens `<think>` and the reply starts inside the thought."""
    r1 = template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    form = thinking.form_of(r1)
    assert (form.kind, form.switch, form.history) == ("switch", "enable_thinking", None)
    on = r1.prompt(HI, tokenizer_adds_bos=False, extra=thinking.variables(form, ThinkAsk(on=True)))
    assert on.text.endswith("<｜Assistant｜><think>\n") and thinking.opens_thought(on, form)
    off = r1.prompt(HI, tokenizer_adds_bos=False, extra=thinking.variables(form, ThinkAsk(on=False)))
    assert off.text.endswith("<think>\n</think>") and not thinking.opens_thought(off, form)


def test_magistral_and_smollm3():
    magistral = thinking.form_of(template("unsloth-Magistral-Small-2509.jinja"))
    assert (magistral.kind, magistral.open, magistral.close) == ("tags", "[THINK]", "[/THINK]")
    assert magistral.can_think and not magistral.can_stop
    smollm3 = template("HuggingFaceTB-SmolLM3-3B.jinja")
    form = thinking.form_of(smollm3)
    assert (form.kind, form.switch) == ("switch", "enable_thinking")
    assert "/no_think" in smollm3.render(HI, extra=thinking.variables(form, ThinkAsk(on=False)))
    assert "/think" in smollm3.render(HI, extra=thinking.variables(form, ThinkAsk()))
