"""The service: what every protocol asks of the served model, answered the same way.

    service = Service(program)                              # one per program (homeai.app)
    lane, policy = service.lane(caller, requested, "chat")  # the member's rights
    answer = await service.chat(ChatAsk(messages, lane=lane), caller)
    async for event in answer: ...                         # homeai.service.answer

`chat`, `complete` and `embed` each resolve the model, check the member's lane and the server's
limits, build the tool plan, grammar and prompt off the event loop, and submit (refusals as
ServiceError: 400, 403, 404, 429 with Retry-After, 503); `service.hearing` transcribes a spoken
question (`homeai.service.hearing`: speech in), `service.speaking` says text (`homeai.service.speaking`:
speech out). The facts a protocol reports (model cards, context length, embedding size, token text
for logprobs, `/healthz`'s) are read here too, and the jobs' work goes through `service.work()`
(`homeai.service.background`), so no route, job or Wyoming session touches the runner or the engine.
The program (`homeai.app.Program`) hands the service what it assembled: the runner, the engine
once it runs, speech in and out, the store, the remote lanes.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from homeai.engine import usage
from homeai.engine.engine import Engine, RequestStream
from homeai.engine.state import EngineState
from homeai.sched.request import Kind
from homeai.engine.prompt import image_mark
from homeai.service import clients, names, prompts, sampling, thinking, words
from homeai.service.answer import Answer
from homeai.service.asks import ChatAsk, CompletionAsk, EmbedAsk, Embeddings
from homeai.service.errors import ServiceError, embedding_failed, model_loading, model_unavailable
from homeai.service.background import Work
from homeai.service.hearing import Hearing
from homeai.service.rights import Caller, lane_for, member_may_use
from homeai.service.speaking import Speaking
from homeai.service.submit import off_loop, submit
from lanes import chat as chat_lane
from lanes.base import LanePolicy

OLLAMA_TAG = ":latest"  # `/api/tags` lists the served model as `<id>:latest`; Ollama's clients send it to /v1 too
# A new grammar waits for its member's turn at the checker (`[grammar] max_pending_checks_per_member` a member):
# on threads of its own, so waiting checks never take the default pool's few (min(32, cores + 4): 6 on 2 cores),
# which every member's prompt is tokenised on
GRAMMAR_THREADS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="grammar")


class Service:
    def __init__(self, program):
        self.program = program  # homeai.app.Program: what was assembled, read as it loads
        self.hearing = Hearing(program)  # speech in: one speech turn (homeai.service.hearing)
        self.speaking = Speaking(program)  # speech out (homeai.service.speaking)
        self.jobs = None  # the job service, for `documents` (set by the program once it opens)
        self._reading_images: dict[str, int] = {}  # per member, requests whose images are being read and encoded

    # ---- what the protocols report ----------------------------------------------------------

    @property
    def cfg(self):
        return self.program.cfg

    @property
    def remotes(self):
        """The lanes answered by remote servers (`[remote.<lane>]`)."""
        return self.program.remotes

    def engine(self) -> Engine:
        """The engine once the model is loaded; else a 503 saying why."""
        program = self.program
        if program.engine is None:
            raise model_unavailable(program.error) if program.error else model_loading()
        return program.engine

    def ready(self) -> None:
        self.engine()

    def runner(self):
        """The loaded model (tokenizer, chat template, grammars) once it serves; else a 503 saying why."""
        self.engine()
        return self.program.runner

    def health(self) -> dict:
        """What `/healthz` says: "error" (and why), "loading", or what is served."""
        program = self.program
        if program.error:
            return {"status": "error", "error": program.error}
        engine = program.engine
        if engine is None:
            return {"status": "loading"}
        info = program.runner.info
        return {"status": "ok", "model": program.model_id("generate"), "embedding_model": program.model_id("embed"),
                "n_ctx": info.n_ctx, "max_seq_len": info.max_seq_len,
                "interactive_max_seq_len": engine.interactive_max_seq_len, "n_seq_max": info.n_seq_max,
                "gpu_offload": info.gpu_offload, "lanes": list(engine.policies)}

    def state_now(self) -> EngineState | None:
        """The engine's state now, or None while the model loads (`/metrics` renders either)."""
        engine = self.program.engine
        return engine.state() if engine is not None else None

    def work(self) -> Work | None:
        """What background jobs ask of the model (`homeai.service.background`), or None while it loads."""
        engine = self.program.engine
        return Work(engine, self.program.runner) if engine is not None else None

    def member_may_use(self, member: str, lane: str) -> None:
        """A 403 (or a 404 for no such member) unless the member named `member` may use `lane`, read
        from the store now (Wyoming's `wyoming.member`). Blocking: call it off the event loop."""
        member_may_use(self.program.sessions, member, lane)

    def cards(self) -> list:
        self.ready()
        return self.program.cards()

    def loaded_cards(self) -> dict:
        """The served model cards by purpose ("generate", "embed"), as loaded so far (none while loading)."""
        return self.program.models

    def cards_now(self) -> list:
        """The served model cards, none while the model loads (no 503: `/api/pull` and `/api/delete`)."""
        return self.program.cards()

    def names_served(self, name: str | None, purpose: str) -> bool:
        """Whether `name` (or an alias, or nothing) names the model serving `purpose`."""
        return self.program.resolve_model(name, purpose) is not None

    def members_using(self) -> dict:
        """Who is using the box now (`homeai.engine.usage.members`: an admin's `/api/lanes`)."""
        return usage.members(self.engine())

    def model(self, requested: str | None, purpose: str) -> str:
        """The served model's id for `purpose` ("generate" or "embed") if `requested` names it (as
        Ollama's `<id>:latest` too, or `<id>:<lane>`: `homeai.service.names`); else a 404."""
        self.ready()
        model = self.program.resolve_model(self._base(requested), purpose)
        if model is None:
            served = self.program.model_id(purpose)
            raise ServiceError(404, f"the model {requested!r} does not exist; this server serves {served!r} "
                                    f"(also as {served}:<lane> for a lane: {', '.join(self.cfg.lanes)})",
                               code="model_not_found", param="model")
        return model

    def find_model(self, name: str) -> tuple[object, set[str]] | None:
        """The served card `name` names (its id, its file's name, or an alias; `:latest` or not) and
        what it does."""
        self.ready()
        found, purposes = None, set()
        for purpose in ("generate", "embed"):
            if self.program.resolve_model(self._base(name), purpose) is not None:
                found = found or self.program.models[purpose]
                if self.program.models[purpose] == found:
                    purposes.add(purpose)
        return (found, purposes) if found is not None else None

    def lane_names(self, caller: Caller) -> list[str]:
        """The served model's names that pick a lane `caller` may use (`<id>:summaries`, ...), and its
        short alias's (`home`, `home:summaries`, ...: `[clients] model_alias`)."""
        self.ready()
        return names.listed(self.program.model_id("generate"), self.cfg.lanes, caller.lanes,
                            alias=self.cfg.clients.model_alias)

    def _base(self, name: str | None) -> str | None:
        """`name` without Ollama's `:latest` or a lane's `:<lane>`."""
        return names.split(_untagged(name), self.cfg.lanes)[0]

    def sees(self) -> bool:
        """Whether the served model reads images (a vision projector is loaded beside it)."""
        return bool(self.runner().info.mmproj_path)

    def context_length(self) -> int:
        engine = self.engine()
        return engine.max_seq_len_for("chat") if "chat" in engine.policies else engine.max_seq_len

    def state(self) -> EngineState:
        """The engine's lanes, queues and caches now (`/api/lanes`, `/metrics`)."""
        return self.engine().state()

    def on_gpu(self) -> bool:
        return self.runner().info.gpu_offload

    def embed_dimensions(self) -> int:
        return self.runner().info.embed_n_embd

    def trained_context(self) -> int:
        """The context length the model was trained on (Ollama's `/api/show`)."""
        return self.runner().info.n_ctx_train

    def thinking_form(self) -> thinking.Form:
        """How the served model thinks, from its chat template (`homeai.service.thinking`)."""
        return thinking.form_of(self.runner().chat.template)

    def template_choice(self):
        """The chat template the model is served with and why (`TemplateChoice`: `/api/show`)."""
        return self.runner().chat

    def piece(self, token: int) -> bytes:
        """The bytes token `token` stands for (logprobs)."""
        return self.runner().piece(token)

    # ---- rights and limits ------------------------------------------------------------------

    def lane(self, caller: Caller, requested: str | None, default: str) -> tuple[str, LanePolicy]:
        """The lane asked for (else `default`) and its policy: 400 unknown, 403 not the member's."""
        return lane_for(self.program, caller, requested, default)

    def request_lane(self, caller: Caller, *, model: str | None, lane: str | None = None,
                     header: str | None = None, default: str) -> tuple[str, LanePolicy]:
        """The lane a request with a model name asks for: the name's (`<id>:<lane>`) or the body's
        `lane` (a 400 when they differ), else the header's, else `default`; checked as `lane`."""
        named = names.split(_untagged(model), self.cfg.lanes)[1]
        return self.lane(caller, names.asked_lane(named, lane, header), default)

    def check_limits(self, *, max_tokens: int | None, num_messages: int = 0,
                     max_tokens_param: str = "max_tokens") -> None:
        """400 over the server's message count or answer length (a route checks before it forwards
        a request to a remote lane; `chat` and `complete` check again)."""
        sampling.check_limits(self.cfg.server, max_tokens=max_tokens, num_messages=num_messages,
                              max_tokens_param=max_tokens_param)

    def _check(self, ask: ChatAsk | CompletionAsk) -> None:
        # A conversation fitted to the context ("latest": household, voice) has no message count to exceed.
        num_messages = len(ask.messages) if isinstance(ask, ChatAsk) and ask.fit == "refuse" else 0
        self.check_limits(max_tokens=ask.sampling.max_tokens, num_messages=num_messages,
                          max_tokens_param=ask.sampling.max_tokens_param)

    async def check_tools(self, tools: list | None, tool_choice=None, caller: Caller | None = None) -> None:
        """Refuse tools that would be refused at the first question (a 400 `invalid_tools`, the
        message naming the field), so a session can refuse them when it starts (checked in `caller`'s
        turn: a 429 `grammar_busy` as it is)."""
        runner = self.runner()
        try:
            plan = await asyncio.to_thread(prompts.tool_plan, runner, tools, tool_choice)
            if plan is not None:
                await self._grammar(runner, plan, None, "openai", caller.key if caller is not None else "")
        except ServiceError as e:
            if e.status == 429:
                raise
            raise ServiceError(400, e.message, code="invalid_tools", param=e.param) from None

    # ---- answers ----------------------------------------------------------------------------

    async def chat(self, ask: ChatAsk, caller: Caller) -> Answer:
        """Answer a conversation; tools, structured output and documents as asked (a client's
        background task on its background lane: `homeai.service.clients`)."""
        asked = clients.task_lane(self.cfg, caller, ask.lane, ask.messages, streamed=ask.streamed)
        lane, policy = self.lane(caller, asked, asked)
        self._check(ask)
        engine = self.engine()
        model = self.model(ask.model, "generate")
        runner = self.runner()
        plan, grammar = await self._plan(runner, ask, caller.key)
        params = sampling.params(ask.sampling, policy, grammar, plan.stops if plan is not None else ())
        docs, citations = await self._documents(ask.messages) if ask.documents else ("", [])
        limit = chat_lane.prompt_limit(engine.max_seq_len_for(lane), params.max_tokens) if ask.fit == "latest" else None
        # a reply held to a format from its first token has no room for a thought
        think = thinking.held(ask.think) if grammar is not None and plan is None else ask.think
        prompts.check_images(runner, ask.images, self.cfg.limits)
        prompter = prompts.Prompter(runner, plan, think,
                                    client=clients.client_preamble(self.cfg, ask.messages, documents=bool(docs)),
                                    images=ask.images, limits=self.cfg.limits)
        tokens = partial(prompts.chat_tokens, runner, ask.messages, prompter, docs=docs, limit=limit)
        with self._images_turn(caller.key, ask.images):
            stream = await submit(engine, tokens, lane=lane, member=caller.key, params=params,
                                  prompt_param=ask.prompt_param, group=caller.group)
        stream = words.between_words(stream, ask.sampling.max_tokens)  # the server's cut ends between words
        return Answer(stream, model=model, lane=lane, plan=plan, with_tokens=params.logprobs is not None,
                      citations=citations, thoughts=prompter.splitter())

    @contextlib.contextmanager
    def _images_turn(self, member: str, images: tuple):
        """A member's requests with images are read (decoded, encoded by the one projector) at most
        `MAX_READING_IMAGES` at a time: a flood of pictures waits in no one else's way (429 past it)."""
        if not images:
            yield
            return
        if self._reading_images.get(member, 0) >= MAX_READING_IMAGES:
            raise ServiceError(429, f"{MAX_READING_IMAGES} of your requests' images are being read: "
                               "send the next when one is answered", code="images_busy", headers={"Retry-After": "1"})
        self._reading_images[member] = self._reading_images.get(member, 0) + 1
        try:
            yield
        finally:
            left = self._reading_images[member] - 1
            if left:
                self._reading_images[member] = left
            else:
                del self._reading_images[member]

    async def _plan(self, runner, ask: ChatAsk, member: str):
        """The tool plan and the grammar the reply is held to, built off the loop (large schemas take
        a while to validate, and a grammar up to `[grammar] build_timeout_s` to check, in `member`'s turn)."""
        plan = await asyncio.to_thread(prompts.tool_plan, runner, ask.tools, ask.tool_choice, ask.parallel_tool_calls)
        if plan is not None and ask.structured not in (None, {"type": "text"}):
            param = "format" if ask.structured_kind == "ollama" else "response_format"
            raise ServiceError(400, f"{param} cannot be combined with tools", code="invalid_value", param=param)
        return plan, await self._grammar(runner, plan, ask.structured, ask.structured_kind, member)

    async def _grammar(self, runner, plan, structured, kind: str, member: str):
        """`prompts.grammar` (bounded, built and checked in `member`'s turn) on the grammar threads."""
        call = partial(prompts.grammar, runner, self.cfg.grammar, plan, structured, kind, member)
        return await asyncio.get_running_loop().run_in_executor(GRAMMAR_THREADS, call)

    async def complete(self, ask: CompletionAsk, caller: Caller) -> Answer:
        """Continue a prompt: as it is, or as a user turn in the chat template (`template`)."""
        lane, policy = self.lane(caller, ask.lane, ask.lane)
        self._check(ask)
        engine = self.engine()
        model = self.model(ask.model, "generate")
        runner = self.runner()
        grammar = await self._grammar(runner, None, ask.structured, ask.structured_kind, caller.key)
        params = sampling.params(ask.sampling, policy, grammar)
        think = thinking.held(ask.think) if grammar is not None else ask.think
        system = [{"role": "system", "content": ask.system}] if ask.system else []
        client = clients.client_preamble(self.cfg, system)
        if ask.images and not ask.template:
            raise ServiceError(400, "images need the chat template: a raw prompt cannot hold them",
                               code="invalid_value", param=ask.images[0].param)
        prompts.check_images(runner, ask.images, self.cfg.limits)
        prompter = prompts.Prompter(runner, None, think, client=client, images=ask.images,
                                    limits=self.cfg.limits) if ask.template else None
        marks = "".join(image_mark(i) + "\n" for i in range(len(ask.images)))  # the images first, as Ollama's

        def prompt():
            if prompter is None:
                return ask.prompt
            return prompter([*system, {"role": "user", "content": marks + ask.prompt}])

        with self._images_turn(caller.key, ask.images):
            stream = await submit(engine, prompt, lane=lane, member=caller.key, params=params,
                                  prompt_param=ask.prompt_param, group=caller.group)
        stream = words.between_words(stream, ask.sampling.max_tokens)
        # a prompt as it is (raw) is continued as written: no thoughts are split from its text
        return Answer(stream, model=model, lane=lane, with_tokens=params.logprobs is not None,
                      thoughts=prompter.splitter() if prompter is not None else None)

    async def embed(self, ask: EmbedAsk, caller: Caller) -> Embeddings:
        """One vector per input, all or none; cancelled, every queued input is aborted."""
        lane, _policy = self.lane(caller, ask.lane, ask.lane)
        engine = self.engine()
        model = self.model(ask.model, "embed")
        loop = asyncio.get_running_loop()
        streams = await off_loop(lambda: _submit_embeds(engine, ask.inputs, lane, caller.key, loop), engine=engine,
                                 lane=lane, prompt_param=ask.prompt_param)
        try:
            for stream in streams:
                async for _ in stream:
                    pass
        finally:
            for stream in streams:
                if stream.finished is None:
                    stream.abort()
        vectors, num_tokens = [], 0
        for stream in streams:
            finish = stream.finished
            if finish.reason != "stop":
                raise embedding_failed(finish.error or finish.reason)
            vectors.append(finish.embedding)
            num_tokens += finish.stats.prompt_tokens
        return Embeddings(vectors, num_tokens, model)

    async def _documents(self, messages: list[dict]) -> tuple[str, list[dict]]:
        """The household's chunks best matching the question, as the chat lane's document context
        (a system message's text, "" when none match), and the citations to return."""
        if self.jobs is None:
            raise ServiceError(400, "this server indexes no documents", code="documents_unavailable",
                               param="documents")
        system_text, citations = await self.jobs.build_document_context(chat_lane.question(messages),
                                                                        chat_lane.MAX_DOCUMENTS)
        if not system_text:
            return "", []
        return system_text, [{k: c[k] for k in ("n", "path", "score", "snippet")} for c in citations]


MAX_READING_IMAGES = 2  # a member's requests whose images are read at once (`Service._images_turn`)


def _untagged(name: str | None) -> str | None:
    return name.removesuffix(OLLAMA_TAG) if name else name


def _submit_embeds(engine: Engine, inputs: list, lane: str, member: str, loop) -> list[RequestStream]:
    """One embed request per input; all or none: a refusal aborts those already queued."""
    streams: list[RequestStream] = []
    try:
        for text in inputs:
            streams.append(engine.submit(text, lane=lane, member=member, kind=Kind.EMBED, loop=loop))
    except BaseException:
        for stream in streams:
            stream.abort()
        raise
    return streams
