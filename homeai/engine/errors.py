"""The engine's refusals and its ends: a request it will not take (`InvalidRequest`, `PromptTooLong`;
a full lane queue is the scheduler's `QueueFull`), and an engine that admits nothing more
(`EngineStopped`) or whose runner failed step after step (`EngineBroken`)."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request the engine will not take, with the parameter at fault."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.param, self.code = param, code


class PromptTooLong(InvalidRequest):
    """`limit`: the most tokens a prompt may have; `where`: per cache (by name) when a lane's
    request may be read in more than one (`limit` is then the largest)."""

    def __init__(self, num_tokens: int, limit: int, where: dict[str, int] | None = None):
        if where and len(where) > 1:
            (name, n), *rest = where.items()
            fits = f"{n} fit the {name} cache" + "".join(f" and {n} the {name} cache" for name, n in rest)
            message = (f"the prompt has {num_tokens} tokens but at most {fits} "
                       f"(each holds the prompt and at least 1 token of the answer)")
        else:
            message = (f"the prompt has {num_tokens} tokens but at most {limit} fit the context "
                       f"(model context {limit + 1} tokens, at least 1 for the answer)")
        super().__init__(message, "messages", "context_length_exceeded")
        self.num_tokens, self.limit = num_tokens, limit


class EngineStopped(RuntimeError):
    """The engine is shutting down, or has died, and admits nothing more."""


class EngineBroken(RuntimeError):
    """The runner failed step after step: the loop stops rather than fail every request."""
