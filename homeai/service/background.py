"""What background jobs ask of the model, through the service: token counts, the chat template, a
whole answer, whether it reads images and a photo described, vectors (`service.work()`, None while
the model loads).

Jobs (`homeai.jobs`: indexing, summaries, search) are clients of the service as the protocols are,
and never hold the runner or the engine. Their requests are queued on their own lanes as every
protocol's are; unlike a protocol's, they run in a job's own thread (`asyncio.run`), and a job
tells a stopped engine (the run resumes later: `EngineStopped`) from a refused input (skipped:
`InvalidRequest`, `QueueFull`), so the engine's own exceptions reach them, named here.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

from homeai.engine.engine import EngineStopped, FinishEvent, InvalidRequest, QueueFull
from homeai.engine.prompt import ChatPrompt, image_mark
from homeai.sched.request import SamplingParams
from homeai.service.images import Picture

__all__ = ["ChatPrompt", "EngineStopped", "InvalidRequest", "QueueFull", "SamplingParams", "Work"]

DESCRIBE = "Describe this photo in two or three sentences: what and who is in it, where, and any text it shows."


class Work:
    """The model's work for jobs, over the loaded model and its engine."""

    def __init__(self, engine, runner):
        self._engine, self._runner = engine, runner

    @property
    def max_seq_len(self) -> int:
        """The longest sequence one request may hold (prompt and answer)."""
        return self._engine.max_seq_len

    @property
    def embed_max_tokens(self) -> int:
        """The most tokens one embedding input may have, the special ones included."""
        return self._engine.embed_max_tokens

    def max_batch(self, lane: str) -> int:
        """How many of `lane`'s requests run at once."""
        return self._engine.policies[lane].max_batch

    def sees(self) -> bool:
        """Whether the model reads images (a vision projector is loaded beside it)."""
        return bool(self._runner.info.mmproj_path)

    def count(self, text: str | ChatPrompt, *, add_special: bool = True, embedding: bool = False) -> int:
        """`text`'s length in the generation model's tokens (the embedding model's, with `embedding`)."""
        return len(self._runner.tokenize(text, add_special=add_special, embedding=embedding))

    def chat_prompt(self, messages: list[dict]) -> ChatPrompt:
        """The messages in the served model's chat template, ending at the assistant's turn."""
        return self._runner.apply_chat_template(messages)

    async def generate(self, prompt: ChatPrompt, *, lane: str, params: SamplingParams) -> tuple[str, FinishEvent]:
        """One request on `lane` run to its end: the whole text and how it finished."""
        return await self._engine.generate(prompt, lane=lane, params=params)

    async def describe(self, picture: Picture, *, lane: str, max_tokens: int) -> str:
        """What the model sees in `picture`, in a few sentences (greedy, at most `max_tokens`), asked
        on `lane`; raises `EngineStopped` when the engine stops before it is done."""
        prompt = self.chat_prompt([{"role": "user", "content": image_mark(0) + "\n" + DESCRIBE}])
        prompt = dataclasses.replace(prompt, images=(picture,), holder=f"{lane}-{uuid.uuid4().hex}")
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        text, finish = await self.generate(prompt, lane=lane, params=params)
        if finish.reason == "abort":
            raise EngineStopped("the engine stopped")
        if finish.reason not in ("stop", "length"):
            raise RuntimeError(f"the description ended with {finish.reason}: {finish.error or ''}")
        return text.strip()

    async def embed(self, texts: Sequence[str], *, lane: str):
        """One vector per text (None for one aborted: the engine stopping), and the tokens read."""
        return await self._engine.embed(texts, lane=lane)
