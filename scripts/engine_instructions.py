"""A step's Python cost without its decode, engine or raw loop, counted in instructions under callgrind.

    PYTHONPATH=. .venv/bin/python scripts/engine_instructions.py MODEL.gguf --side engine|raw \
        [--seqs 4] [--tokens 300]

Wall time on a shared box swings too far to compare the engine's overhead from one change to
the next; instructions swing far less. This runs one side of `homeai bench engine` (the engine on a
background lane, or the raw loop of `homeai.bench.raw_loop`), greedy, past end-of-generation,
with `llama_decode` made a no-op once every sequence decodes: each step then costs only what
Python does around the decode (the logits read are the last real decode's, as valid as any for
picking a token). Run it under callgrind twice, with `--tokens 300` and `--tokens 1500`; the
difference of the two counts over 1,200 is one step's instructions, every thread together (the
asyncio readers too), the model's load and the prompts' prefill cancelled out:

    PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python \
        scripts/engine_instructions.py /tmp/tiny.gguf --side engine --seqs 4 --tokens 300

The counts are not exact as the scheduler's alone are (`sched_step_cost.py --callgrind`): the
load and prefill vary by some millions of instructions from run to run (hence the long
difference), and the engine's threads meet at moments valgrind's pace decides; repeated runs of
one tree spread by a few percent. Under callgrind sixteen sequences are not all admitted at
once (the steps are slow, so the cost model reads their prompts in chunks beside decodes), so
the count of a step there is not a steady decode's: use one or four.

The engine's count less the raw loop's, at the same `--seqs`, is the engine's overhead a step
in instructions; a row's greedy pick (an argmax over the vocabulary) is in both.

`--side fake` needs no model (pass any path) and counts exactly: the engine and scheduler with a
fake runner (every row samples token 7, a step "takes" 1 ms), `--seqs` requests of the summaries
lane decoding `--tokens` tokens each (at least 1,400), background readers woken only at the end,
and callgrind counting steps 300 to 1,300 alone, every thread (run it with `--instr-atstart=no`;
the count over 1,000 is a step's). Its steps hold what the engine's do around a decode except the
runner's own part (the batch, the logits read, the greedy picks), which the raw loop pays too.
It runs where llama.cpp's CPU build uses instructions valgrind cannot run (AVX-512: `--side
engine` then dies in `ggml_cpu_init`):

    PYTHONPATH=. valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
        .venv/bin/python scripts/engine_instructions.py - --side fake --seqs 4 --tokens 1500

`--side collect` counts one part exactly instead: `Runner.collect` (a step's rows sampled, greedy)
called `--tokens` times over one decoded batch of `--seqs` rows, with callgrind counting only
around those calls (run it with `--instr-atstart=no`, at two `--tokens`, and divide the
difference by theirs):

    PYTHONPATH=. valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
        .venv/bin/python scripts/engine_instructions.py /tmp/tiny.gguf --side collect --seqs 4 --tokens 600
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from homeai.bench.engine_bench import _prompts
from homeai.bench.raw_loop import raw_batched_decode
from homeai.config import from_dict
from homeai.llama import runner as runner_mod
from homeai.engine import engine as engine_mod
from homeai.engine.engine import Engine, create_engine
from homeai.engine.intake import _last
from homeai.app import load_runner
from homeai.llama import Runner  # for its type
from homeai.sched.plan import ScheduledItem, StepPlan, StepResult
from homeai.sched.pools import Pool
from homeai.sched.request import Kind, Sample, SamplingParams
from homeai.sched.scheduler import SchedulerLimits
from lanes import DEFAULT_POLICIES


def decode_once_steady(num_seqs: int):
    """A `llama_decode` that runs until a step decodes every sequence, then does nothing for steps of
    at most that many tokens (a decode step's, or one whose finished sequences left); `arm()` restarts it."""
    real = runner_mod.ll.llama_decode
    state = {"steady": False}

    def decode(ctx, batch):
        if state["steady"] and batch.n_tokens <= num_seqs:
            return 0
        rc = real(ctx, batch)
        state["steady"] = batch.n_tokens == num_seqs
        return rc

    decode.arm = lambda: state.update(steady=False)
    return decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--side", choices=["engine", "raw", "collect", "fake"], required=True)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=300)
    args = ap.parse_args()
    if args.side == "fake":
        fake_engine(args.seqs, args.tokens)
        return
    cfg = from_dict({"model": {"path": str(args.model), "n_threads": 1}})
    runner = load_runner(cfg, embeddings=False, grammar=False)
    prompts = _prompts(runner, args.seqs)
    if args.side == "collect":
        collect_only(runner, prompts, args.tokens)
        return
    decode = runner_mod.ll.llama_decode = decode_once_steady(args.seqs)
    if args.side == "raw":
        runner.reset()
        raw_batched_decode(runner, prompts, args.tokens)
        return
    engine = create_engine(cfg, runner).start()
    try:
        decode.arm()
        tokens = asyncio.run(_engine_side(engine, prompts, args.tokens))
        assert tokens == args.seqs * args.tokens, tokens
    finally:
        engine.stop()


def collect_only(runner: Runner, prompts: list[list[int]], times: int) -> None:
    """`Runner.collect` `times` over one decode of the prompts (greedy, a row each), counted alone."""
    params = SamplingParams(temperature=0, max_tokens=times, ignore_eos=True)
    plan = StepPlan(0)
    plan.batches[Pool.MAIN] = [ScheduledItem(f"r{i}", Kind.GENERATE, i, 0, p, True, params) for i, p in enumerate(prompts)]
    runner.reset()
    runner.launch(plan)
    decoded = runner._decoded
    runner.collect(plan, StepResult())  # the samplers built, numpy warm
    _instrument("on")
    for _ in range(times):
        runner._decoded = decoded
        runner.collect(plan, StepResult())
    _instrument("off")


class _FakeRunner:
    """What the engine asks of a model, computing nothing: every sampled row gets token 7, a step takes
    1 ms by the cost model's clock; callgrind counts from step `first` to step `last`."""

    info = SimpleNamespace(max_seq_len=65536, interactive_max_seq_len=4096, embed_max_tokens=512, n_vocab=1000)
    SEVEN = Sample(7)  # (a sample is immutable: one serves every row)

    def __init__(self, first: int, last: int):
        self.steps, self.first, self.last = 0, first, last

    def reset(self) -> None:
        pass

    def piece(self, token: int) -> bytes:
        return b"x"

    def run(self, plan: StepPlan) -> StepResult:
        self.steps += 1
        if self.steps in (self.first, self.last):
            _instrument("on" if self.steps == self.first else "off")
        return StepResult(samples={i.request_id: self.SEVEN for i in plan.generating if i.sample}, elapsed_ms=1.0)


def fake_engine(num_seqs: int, num_tokens: int) -> None:
    """`--side fake`: steps 300 to 1,300 of `num_seqs` answers decoding in the engine, no model."""
    if num_tokens < 1400:
        raise SystemExit("--side fake counts steps 300 to 1,300: --tokens 1400 or more")
    engine_mod.BACKGROUND_WAKE_S = 1e9  # readers woken at the end alone: a count that does not follow the clock
    limits = SchedulerLimits(num_cells=65536, num_seqs=32, max_step_tokens=512, embed_max_tokens=2048,
                             embed_max_seqs=64)
    engine = Engine(_FakeRunner(300, 1300), dict(DEFAULT_POLICIES), limits).start()
    prompts = [[10 + (i * 131 + k) % 900 for k in range(40)] for i in range(num_seqs)]
    try:
        tokens = asyncio.run(_engine_side(engine, prompts, num_tokens))
        assert tokens == num_seqs * num_tokens, tokens
    finally:
        engine.stop()


def _instrument(on_off: str) -> None:
    """Turn callgrind's counting on or off for this process (nothing when not under callgrind)."""
    subprocess.run(["callgrind_control", "-i", on_off, str(os.getpid())], capture_output=True, check=False)


async def _engine_side(engine, prompts: list[list[int]], num_tokens: int) -> int:
    """`homeai bench engine`'s engine side, every request queued before any is admitted: under
    callgrind a lane's batching window passes while they are submitted, and sequences admitted in
    groups would read prompts in steps meant to be decodes alone."""
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    with engine.background_paused():
        streams = [engine.submit(p, lane="summaries", params=params) for p in prompts]
    return sum([(await _last(s)).stats.output_tokens for s in streams])


if __name__ == "__main__":
    main()
