"""The configuration's sections and keys: frozen dataclasses, one a section, with their defaults
(every key documented in `config.example.toml`), and `ConfigError`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from lanes import DEFAULT_POLICIES, LanePolicy


class ConfigError(ValueError):
    """A configuration problem, with the file and key it comes from."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"  # a non-loopback address exposes the box to the network: keep auth on
    port: int = 8700
    data_dir: str = ""  # empty: $XDG_DATA_HOME/homeai or ~/.local/share/homeai
    cors_origins: tuple[str, ...] = ()  # empty: same origin only
    # Host names this server answers to besides IP addresses, localhost and the machine's own
    # name (e.g. "homeai.lan", or a reverse proxy's public name); any other Host gets 421.
    allowed_hosts: tuple[str, ...] = ()
    metrics_public: bool = False  # serve /metrics without a token even when auth is required (a LAN Prometheus)
    max_body_bytes: int = 4_000_000  # a larger request body is refused with 413
    max_messages: int = 256  # a chat request with more messages is refused with 400
    max_output_tokens: int = 4096  # a larger max_tokens is refused with 400 (the context's edge also ends an answer)
    max_ws_message_bytes: int = 1_048_576  # a larger WebSocket message closes its socket (1009)
    max_websockets_per_member: int = 4  # open WebSockets (voice) per member; more are refused
    # Sockets still waiting for their token (10 s each at most) per client address; more are refused.
    # Behind a reverse proxy every client has the proxy's address: raise it there.
    max_unauthenticated_websockets_per_address: int = 8
    api_docs: bool = False  # serve /docs and /redoc: their pages load scripts from a CDN, outside the CSP
    shutdown_grace_s: float = 10.0  # on SIGTERM, requests in flight get this long to finish before they are cut short
    header_timeout_s: float = 10.0  # a client that has not sent a whole request head by then is dropped
    # A request body must keep coming (homeai.api.http_server): no byte for body_timeout_s, or fewer than
    # body_min_rate bytes a second on average past its first body_timeout_s, and it is answered 408 and
    # closed. A lower rate lets a slower link upload; each body that slow holds a connection that long.
    body_timeout_s: float = 10.0
    body_min_rate: int = 4096
    # Open HTTP connections in all, and from one client address; one more is closed at once (each is a
    # file: the caps stay below the open-file limit, which `homeai doctor` shows beside them). 0: derived
    # from the limit, a quarter of it (at least 256) kept for the model, database, Wyoming and speech,
    # and at most 4096. Behind a reverse proxy every client has the proxy's address: raise the second there.
    max_connections: int = 0
    max_connections_per_address: int = 64


@dataclass(frozen=True)
class AuthConfig:
    required: bool = False  # false is allowed only on a loopback address


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""  # a GGUF file or a local model's name (`homeai models`); empty: the embedded SmolLM2-135M-Instruct
    embedding_path: str = ""  # a GGUF or local model for embeddings; empty: the generation model, mean-pooled
    # KV cells of the main cache (background lanes; every lane if interactive_n_ctx is 0).
    # 0: the model's training context, within kv_memory_share (homeai.engine.kvsize; doctor says).
    n_ctx: int = 0
    # KV cells of a second cache for the interactive lanes (voice, chat): their tokens then attend
    # only to each other, not to long background documents (on a CPU a chat's prompt read 2x faster
    # beside a 3,000-token document), at the cost of one more decode call per mixed step.
    # -1: sized from the model as n_ctx's 0 (a client's long tool list fits as it fits the model); 0: one cache.
    interactive_n_ctx: int = -1
    # Most of the memory free at load (RAM, or the GPU's with layers offloaded) the caches sized from
    # the model may take together; past it they get fewer cells than the training context.
    kv_memory_share: float = 0.25
    n_seq_max: int = 32  # sequences decoding at once: more batches better, each needs cells
    n_batch: int = 512  # most tokens in one step: larger steps raise throughput and latency
    # 0: every core while the rest of the box is idle, a core fewer for each core other processes keep
    # busy (homeai.threads.CoreWatch, asked before each step); a number: always that many
    n_threads: int = 0
    n_gpu_layers: int = -1  # layers offloaded to the GPU; -1: all (a CPU-only build offloads none)
    # CUDA graphs: faster single-sequence decode, but they aborted with two generation contexts;
    # auto: off exactly then (two caches, interactive_n_ctx != 0, on a GPU), on | off: as said (homeai.engine.gpu)
    cuda_graphs: str = "auto"
    use_extra_bufts: bool = False  # llama.cpp's CPU repack/AMX buffers: faster, but segfault on some CPUs
    flash_attn: str = "auto"  # on | off | auto: on with GPU offload, off on the CPU (slow there for long contexts)
    embed_n_ctx: int = 2048  # cells of the embedding context: tokens of inputs in flight (and the longest input)
    embed_n_seq_max: int = 64  # embedding inputs in flight at once
    # The turn format: empty, the GGUF's own chat template, or (when it has none) one chosen from the
    # model's architecture and tokenizer; else a known family's name (`homeai doctor` lists them) or a
    # Jinja2 template file, used instead of the GGUF's.
    chat_template: str = ""
    # A vision projector beside the model (llama.cpp's mmproj GGUF, or a local model's name: `homeai pull
    # --mmproj` fetches a repository's): images in chats are then understood. Empty: images are refused.
    mmproj: str = ""


