"""What a request asks of the sampler (`SamplingAsk`), and the one builder that fills its defaults.

Every protocol hands the service the sampling fields it was sent, all optional; `params` turns
them into the engine's `SamplingParams` with homeai's defaults and the answer's length: the
request's, else its lane's cap (`max_tokens` of the lane, where one is set), else none, as Ollama
and llama-server have none: the answer runs to its end of turn or to its cache's room (the engine
ends it there with "length"; `homeai.service.words` ends such a cut between words).
`check_limits` refuses what is over the server's limits (messages, answer length) with the same
400 everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeai.config import ServerConfig
from homeai.sched.request import Grammar, SamplingParams
from homeai.service.errors import ServiceError
from lanes.base import LanePolicy

MAX_STOPS = 16
NO_LIMIT = 1 << 30  # no cap from the request or the lane: the engine ends the answer at its cache's room


@dataclass(frozen=True)
class SamplingAsk:
    max_tokens: int | None = None  # None: the lane's cap, else none
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None  # None: a fresh seed per request
    stop: str | tuple[str, ...] | list[str] | None = None
    logprobs: int | None = None  # None: none; k: the chosen token's logprob and the top k
    n: int = 1  # answers per request: homeai gives one
    ignore_eos: bool = False  # keep going past end-of-generation tokens (tests, benchmarks)
    max_tokens_param: str = "max_tokens"  # the request field `max_tokens` came from, for errors


def check_limits(server: ServerConfig, *, max_tokens: int | None, num_messages: int = 0,
                 max_tokens_param: str = "max_tokens") -> None:
    """Refuse (400) a generation request over the server's message count or answer length."""
    if num_messages > server.max_messages:
        raise ServiceError(400, f"{num_messages} messages, more than the {server.max_messages} this server takes "
                           "(server.max_messages)", code="too_many_messages", param="messages")
    if max_tokens is not None and max_tokens > server.max_output_tokens:
        raise ServiceError(400, f"{max_tokens_param} is {max_tokens}, more than the {server.max_output_tokens} "
                           "this server allows (server.max_output_tokens)", code="max_tokens_too_large",
                           param=max_tokens_param)


def defaults() -> SamplingParams:
    """homeai's default sampling, as a request that names none gets it (Ollama's `/api/show` lists it)."""
    return SamplingParams()


def params(ask: SamplingAsk, policy: LanePolicy, grammar: Grammar | None = None,
           form_stops: tuple[str, ...] = ()) -> SamplingParams:
    """The sampler's parameters: what was asked over homeai's defaults and the lane's answer length.
    `form_stops`: a tool-call form's own ends (FunctionGemma's `<end_function_call>`: the tool's
    answer comes next, never the model's), after the request's and not counted in its `MAX_STOPS`."""
    if ask.n != 1:
        raise ServiceError(400, f"only n=1 is supported, got n={ask.n}", code="invalid_value", param="n")
    stops = [ask.stop] if isinstance(ask.stop, str) else list(ask.stop or [])
    if len(stops) > MAX_STOPS:
        raise ServiceError(400, f"at most {MAX_STOPS} stop strings", code="invalid_value", param="stop")
    d = SamplingParams()
    return SamplingParams(
        temperature=_or(ask.temperature, d.temperature), top_p=_or(ask.top_p, d.top_p),
        top_k=_or(ask.top_k, d.top_k), min_p=_or(ask.min_p, d.min_p),
        repeat_penalty=_or(ask.repeat_penalty, d.repeat_penalty), seed=ask.seed,
        max_tokens=ask.max_tokens or policy.max_tokens or NO_LIMIT,
        stop=tuple(s for s in stops if s) + tuple(form_stops), logprobs=ask.logprobs, ignore_eos=ask.ignore_eos, grammar=grammar)


def _or(value, default):
    return default if value is None else value
