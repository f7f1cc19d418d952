"""`homeai bench grammar`: what a grammar costs decoding (structured output and tool calls).

Run: `homeai bench grammar [--seqs 1,8] [--tokens 64]`. For each number of sequences, the same
engine decodes greedily on a background lane (every sequence at once) in three ways:

* free text (past end-of-generation, so every sequence makes `--tokens` tokens);
* held to a JSON schema (an array of at least 64 short strings: the grammar is active for every
  token, and the reply cannot end before `--tokens`);
* with the generic tool format's lazy grammar (two Home Assistant-shaped tools) on questions the
  model answers in words, so the grammar waits for a trigger that never comes.

Decode tok/s is taken from the inter-token gaps (prefill excluded): sequences / mean gap. The
three ways take turns, `--reps` rounds, and each reports its median: a shared box's noise
otherwise moves a ratio by 10-20%.
Targets (issue 19): schema >= 0.7x free text, lazy-never-triggered >= 0.97x.
"""

from __future__ import annotations

import asyncio
import statistics

from homeai import tools
from homeai.bench.engine_bench import QUESTIONS
from homeai.engine.engine import Engine
from homeai.sched.request import Grammar, SamplingParams

LONG_LIST = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                        "minItems": 64}}, "required": ["items"]}
HA_TOOLS = [{"type": "function", "function": {"name": "HassTurnOn", "description": "Turns on a device",
                                              "parameters": {"type": "object", "properties": {
                                                  "name": {"type": "string"}, "area": {"type": "string"},
                                                  "domain": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "GetLiveContext", "description": "The home's current state"}}]


def _grammars(converter: tools.SchemaConverter) -> dict[str, Grammar | None]:
    plan = tools.plan(HA_TOOLS, "auto", template_source=None, converter=converter)
    return {"free": None,
            "json_schema": tools.response_format_grammar({"type": "json_schema",
                                                          "json_schema": {"name": "list", "schema": LONG_LIST}},
                                                         converter=converter),
            "lazy_untriggered": plan.grammar()}


async def _decode(engine: Engine, n: int, num_tokens: int, grammar: Grammar | None) -> dict:
    runner = engine.runner
    prompts = [runner.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" (#{i})"}])
               for i in range(n)]
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=grammar is None, grammar=grammar)
    done = await asyncio.gather(*[engine.generate(p, lane="summaries", params=params) for p in prompts])
    gaps = [g for _, finish in done for g in finish.stats.itls_ms]
    mean_gap_ms = sum(gaps) / len(gaps)
    return {"tok_s": n * 1000.0 / mean_gap_ms, "tokens": sum(f.stats.output_tokens for _, f in done),
            "triggered": sum(text.lstrip().startswith("{") for text, _ in done)}


def grammar_throughput(engine: Engine, seqs: list[int], num_tokens: int, reps: int = 3, progress=None) -> list[dict]:
    grammars = _grammars(engine.runner.schema_converter)
    rows = []
    for n in seqs:
        runs = {name: [] for name in grammars}
        for _ in range(reps):
            for name, g in grammars.items():
                runs[name].append(asyncio.run(_decode(engine, n, num_tokens, g)))
        tok_s = {name: statistics.median(r["tok_s"] for r in rs) for name, rs in runs.items()}
        rows.append({"seqs": n, **{f"{name}_tok_s": v for name, v in tok_s.items()},
                     "json_schema_ratio": tok_s["json_schema"] / tok_s["free"],
                     "lazy_ratio": tok_s["lazy_untriggered"] / tok_s["free"],
                     "lazy_triggered": sum(r["triggered"] for r in runs["lazy_untriggered"])})
        if progress:
            progress(rows[-1])
    return rows


def report(rows: list[dict]) -> str:
    lines = ["| sequences | free tok/s | json_schema tok/s | ratio (>= 0.7) | lazy, untriggered tok/s | ratio (>= 0.97) |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seqs']} | {r['free_tok_s']:.1f} | {r['json_schema_tok_s']:.1f} | {r['json_schema_ratio']:.2f} "
              f"| {r['lazy_untriggered_tok_s']:.1f} | {r['lazy_ratio']:.2f} |" for r in rows]
    triggered = sum(r["lazy_triggered"] for r in rows)
    if triggered:
        lines.append(f"\n{triggered} lazy-grammar replies opened with '{{' (triggered): their rows are not clean")
    return "\n".join(lines)