@dataclass(frozen=True)
class LimitsConfig:
    """What one request may bring besides text (images: `homeai.api.images`)."""

    max_image_bytes: int = 2_500_000  # one image's file size (also within server.max_body_bytes, as base64)
    # One image's pixels once decoded: a larger image is scaled down to fit, unless its file declares
    # more than 4 times this (64 for a JPEG: a decompression bomb), refused before any pixel is decoded.
    max_image_pixels: int = 4_194_304  # 2048 x 2048
    max_images: int = 4  # images in one request (all its messages together)


@dataclass(frozen=True)
class SchedulerConfig:
    w_in: float = 1.0  # fair-share cost of a prompt token
    w_out: float = 2.0  # fair-share cost of an output token
    background_min_share: float = 0.1  # share of each step kept for background work when backlogged
    min_chunk: int = 16  # smallest prefill chunk worth scheduling
    max_step_ms: float = 120.0  # a step never aims past this: an interactive arrival waits at most one step
    prompt_cache: bool = True  # keep finished requests' KV as prefixes later prompts start from (false: measure without)
    prompt_cache_max_cells: int = 0  # KV cells cached prefixes may hold per cache; 0: any the live requests leave free
    # A cached prefix is reused only by the member whose request made it (and text no member wrote,
    # the template's default system prompt or a lane's prompt, by everyone). true: any member reuses
    # any member's prefixes: faster for a household that shares long prompts, but a member can then
    # tell from timings and cached_tokens what another member sent.
    prompt_cache_shared: bool = False
    # Most running sequences one member holds in the interactive lanes (voice and chat share their
    # readers), as a share of those readers, while another member's request waits there; the rest
    # are kept for the other members (an over-share member's newest is preempted). 1: no cap.
    member_seq_share: float = 0.5
    # Plan each step while the one before computes (its ends of generation and its time then reach
    # the plan a step late): on | off | auto: on with GPU offload, whose llama_decode returns before
    # it has computed; off on a CPU, where llama_decode computes before returning and nothing overlaps.
    plan_ahead: str = "auto"


@dataclass(frozen=True)
class SpeculativeConfig:
    """Drafted tokens for the answers people wait for (speculative decoding: `homeai.sched.draft`).
    Guesses come from the request's own prompt and answer so far (prompt lookup); each step checks
    them in the same llama_decode as everyone else's tokens, and keeps those the model picks itself,
    so answers are the same. The scheduler drafts only while it pays, by what it learnt of each
    member's accepted guesses and of the step's cost on this box, and never for a model whose cache
    cannot be cut back (sliding-window or recurrent)."""

    enabled: bool = True
    max_draft: int = 8  # the most tokens one answer drafts in a step (1..32)
    lanes: tuple[str, ...] = ()  # the lanes whose answers draft; empty: the interactive lanes (voice, chat)
    # A smaller model with the same vocabulary (a GGUF file, or a local model's name: `homeai pull` fetches
    # one), guessing where an answer's own tokens guess nothing; empty: none
    draft_path: str = ""


@dataclass(frozen=True)
class DatabaseConfig:
    url: str = ""  # any SQLAlchemy URL; empty: SQLite in the data directory


@dataclass(frozen=True)
class SpeechConfig:
    model: str = ""  # a faster-whisper model directory; empty: the embedded tiny.en
    device: str = "cpu"  # "cpu" or "cuda"
    compute_type: str = "int8"  # int8 on the CPU, float16 on a GPU
    workers: int = 1  # transcriptions run at once
    max_utterance_s: float = 30.0  # longer utterances are refused
    # While a spoken question is transcribed, background lanes take no steps: on a CPU they share
    # its cores with speech-to-text and slow it several times over. Off on a GPU box, if you like.
    pause_background: bool = True


