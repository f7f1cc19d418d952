"""How many KV cells each generation cache gets, and what they cost, when the config leaves it to the model.

A cache sized from the model (`model.n_ctx = 0`, `model.interactive_n_ctx = -1`, the defaults)
holds the model's training context: the longest prompt and answer the model reads well, so a
client's long prompt fits the interactive lanes' cache as it fits the model (Open WebUI sends
its 36 built-in tools with each message: 6,614 tokens for SmolLM2, trained on 8,192). A cell
costs K and V in every layer (`Shape.kv_bytes`), and on the CPU also a row of attention scores
for each token a step reads (`Shape.scratch_bytes`; llama.cpp's compute buffer grows with the
cache: 99 MiB at 4,096 cells, 166 MiB at 8,192, SmolLM2, 512-token steps). The caches sized from
the model together take at most `model.kv_memory_share` of the memory free at load (the GPU's
when layers are offloaded, else RAM); past that they share it equally, in whole steps of
`ROUND` cells, and never below one step's tokens. A size the config gives is taken as given.
"""

from __future__ import annotations

from dataclasses import dataclass

ROUND = 256  # llama.cpp pads the cells a step attends over to 256
MIN_CELLS = 256  # the config's own floor for model.n_ctx
AUTO_MAIN = 0  # model.n_ctx: from the model
AUTO_INTERACTIVE = -1  # model.interactive_n_ctx: from the model (0: one cache for every lane)
EMBEDDED_TRAIN_CTX = 8192  # SmolLM2-135M-Instruct's training context, for simulations (no model loaded)


@dataclass(frozen=True)
class Shape:
    """What a model's KV cells cost, from its GGUF (f16 K and V, llama.cpp's default)."""

    n_ctx_train: int
    n_layer: int
    n_head: int
    n_embd_k: int  # K's width for one token in one layer: KV heads times key length
    n_embd_v: int
    n_batch: int  # tokens one step reads: the rows of attention scores a cell needs
    flash_attn: bool  # fused attention keeps no score rows

    @property
    def kv_bytes(self) -> int:
        return self.n_layer * (self.n_embd_k + self.n_embd_v) * 2

    @property
    def scratch_bytes(self) -> int:
        return 0 if self.flash_attn else self.n_batch * self.n_head * 4

    @property
    def cell_bytes(self) -> int:
        return self.kv_bytes + self.scratch_bytes


@dataclass(frozen=True)
class Sizes:
    """The cells of the main and the interactive cache (0: none of its own), and why."""

    main: int
    interactive: int
    shape: Shape
    budget_bytes: int  # what the caches sized from the model could take (0: none was)
    note: str

    def describe(self) -> dict[str, str]:
        """Cells and bytes per cache, as `homeai doctor` and /healthz show them."""
        out = {}
        for name, cells in (("main", self.main), ("interactive", self.interactive)):
            if cells:
                out[name] = (f"{cells} cells, KV {_mib(cells * self.shape.kv_bytes)}"
                             + (f" + attention scratch {_mib(cells * self.shape.scratch_bytes)}"
                                if self.shape.scratch_bytes else ""))
        out["sizing"] = self.note
        return out


def plan(shape: Shape, *, n_ctx: int, interactive_n_ctx: int, free_bytes: int, share: float) -> Sizes:
    """Cells for each generation cache: as configured, or from the model within the memory budget."""
    auto = [name for name, value, flag in (("main", n_ctx, AUTO_MAIN),
                                            ("interactive", interactive_n_ctx, AUTO_INTERACTIVE)) if value == flag]
    given = {"main": n_ctx, "interactive": max(interactive_n_ctx, 0)}
    if not auto:
        return Sizes(given["main"], given["interactive"], shape, 0, "as configured")
    budget = int(free_bytes * share) - sum(given[n] for n in given if n not in auto) * shape.cell_bytes
    floor = _round_up(max(shape.n_batch, MIN_CELLS))
    each = max(_round_up(shape.n_ctx_train), floor)
    fitted = (budget // len(auto) // shape.cell_bytes) // ROUND * ROUND
    cells = max(min(each, fitted), floor)
    if cells == each:
        note = f"the model's training context ({shape.n_ctx_train} tokens)"
    else:
        note = (f"{share:g} of {_mib(free_bytes)} free (model.kv_memory_share), less than the model's "
                f"training context ({shape.n_ctx_train} tokens)")
    sized = {**given, **{name: cells for name in auto}}
    return Sizes(sized["main"], sized["interactive"], shape, max(budget, 0), note)


def _round_up(cells: int) -> int:
    return -(-cells // ROUND) * ROUND


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.0f} MiB"


def without_model(n_ctx: int, interactive_n_ctx: int) -> tuple[int, int]:
    """Cells of the main and interactive caches for a simulation, which loads no model: a cache
    sized from the model gets the embedded model's training context."""
    main = n_ctx if n_ctx != AUTO_MAIN else EMBEDDED_TRAIN_CTX
    return main, (EMBEDDED_TRAIN_CTX if interactive_n_ctx == AUTO_INTERACTIVE else interactive_n_ctx)
