"""The runner: the model's steps, as the engine asks for them. It ties the package's rooms together.

It loads one model once (`model`), holds a generation context (one unified KV cache of `n_ctx`
cells, `n_seq_max` sequence ids, sized by `sizing`), optionally a second one for the interactive
lanes (`interactive_n_ctx` cells), and an embeddings context (mean pooling, over the same weights
or a configured embedding GGUF). Each KV pool of the scheduler is one of these contexts, its
sequence ids the context's own. The runner turns each `StepPlan` into one `llama_decode` per pool
with tokens in the step (`batch`): tokens, positions, sequence ids, and logits only on the rows
that will be sampled. Tokens are sampled (`sampling`) only once every context has decoded, so a
step that finds no KV slot in one context is undone in the others and keeps nothing. A grammar is
built here only once the grammar checker's process has built it (`homeai.engine.grammar_check`,
which runs `grammar_worker`). Text goes in and out here too: tokenizing, a token's bytes, the chat
template chosen at load.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from pathlib import Path

import llama_cpp as ll
import numpy as np

from homeai.config import GrammarConfig, ModelConfig
from homeai.engine import families, gpu, template
from homeai.engine.errors import InvalidRequest
from homeai.engine.prompt import IMAGE_MARK, ChatPrompt, PromptTokens, Source
from homeai.engine.grammar_check import GrammarChecker
from homeai.llama.batch import Batch, EmbdBatch
from homeai.llama.draft_model import DraftModel
from homeai.llama.drafts import draft_guesses, fit_guesses, verify
from homeai.llama.grammar import CONVERTER
from homeai.llama.model import ModelInfo, RunnerError, chat_template_source, control_tokens, flash_attn_type, \
    init_backend, load_model, new_context, reply_markup, tokenize_text
from homeai.llama.sampling import SAMPLE_REST, GrammarOverBudget, Sampler, grammar_sampler
from homeai.llama.sizing import model_kv_sizes
from homeai.llama.vision import Vision, runs
from homeai.threads import CoreWatch
from homeai.sched.request import Grammar, Sample
from homeai.sched.pools import GENERATE, Copy, Drop, Pool
from homeai.sched.plan import new_tuple
from homeai.sched.prefix import Memory
from homeai.sched.scheduler import ScheduledItem, StepPlan, StepResult

log = logging.getLogger(__name__)
_checker_lock = threading.Lock()


class Runner:
    grammar_checker: GrammarChecker | None = None  # started at the first grammar (`check_grammar`)
    schema_converter = CONVERTER  # JSON schemas to GBNF text, for the tools (homeai.tools.formats.base)

    def __init__(self, cfg: ModelConfig, model_path: Path, embedding_path: Path | None = None,
                 grammar: GrammarConfig | None = None, draft_path: Path | None = None,
                 mmproj_path: Path | None = None):
        init_backend()
        self.cfg = cfg
        self.grammar_limits = grammar or GrammarConfig()
        # 0: every core while the box is quiet, fewer while other processes keep cores busy (homeai.threads)
        self.core_watch = None if cfg.n_threads else CoreWatch()
        threads = cfg.n_threads or self.core_watch.threads()
        self.num_threads = threads
        gpu.apply(gpu.cuda_graphs(cfg, bool(ll.llama_supports_gpu_offload())))  # before any decode
        self.model = load_model(model_path, cfg)
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        facts = chat_template_source(self.model, self.vocab, cfg.chat_template)
        self.chat = template.load(**facts)  # compiled once, here
        self.control_texts = facts["control_texts"]  # wrapped apart in members' text (engine.prompt.Marks)
        self._markup = reply_markup(self.vocab)  # control tokens a reply's text keeps (markup.REPLY)
        self.kv = model_kv_sizes(self.model, cfg)
        self.ctx = new_context(self.model, n_ctx=self.kv.main, n_batch=cfg.n_batch, n_seq_max=cfg.n_seq_max,
                            n_threads=threads, embeddings=False, flash_attn=flash_attn_type(cfg))
        self.memory = ll.llama_get_memory(self.ctx)
        self.ictx = None  # the interactive lanes' context, when they have their own cache
        if self.kv.interactive:
            self.ictx = new_context(self.model, n_ctx=self.kv.interactive, n_batch=cfg.n_batch,
                                 n_seq_max=cfg.n_seq_max, n_threads=threads, embeddings=False,
                                 flash_attn=flash_attn_type(cfg))
        self.imemory = ll.llama_get_memory(self.ictx) if self.ictx else None
        self.embed_model = load_model(embedding_path, cfg) if embedding_path else self.model
        self.embed_ctx = new_context(self.embed_model, n_ctx=cfg.embed_n_ctx, n_batch=cfg.embed_n_ctx,
                                  n_seq_max=cfg.embed_n_seq_max, n_threads=threads, embeddings=True,
                                  flash_attn=flash_attn_type(cfg))
        self.embed_memory = ll.llama_get_memory(self.embed_ctx)
        self._contexts = {Pool.MAIN: self.ctx, Pool.INTERACTIVE: self.ictx, Pool.EMBED: self.embed_ctx}
        self._memories = {Pool.MAIN: self.memory, Pool.INTERACTIVE: self.imemory, Pool.EMBED: self.embed_memory}
        # where a sequence may be resumed, for the scheduler's prompt cache (llama.cpp's facts, prefix.Memory)
        self.kv_memory = Memory(window=max(ll.llama_model_n_swa(self.model), 0),
                                recurrent=ll.llama_model_is_recurrent(self.model) or ll.llama_model_is_hybrid(self.model),
                                held=self.held)
        self.batch = Batch(cfg.n_batch)
        self.embed_batch = Batch(cfg.embed_n_ctx)
        self.sampler = Sampler(self.vocab, self.n_vocab, control_tokens(self.vocab, families.TURN_OPENERS),
                               self.grammar_limits.step_budget_ms / 1000.0)
        self._pooled: dict[str, np.ndarray] = {}  # embedding inputs in flight: their chunks' summed vectors
        self._pieces: dict[int, bytes] = {}
        self._launched = 0.0  # when the step in flight was launched (`launch`), and what it decoded
        self._decoded: list = []
        # A draft model guessing for the answers (`[speculative] draft_path`), none for a cache that cannot be cut
        self.draft = DraftModel(draft_path, cfg, self.vocab, self.kv.interactive or self.kv.main, cfg.n_seq_max,
                                threads) if draft_path and self.kv_memory.cut_anywhere else None
        # The vision projector (`[model] mmproj`): images in prompts, read as embeddings (`vision`)
        n_embd = ll.llama_model_n_embd(self.model)
        self.vision = Vision(mmproj_path, self.model, n_embd, threads, self.draft is None and
                             bool(ll.llama_supports_gpu_offload()) and cfg.n_gpu_layers != 0) if mmproj_path else None
        self.embd_batch = EmbdBatch(cfg.n_batch, n_embd) if self.vision else None
        self.info = self._info(model_path, embedding_path)

    def _info(self, model_path: Path, embedding_path: Path | None) -> ModelInfo:
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.model, desc, 256)
        n_ctx_train = ll.llama_model_n_ctx_train(self.model)
        return ModelInfo(
            path=str(model_path), description=desc.value.decode(errors="replace"),
            size_bytes=ll.llama_model_size(self.model), n_vocab=self.n_vocab, n_ctx_train=n_ctx_train,
            n_embd=ll.llama_model_n_embd(self.model), n_ctx=self.kv.main, n_seq_max=self.cfg.n_seq_max,
            max_seq_len=min(self.kv.main, n_ctx_train),
            interactive_max_seq_len=min(self.kv.interactive or self.kv.main, n_ctx_train),
            embed_path=str(embedding_path or model_path), embed_n_embd=ll.llama_model_n_embd(self.embed_model),
            embed_max_tokens=self.cfg.embed_n_ctx, embed_chunked=bool(self.embed_memory),
            gpu_offload=bool(ll.llama_supports_gpu_offload()),
            system_info=ll.llama_print_system_info().decode(errors="replace").strip(),
            interactive_n_ctx=self.kv.interactive, kv=self.kv,
            mmproj_path=str(self.vision.path) if self.vision else "")

    # ---- text ------------------------------------------------------------------

    def tokenize(self, text: str | ChatPrompt, *, add_special: bool = True, embedding: bool = False,
                 special: bool = False) -> list[int]:
        """Text's tokens, BOS (and EOS, for a vocabulary that wants one) added with `add_special`.
        Text is text: a control token's text in it (`<|im_start|>`) is characters, unless `special`
        (a raw prompt, all its member's own). A `ChatPrompt` is tokenized part by part, control
        tokens parsed only in the template's own text, into `PromptTokens` that know its public
        prefix."""
        if isinstance(text, ChatPrompt):
            return self._tokenize_chat(text, add_special)
        vocab = ll.llama_model_get_vocab(self.embed_model) if embedding else self.vocab
        return tokenize_text(vocab, text, add_special, special)

    def _tokenize_chat(self, prompt: ChatPrompt, add_special: bool) -> PromptTokens:
        """Each part apart, so no token spans two writers: the public prefix's tokens are the same
        whatever a member wrote after it, and a member's text never merges into a control token."""
        tokens: list[int] = []
        if add_special and ll.llama_vocab_get_add_bos(self.vocab) and ll.llama_vocab_bos(self.vocab) >= 0:
            tokens.append(ll.llama_vocab_bos(self.vocab))
        public_len = client_len = None  # where the first text a member wrote starts; and a user
        images: list[tuple[int, int]] = []  # each image's placeholder span
        holder = (prompt.holder or f"prompt-{id(prompt)}-{time.monotonic_ns()}") if prompt.images else ""
        whole = False
        try:
            for part in prompt.parts:
                if public_len is None and part.source in (Source.CLIENT, Source.MEMBER):
                    public_len = len(tokens)
                if client_len is None and part.source is Source.MEMBER:
                    client_len = len(tokens)
                template = part.source is Source.TEMPLATE
                if not prompt.images or template:
                    tokens += tokenize_text(self.vocab, part.text, False, template)
                    continue
                at = 0
                for mark in IMAGE_MARK.finditer(part.text):  # the image's tokens where its mark is
                    tokens += tokenize_text(self.vocab, part.text[at:mark.start()], False, False)
                    at = mark.end()
                    encoded = self._image(prompt.images, int(mark.group(1)), holder)
                    images.append((len(tokens) + encoded.start, len(tokens) + encoded.start + encoded.n))
                    whole = whole or encoded.whole
                    tokens += encoded.tokens
                tokens += tokenize_text(self.vocab, part.text[at:], False, False)
        except BaseException:
            if holder:
                self.vision.release(holder)
            raise
        if add_special and ll.llama_vocab_get_add_eos(self.vocab) and ll.llama_vocab_eos(self.vocab) >= 0:
            tokens.append(ll.llama_vocab_eos(self.vocab))
        return PromptTokens(tokens, len(tokens) if public_len is None else public_len,
                            len(tokens) if client_len is None else client_len,
                            images=tuple(images), whole_images=whole, holder=holder)

    def _image(self, pictures: tuple, index: int, holder: str):
        if self.vision is None:
            raise InvalidRequest("this model has no vision projector ([model] mmproj): it cannot read images",
                                 "images", "images_unsupported")
        if index >= len(pictures):
            raise InvalidRequest("an image mark names no image", "images", "invalid_image")
        encoded = self.vision.encoded(pictures[index], holder)
        if encoded.whole and encoded.n > self.cfg.n_batch:
            raise InvalidRequest(f"this projector reads an image of {encoded.n} tokens in one step, more than "
                                 f"model.n_batch ({self.cfg.n_batch})", "images", "image_too_large")
        return encoded

    def hold_images(self, holder: str, request_id: str) -> None:
        """The images a prompt holds (`PromptTokens.holder`) are its queued request's until it ends."""
        if self.vision is not None and holder:
            self.vision.hold(holder, request_id)

    def release_images(self, holder: str) -> None:
        """A prompt that was not queued lets its images go."""
        if self.vision is not None and holder:
            self.vision.release(holder)

    def piece(self, token: int) -> bytes:
        """A token's bytes; special tokens (end of turn, ...) render as nothing, except the reply's
        markup (`markup.REPLY`: `[TOOL_CALLS]`, `<|channel|>`, ...), which renders as its text."""
        cached = self._pieces.get(token)
        if cached is None:
            special = token in self._markup
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            extra: dict | None = None, client: bool = True) -> ChatPrompt:
        """Render messages (and tools) for the model, ending at the assistant's turn, with the chat
        template chosen at load (`self.chat`: the configured one, the GGUF's own, or the built-in one
        of the model's family: homeai.engine.template). The prompt is in parts by who wrote them,
        for `tokenize` (special tokens added), so it holds one BOS, not two. `extra`: further
        variables for the template (`enable_thinking`, ...); `client`: whether the tools and leading
        system messages are the client's (`Source.CLIENT`). Raises ChatRenderError for
        messages the template refuses."""
        return self.chat.template.prompt(messages, tools, control_texts=self.control_texts, extra=extra,
                                         tokenizer_adds_bos=bool(ll.llama_vocab_get_add_bos(self.vocab)),
                                         client=client)

    # ---- one step --------------------------------------------------------------

    def run(self, plan: StepPlan) -> StepResult:
        return self.collect(plan, self.launch(plan))

    def launch(self, plan: StepPlan) -> StepResult:
        """A step up to its decodes' return: its cache operations, then a `llama_decode` per pool.
        On a GPU llama.cpp returns before it has computed (the logits are read in `collect`), so
        the caller may work meanwhile; on a CPU it has computed. The result so far says whether
        llama.cpp found no KV slot (then nothing of the step was kept)."""
        self._launched = time.perf_counter()
        self._follow_cores()
        for pool, ops in plan.cache_ops.items():
            memory = self._memory(pool)
            if not memory:  # an encoder without a KV cache keeps nothing to drop
                continue
            for op in ops:
                if isinstance(op, Copy):
                    ll.llama_memory_seq_cp(memory, op.src, op.dst, 0, op.length)
                    continue
                if not ll.llama_memory_seq_rm(memory, op.seq_id, op.start, -1):
                    self._refused_cut(plan, pool, op)
                if self.draft is not None and pool in GENERATE:
                    self.draft.drop(pool, op.seq_id, op.start)
        for request_id in plan.done:
            self.sampler.free(request_id)
            self._pooled.pop(request_id, None)
            if self.vision is not None:
                self.vision.release(request_id)
        if plan.model_drafts and self.draft is not None:
            draft_guesses(plan, self.draft)
        if plan.drafts:
            fit_guesses(plan, self.sampler)
        result = StepResult()
        self._decoded = self._decode(plan, result)
        return result

    def _refused_cut(self, plan: StepPlan, pool: Pool, op: Drop) -> None:
        """llama.cpp cannot cut a sequence there (a recurrent state): none of it is kept, so no later
        step reads a state past the cut. A sequence this step computes on cannot go on: the step fails
        (its requests end with an error) rather than compute on a cache it refused."""
        ll.llama_memory_seq_rm(self._memory(pool), op.seq_id, -1, -1)  # a whole sequence always goes
        if any(item.seq_id == op.seq_id for item in plan.batches[pool]):
            raise RunnerError(f"llama.cpp could not cut sequence {op.seq_id} at position {op.start}")
        log.warning("llama.cpp could not cut sequence %d at position %d: dropped whole", op.seq_id, op.start)

    def held(self, pool: Pool, seq_id: int) -> tuple[int, int]:
        """The positions [first, end) llama.cpp's cache `pool` holds of a sequence; (0, 0): none."""
        memory = self._memory(pool)
        first = ll.llama_memory_seq_pos_min(memory, seq_id)
        return (first, ll.llama_memory_seq_pos_max(memory, seq_id) + 1) if first >= 0 else (0, 0)

    def collect(self, plan: StepPlan, result: StepResult) -> StepResult:
        """The rest of a launched step: its rows sampled (waiting for llama.cpp to finish computing),
        its embedding inputs run; the step's time from its launch."""
        sampler = self.sampler
        sampler.new_step()
        if not result.no_kv_slot:
            for pool, group, rows, num_outputs in self._decoded:
                if not num_outputs:
                    continue
                ctx = self._context(pool)
                outputs = self._outputs(ctx, num_outputs)
                best = outputs.argmax(axis=1).tolist()  # every row's greedy pick, in one pass
                out = 0
                drafts = plan.drafts
                for item, row in zip(group, rows):
                    if drafts and item.request_id in drafts:
                        out = verify(self.sampler, self._memory(pool), ctx, item, row, outputs, out, best,
                                     drafts[item.request_id], result)
                        continue
                    if item.sample:
                        try:
                            sample = sampler.sample(ctx, item, row, outputs, out, best[out])
                        except GrammarOverBudget as e:  # that request ends with an error, the step goes on
                            log.warning("request %s: %s", item.request_id, e)
                            result.errors[item.request_id] = str(e)
                            sample = new_tuple(Sample, (0, True) + SAMPLE_REST)
                        result.samples[item.request_id] = sample
                        out += 1
            if plan.batches[Pool.EMBED]:
                self._embed(plan.batches[Pool.EMBED], result)
        self._decoded = []
        result.elapsed_ms = (time.perf_counter() - self._launched) * 1000.0
        return result

    def _follow_cores(self) -> None:
        """Every context takes the thread count the core watch gives for this step (n_threads 0, else the
        configured one), less the cores an image's encode is taking meanwhile (`Vision.busy`)."""
        threads = self.core_watch.threads() if self.core_watch else self.cfg.n_threads
        vision = self.vision
        if vision is not None and vision.busy and not vision.on_gpu:
            threads = max(1, threads - vision.threads)
        if threads != self.num_threads:
            for ctx in (self.ctx, self.ictx, self.embed_ctx, self.draft and self.draft.ctx):
                if ctx:
                    ll.llama_set_n_threads(ctx, threads, threads)
            self.num_threads = threads

    def _context(self, pool: Pool):
        return self._contexts[pool]

    def _memory(self, pool: Pool):
        return self._memories[pool]

    def _decode(self, plan: StepPlan, result: StepResult) -> list:
        """Each generating pool's `llama_decode`; returns what was decoded, (pool, items, rows) each."""
        decoded = []
        for pool in GENERATE:
            group = plan.batches[pool]
            if not group:
                continue
            ctx = self._context(pool)
            begun = []  # this pool's items with rounds of images kept before its last decode
            if self.vision is not None and any(min(i.tokens) < 0 for i in group):  # (a chunk of one placeholder too)
                begun = group
                group, rc = self._decode_images(pool, ctx, group)  # then its text's last rows, as below
                if rc != 0:
                    self._undo(decoded, rc, result)
                    return []
                if not group:
                    decoded.append((pool, begun, [], 0))
                    continue
            if plan.drafts:  # a drafted decode reads logits at every token (`verify`)
                drafts = plan.drafts
                rows = self.batch.fill([(i.seq_id, i.start, i.tokens,
                                         len(i.tokens) if i.request_id in drafts else i.sample) for i in group])
            else:
                rows = self.batch.fill([(i.seq_id, i.start, i.tokens, i.sample) for i in group])
            rc = ll.llama_decode(ctx, self.batch.c)
            if rc != 0:
                self._undo(decoded + [(pool, begun, None, 0)], rc, result)
                return []
            decoded.append((pool, group, rows, self.batch.num_outputs))
            if begun:  # (undone from each item's first token if a later pool fails; nothing sampled)
                decoded.append((pool, begun, [], 0))
        return decoded

    def _undo(self, decoded: list, rc: int, result: StepResult) -> None:
        """A decode failed: undo the contexts already decoded (the step keeps nothing). No KV slot
        (rc 1): llama.cpp restored the failed one's cache; the scheduler shrinks or preempts."""
        for done_pool, done, _, _ in decoded:
            for i in done:
                if not ll.llama_memory_seq_rm(self._memory(done_pool), i.seq_id, i.start, -1):
                    raise RunnerError(f"llama.cpp could not undo sequence {i.seq_id}'s step")
        if rc == 1:
            result.no_kv_slot = True
            return
        raise RunnerError(f"llama_decode failed with code {rc}")

    def _decode_images(self, pool: Pool, ctx, group: list[ScheduledItem]) -> tuple[list[ScheduledItem], int]:
        """A pool's step with image placeholders in it: each item's chunk in runs of text and of image
        (`vision.runs`), read in rounds, a run of each item a round, the runs aligned to the last round,
        so that every item's last rows (its sampled row) are in the last round's token batch, decoded
        last. Each round decodes its images' embeddings (`EmbdBatch`; causal attention off for a
        projector that reads an image whole), then its text. Returns the last round's text items (their
        tokens that last text run), for the caller's one `llama_decode` of them; and a failed decode's code
        (its rounds so far undone)."""
        split = [runs(i.tokens) for i in group]
        rounds = max(map(len, split))
        whole = self.vision.whole
        for r in range(rounds):
            last = r == rounds - 1
            images, texts = [], []
            for item, parts in zip(group, split):
                j = r - (rounds - len(parts))
                if j < 0:
                    continue
                is_image, offset, tokens = parts[j]
                if is_image:
                    images.append((item.seq_id, item.start + offset, self.vision.rows(np.asarray(tokens))))
                elif not last:
                    texts.append((item.seq_id, item.start + offset, tokens, False))
            rc = 0
            if images:
                self.embd_batch.fill_embeddings(images)
                if whole:
                    ll.llama_set_causal_attn(ctx, False)
                rc = ll.llama_decode(ctx, self.embd_batch.c)
                if whole:
                    ll.llama_set_causal_attn(ctx, True)
            if rc == 0 and texts:
                self.batch.fill(texts)
                rc = ll.llama_decode(ctx, self.batch.c)
            if rc != 0:
                for i in group if r else ():  # the rounds before were kept: undone too
                    if not ll.llama_memory_seq_rm(self._memory(pool), i.seq_id, i.start, -1):
                        raise RunnerError(f"llama.cpp could not undo sequence {i.seq_id}'s step")
                return [], rc
        tail = []
        for item, parts in zip(group, split):
            is_image, offset, tokens = parts[-1]
            if not is_image:
                tail.append(item._replace(start=item.start + offset, tokens=tokens))
        return tail, 0

    def _outputs(self, ctx, n: int) -> np.ndarray:
        """The logits of the context's last decode, in place: its `n` output rows (the batch's tokens
        flagged for logits), in batch order, one read for them all (a row at a time costs ~2.5 us more a row)."""
        address = ctypes.addressof(ll.llama_get_logits(ctx).contents)
        flat = np.frombuffer((ctypes.c_float * (n * self.n_vocab)).from_address(address), dtype=np.float32)
        return flat.reshape(n, self.n_vocab)

    def check_grammar(self, grammar: Grammar, timeout_s: float, member: str = "") -> str | None:
        """Why llama.cpp cannot take `grammar` within `timeout_s` (None: it can), tried in a grammar
        checker's process (`homeai.engine.grammar_check`), never first in this one; `member`'s
        checks take their turn with the others' (GrammarBusy: `member` has too many waiting)."""
        with _checker_lock:
            if self.grammar_checker is None:
                limits = self.grammar_limits
                self.grammar_checker = GrammarChecker(self.info.path, max_token_ms=limits.max_token_ms,
                                                      max_pending=limits.max_pending_checks_per_member)
        return self.grammar_checker.check(grammar.text, grammar.root, timeout_s, member)

    def grammar_ok(self, grammar: Grammar) -> bool:
        """Whether llama.cpp parses `grammar`: checked when a request is submitted, since a grammar
        that fails in the middle of a step would fail the step's other requests too. It is tried
        in the checker's process first (its answer is kept: the routes asked it already)."""
        if self.check_grammar(grammar, self.grammar_limits.build_timeout_s) is not None:
            return False
        sampler = grammar_sampler(self.vocab, grammar)  # its trigger patterns too
        if not sampler:
            return False
        ll.llama_sampler_free(sampler)
        return True

    def _embed(self, items: list[ScheduledItem], result: StepResult) -> None:
        """Mean-pool each input's chunk; an input spread over several steps keeps its cells in the
        embedding context (so later chunks attend to earlier ones) and its token-weighted sum here."""
        self.embed_batch.fill([(item.seq_id, item.start, item.tokens, True) for item in items])
        self.embed_batch.logits[: self.embed_batch.c.n_tokens] = 1
        rc = ll.llama_decode(self.embed_ctx, self.embed_batch.c)
        if rc != 0:
            raise RunnerError(f"embedding llama_decode failed with code {rc}")
        n_embd = ll.llama_model_n_embd(self.embed_model)
        for item in items:
            ptr = ll.llama_get_embeddings_seq(self.embed_ctx, item.seq_id)
            total = np.ctypeslib.as_array(ptr, shape=(n_embd,)).astype(np.float64) * len(item.tokens)
            if item.request_id in self._pooled:
                total += self._pooled.pop(item.request_id)
            if not item.sample:  # more chunks to come
                self._pooled[item.request_id] = total
                continue
            vec = (total / (item.start + len(item.tokens))).astype(np.float32)
            norm = float(np.linalg.norm(vec))
            result.embeddings[item.request_id] = vec / norm if norm > 0 else vec

    def decode_greedy(self, groups: list[tuple[Pool, list[tuple[int, int, list[int]]]]]) -> list[list[int]]:
        """Bare decodes: each group's rows (seq_id, start position, tokens) in its pool's context, one
        `llama_decode` a group, back to back over the one batch, then each row's greedy next token
        (every context decodes before any samples, as in `run`; picked as `run` picks greedy, every row
        from one read of the context's output rows). No plan,
        no sampler chain, nothing kept but the cells: the raw loops of `homeai.bench.raw_loop` are built on it."""
        decoded = []
        for pool, rows in groups:
            ctx = self._context(pool)
            last = self.batch.fill([(seq_id, start, tokens, True) for seq_id, start, tokens in rows])
            rc = ll.llama_decode(ctx, self.batch.c)
            if rc != 0:
                raise RunnerError(f"llama_decode failed with code {rc}")
            decoded.append((ctx, len(last)))
        return [self._outputs(ctx, n).argmax(axis=1).tolist() for ctx, n in decoded]

    def reset(self) -> None:
        """Forget every sequence and sampler (a new engine starts from an empty cache)."""
        self.sampler.free_all()
        self._pooled.clear()
        ll.llama_memory_clear(self.memory, True)
        if self.imemory:
            ll.llama_memory_clear(self.imemory, True)
        if self.embed_memory:
            ll.llama_memory_clear(self.embed_memory, True)
        if self.draft is not None:
            ll.llama_memory_clear(self.draft.memory, True)
            self.draft.held.clear()

    def close(self) -> None:
        if self.grammar_checker is not None:
            self.grammar_checker.stop()
        self.sampler.free_all()
        if self.draft is not None:
            self.draft.close()
        if self.vision is not None:
            self.vision.close()
        ll.llama_free(self.embed_ctx)
        if self.ictx:
            ll.llama_free(self.ictx)
        ll.llama_free(self.ctx)
        if self.embed_model is not self.model:
            ll.llama_model_free(self.embed_model)
        ll.llama_model_free(self.model)