@dataclass(frozen=True)
class TtsConfig:
    """Speech out (`homeai.speech.tts`): piper, the embedded en_US-joe-medium voice by default."""

    enabled: bool = True  # false: no synthesis (/v1/audio/speech answers tts_unavailable); chat is unaffected
    voice: str = ""  # a piper .onnx voice (its .onnx.json beside it); empty: the embedded voice
    workers: int = 1  # sentences synthesised at once; each takes a core from llama.cpp while it runs
    threads: int = 1  # onnxruntime threads per synthesis; 0: one per core (faster alone, slower beside the model)
    max_chars: int = 4000  # longer text is refused (400 naming the field)
    # While a voice answer's first sentence is synthesised, background lanes take no steps: the first
    # audio waits on it, and on a CPU background prefill shares its cores.
    pause_background: bool = True
    # Syntheses open at once (a text, or a spoken answer, from its first sentence until it ends or its
    # listener leaves, however slowly they read): more wait longer for the workers rather than cost memory.
    max_pending: int = 24
    # One member's (or a proxy user's) own open syntheses: one more is a 429 naming this, for them
    # alone; lower keeps more room for others, higher lets one client read more texts aloud at once.
    max_pending_per_member: int = 8
    voice_reserve: int = 4  # of max_pending, kept for the voice lane: chat and background never take them


@dataclass(frozen=True)
class WyomingConfig:
    """Speech to text for Home Assistant's voice pipeline over the Wyoming protocol (`homeai.wyoming`).
    Wyoming has no authentication: who may connect is decided by address alone."""

    enabled: bool = False
    host: str = "127.0.0.1"  # a non-loopback address needs allow_from: anyone who can connect can transcribe
    port: int = 10300  # Wyoming's usual port; 0: any free one (tests)
    allow_from: tuple[str, ...] = ()  # client addresses or networks ("192.168.1.20", "10.0.0.0/24"); empty: any
    max_frame_bytes: int = 1_048_576  # a larger header line, data or payload closes the connection
    zeroconf: bool = False  # advertise _wyoming._tcp.local. so Home Assistant discovers it (needs a LAN host)
    zeroconf_name: str = "homeai"  # the advertised service's name
    max_connections: int = 16  # open connections at once; more are closed at once
    max_connections_per_address: int = 4  # open connections from one client address
    max_audio_bytes: int = 3_000_000  # audio one connection may buffer (about 30 s at 48 kHz mono PCM16)
    member: str = ""  # the member Wyoming clients act as: it must be allowed the voice lane; "": no check
    # transcript-start, a transcript-chunk per segment, transcript, transcript-stop: for clients that read
    # on to `transcript` (Home Assistant does); off: the one `transcript` event older clients wait for
    transcript_streaming: bool = False


@dataclass(frozen=True)
class GrammarConfig:
    """Bounds on the JSON schemas and tool definitions turned into grammars (`homeai.tools`): a schema
    past them is refused with a 400 naming the field, before its grammar is built."""

    max_schema_bytes: int = 65_536  # a schema (or all of a request's tools) as JSON
    max_repeat: int = 1000  # minItems/maxItems, minLength/maxLength, and other bounded repetitions
    # Alternatives at one place: an enum's values, anyOf branches, properties; and a request's tools (each costs every token)
    max_enum: int = 256
    max_grammar_bytes: int = 262_144  # the GBNF text the schema becomes
    build_timeout_s: float = 5.0  # longest a grammar may take to build, off the engine thread
    # One token's weighing against the whole vocabulary (in the engine's chunks), in the checker's CPU time,
    # past which a grammar is refused. With SmolLM2's 49k tokens on a 2-core box: a plain schema 3-20 ms,
    # the widest the bounds admit (256 alternatives or 200 properties at one place) up to ~150 ms, nested
    # repeats ~90 ms (depth 3), ~1.2 s (depth 4), seconds more each level. Scale it with a larger vocabulary
    # (3x the tokens: about 3x the time) or a slower CPU
    max_token_ms: float = 400.0
    # Longest one member's grammars may take together to pick their tokens within a shared step (wall time);
    # the request that runs past it ends with an error instead of holding everyone's step. What passes the checker, with room for a
    # loaded box (a whole pass is needed only when the model's pick is refused and its best tokens cannot
    # decide). Higher: slower grammars allowed, longer stalls for every member; lower: wide enums may fail
    step_budget_ms: float = 500.0
    max_pending_checks_per_member: int = 2  # new grammars a member may have waiting or being checked; more: 429


