"""The service's answer stream with the real model: a plain answer, a tool call, an answer cut short
by its reader, and one whose step failed, each ending in exactly one Done or Failed.

Run: .venv/bin/python -m pytest -q tests/service/test_answer.py
"""

from __future__ import annotations

import asyncio
import time

import pytest

from homeai.app import Program
from homeai.service import Call, Caller, ChatAsk, Done, Failed, SamplingAsk, Service, ServiceError, Text
from tests.conftest import small_config
from tests.engine.test_fail_fast import Faulty

pytestmark = pytest.mark.model

ADMIN = Caller("household", True, 1, ("voice", "chat", "summaries", "indexing", "embeddings"))
GREEDY = SamplingAsk(max_tokens=12, temperature=0.0)
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture
def serving(runner):
    """`serving(runner_)`: the service of a started program (its engine stopped after the test)."""
    programs = []

    def start(runner_=runner) -> Service:
        program = Program(small_config(), runner=runner_).start()
        programs.append(program)
        return program.service

    yield start
    for program in programs:
        program.stop()


def ask(question: str, **fields) -> ChatAsk:
    return ChatAsk([{"role": "user", "content": question}], **{"lane": "chat", "sampling": GREEDY, **fields})


async def events_of(service: Service, chat: ChatAsk) -> list:
    answer = await service.chat(chat, ADMIN)
    return [event async for event in answer]


def test_a_plain_answer_is_text_then_done(serving):
    service = serving()
    events = asyncio.run(events_of(service, ask("Name a colour.")))
    *texts, done = events
    assert texts and all(isinstance(e, Text) for e in texts) and isinstance(done, Done)
    assert done.reason in ("stop", "length") and done.calls == ()
    assert "".join(e.text for e in texts) == done.content and done.content.strip()
    assert done.usage.completion_tokens == done.stats.output_tokens > 0
    assert done.usage.prompt_tokens > 0


def test_a_tool_call_comes_whole_then_done_says_tool_calls(serving):
    service = serving()
    chat = ask("What is the weather in Paris?", tools=WEATHER, tool_choice="required",
               sampling=SamplingAsk(max_tokens=64, temperature=0.0))
    events = asyncio.run(events_of(service, chat))
    calls = [e for e in events if isinstance(e, Call)]
    assert [c.index for c in calls] == [0] and calls[0].call.name == "get_weather"
    assert isinstance(calls[0].call.arguments.get("city"), str)
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "tool_calls" and done.calls == (calls[0].call,)
    assert not any(isinstance(e, (Done, Failed)) for e in events[:-1])


def test_an_answer_its_reader_cuts_ends_failed_abort_and_frees_the_sequence(serving):
    service = serving()
    endless = SamplingAsk(max_tokens=2000, temperature=0.0, ignore_eos=True)

    async def cut():
        answer = await service.chat(ask("Count to a thousand.", sampling=endless), ADMIN)
        seen = []
        async for event in answer:
            seen.append(event)
            if len(seen) == 3:
                answer.abort()
                answer.abort()  # idempotent
        return answer, seen

    answer, seen = asyncio.run(cut())
    last = seen[-1]
    assert isinstance(last, Failed) and last.reason == "abort" and last.error.status_code == 503
    assert sum(isinstance(e, (Done, Failed)) for e in seen) == 1 and answer.finished
    assert last.error.code == "shutting_down"
    engine = service.engine()
    deadline = time.monotonic() + 30
    while engine.state().lanes["chat"].running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.state().lanes["chat"].running == 0


def test_a_failed_step_ends_the_answer_failed_error_and_whole_raises(serving, runner):
    service = serving(Faulty(runner, fails=lambda n: n == 1))  # its first step raises
    events = asyncio.run(events_of(service, ask("Hello?")))
    assert isinstance(events[-1], Failed) and events[-1].reason == "error"
    assert events[-1].error.status_code == 500 and events[-1].error.code == "generation_failed"
    assert "injected fault" in events[-1].error.message

    async def whole():  # the engine serves on: the next answer is whole
        return await (await service.chat(ask("Hello?"), ADMIN)).whole()

    result = asyncio.run(whole())
    assert result.reason in ("stop", "length") and result.usage.completion_tokens > 0


def test_refusals_are_service_errors_before_anything_is_queued(serving):
    service = serving()
    chat_only = Caller("kid", False, 2, ("chat",))
    with pytest.raises(ServiceError) as refused:
        asyncio.run(service.chat(ask("Hi", lane="voice"), chat_only))
    assert (refused.value.status_code, refused.value.code) == (403, "lane_not_allowed")
    with pytest.raises(ServiceError) as unknown:
        asyncio.run(service.chat(ask("Hi", model="gpt-4o-mini-nonexistent"), ADMIN))
    assert (unknown.value.status_code, unknown.value.code) == (404, "model_not_found")
    with pytest.raises(ServiceError) as bad_tools:
        asyncio.run(service.check_tools([{"type": "function", "function": {"name": ""}}], None))
    assert (bad_tools.value.status_code, bad_tools.value.code) == (400, "invalid_tools")


@pytest.fixture(scope="module")
def short_runner():
    """A runner of 1,024 cells a cache: a conversation fitted to it is read in seconds, not the half
    minute 4,000 tokens take on a two-core box (closed after the module: after the engines over it)."""
    from homeai.app import load_runner

    loaded = load_runner(small_config(n_ctx=1024, interactive_n_ctx=1024), embeddings=False, grammar=False)
    yield loaded
    loaded.close()


def test_a_conversation_too_long_is_refused_or_fitted_to_its_latest_turns(serving, short_runner):
    service = serving(short_runner)
    turns = []
    for i in range(120):  # far past the chat lane's context
        turns += [{"role": "user", "content": f"Remember the number {i} and the word lantern {i}."},
                  {"role": "assistant", "content": f"I will remember {i} and lantern {i}."}]
    conversation = [*turns, {"role": "user", "content": "Which was the last number?"}]
    with pytest.raises(ServiceError) as refused:
        asyncio.run(service.chat(ChatAsk(conversation, lane="chat", sampling=GREEDY), ADMIN))
    assert (refused.value.status_code, refused.value.code, refused.value.param) == (
        400, "context_length_exceeded", "messages")

    async def fitted():
        answer = await service.chat(ChatAsk(conversation, lane="chat", sampling=GREEDY, fit="latest",
                                            prompt_param="content"), ADMIN)
        return answer.num_prompt_tokens, await answer.whole()

    num_prompt_tokens, whole = asyncio.run(fitted())
    assert 0 < num_prompt_tokens <= service.engine().max_seq_len_for("chat") - GREEDY.max_tokens
    assert whole.usage.prompt_tokens == num_prompt_tokens and whole.reason in ("stop", "length")