@dataclass(frozen=True)
class JobsConfig:
    index_paths: tuple[str, ...] = ()  # folders (or files) the index job reads; empty: nothing to index
    schedule: str = ""  # "every 6h", or a cron line "0 3 * * *"; empty: on demand only
    misfire_grace_s: int = 3600  # a run missed while homeai was down still starts this long after
    chunk_tokens: int = 256  # smaller chunks match more precisely but make more to embed (capped by embed_n_ctx)
    chunk_overlap: int = 32  # tokens shared by neighbouring chunks, so a cut sentence is still found
    embed_batch: int = 64  # chunks handed to the indexing lane at once: bigger batches, more waiting
    summarise: bool = True  # summarise new and changed documents through the summaries lane
    summary_tokens: int = 160  # longest summary (and each partial one of a long document)


@dataclass(frozen=True)
class ClientsConfig:
    """Clients that cannot send homeai's lane header, recognised by what they send (`homeai.service.clients`)."""

    # Open WebUI's background tasks (title, tags, follow-ups: a prompt opening "### Task:") asked on the
    # chat lane go to this lane when the member may use it; empty: they stay on the chat lane
    background_task_lane: str = "summaries"
    # From a member marked as a trusted proxy (`homeai members add owui --proxy`), this header names the
    # person asking (Open WebUI sends it with ENABLE_FORWARD_USER_INFO_HEADERS=true): each is shared
    # fairly as a key of their own; from anyone else it is ignored. Empty: no member's header counts
    proxy_user_header: str = "X-OpenWebUI-User-Id"
    # A proxy's users share the client's preamble from the prompt cache: its tool definitions, and with
    # this on its system messages before the first user message too. Off: a prompt that opens with a
    # system message shares none of it, since Open WebUI lets each user write one (their System Prompt,
    # their Memory) that another user could read back through `cached_tokens`. On: only when that text
    # is the client's own (its admin's model prompt), never a user's
    proxy_system_text_shared: bool = False
    # A short name for the served model (e.g. "home": `home`, `home:chat`, `home:summaries`), listed beside the
    # file's name in /v1/models and /api/tags and taken as a model name (a client's model picker cuts long names);
    # empty: none
    model_alias: str = ""


@dataclass(frozen=True)
class RemoteConfig:
    """A lane served by another OpenAI-compatible server (`[remote.<lane>]`); fair share and the
    lane's bounded queue still apply here, before dispatch."""

    url: str = ""  # the remote's OpenAI base URL, e.g. "http://gpu-box:8700/v1"
    model: str = ""  # the model to ask the remote for; empty: whatever the client asked for
    api_key: str = field(default="", repr=False)  # sent as "Authorization: Bearer ..."; empty: none
    concurrency: int = 4  # requests in flight to the remote; more wait here, in fair-share order
    timeout_s: float = 120.0  # longest silence from the remote (connecting, answering, between chunks): 504
    fallback_local: bool = False  # when the remote fails or times out, answer with the local model instead


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    wyoming: WyomingConfig = field(default_factory=WyomingConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    clients: ClientsConfig = field(default_factory=ClientsConfig)
    lanes: dict[str, LanePolicy] = field(default_factory=lambda: dict(DEFAULT_POLICIES))
    remotes: dict[str, RemoteConfig] = field(default_factory=dict)  # lane -> its remote server
    source: str = "(built-in defaults)"

    @property
    def data_dir(self) -> Path:
        if self.server.data_dir:
            return Path(self.server.data_dir).expanduser()
        xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(xdg) / "homeai"

    @property
    def database_url(self) -> str:
        return self.database.url or f"sqlite:///{self.data_dir / 'homeai.db'}"


SECTIONS = {
    "server": ServerConfig, "auth": AuthConfig, "model": ModelConfig,
    "scheduler": SchedulerConfig, "speculative": SpeculativeConfig, "limits": LimitsConfig, "database": DatabaseConfig, "speech": SpeechConfig, "tts": TtsConfig, "jobs": JobsConfig,
    "wyoming": WyomingConfig, "grammar": GrammarConfig, "clients": ClientsConfig,
}
# Lanes the OpenAI routes dispatch; voice answers on its socket and indexing feeds the local index.
REMOTE_LANES = ("chat", "summaries", "embeddings")
HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?")
LANE_KEYS = {"weight", "window_ms", "max_batch", "max_queue", "ttft_target_ms", "itl_target_ms", "max_tokens"}
