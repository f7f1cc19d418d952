"""Benchmark metrics and reports: per policy, per lane, short and long apart; JSON and Markdown."""

from __future__ import annotations

from homeai.bench.driver import RequestRecord, RunResult
from homeai.engine.stats import percentile
from homeai.sched import costmodel


def _pcts(values: list[float], scale: float = 1000.0) -> dict:
    return {f"p{q}": (None if (v := percentile(values, q)) is None else round(v * scale, 2)) for q in (50, 95, 99)}


def group_metrics(records: list[RequestRecord], makespan: float, lane: dict | None) -> dict:
    done = [r for r in records if r.ok]
    ttft = [r.ttft for r in done if r.ttft is not None]
    itl = [x for r in done for x in r.itls]
    e2e = [r.finish - r.arrival for r in done]
    tokens = sum(len(r.token_times) for r in done)
    good = [r for r in done if _meets(r, lane)] if lane else done
    span = max(makespan, 1e-9)
    return {
        "requests": len(records), "succeeded": len(done),
        "success_rate": round(len(done) / len(records), 4) if records else None,
        "ttft_ms": _pcts(ttft), "itl_ms": _pcts(itl), "e2e_ms": _pcts(e2e),
        "throughput_req_s": round(len(done) / span, 3), "throughput_tok_s": round(tokens / span, 2),
        "prompt_tok_s": round(sum(r.spec.prompt_len for r in done) / span, 2),
        "goodput_req_s": round(len(good) / span, 3),
        "preemptions": sum(r.preemptions for r in records),
    }


def _meets(record: RequestRecord, lane: dict) -> bool:
    ttft_ok = record.ttft is not None and record.ttft * 1000 <= lane["ttft_target_ms"]
    itls = record.itls
    itl_ok = not itls or percentile(itls, 95) * 1000 <= lane["itl_target_ms"]
    return ttft_ok and itl_ok


def run_metrics(result: RunResult) -> dict:
    span = result.makespan
    lanes = {}
    for lane in sorted({r.spec.lane for r in result.records}):
        records = [r for r in result.records if r.spec.lane == lane]
        policy = result.lanes.get(lane)
        lanes[lane] = {"all": group_metrics(records, span, policy)}
        for group in ("short", "long"):
            part = [r for r in records if r.spec.group == group]
            if part and len(part) < len(records):
                lanes[lane][group] = group_metrics(part, span, policy)
    steps = result.steps
    return {
        "policy": result.policy, "workload": result.workload, "simulated": result.simulated,
        "makespan_s": round(span, 3), "overall": group_metrics(result.records, span, None),
        "lanes": lanes,
        "max_active_sequences": max((s.num_seqs for s in steps), default=0),
        "token_budget": {"max_step_tokens": result.limits["max_step_tokens"],
                         "mean_step_budget": round(sum(s.budget for s in steps) / len(steps), 1) if steps else 0,
                         "mean_step_tokens": round(sum(s.num_tokens for s in steps) / len(steps), 1) if steps else 0},
        "kv_cells": {"total": result.limits["num_cells"] + result.limits.get("interactive_cells", 0),
                     "interactive_cache": result.limits.get("interactive_cells", 0), "peak_used": max((s.kv_used for s in steps), default=0)},
        "preemptions": sum(r.preemptions for r in result.records),
        "backlogged_tok_s": backlogged_tok_s(result.records),
        "steps": len(steps),
        "step_cost_model_ms": costmodel.named(result.cost_model),
    }


def backlogged_tok_s(records: list[RequestRecord]) -> float | None:
    """Output tokens a second from the first arrival until the last request was admitted: the
    policy's throughput while it had more work than it ran. Unlike tokens over the makespan,
    it leaves out the drain at the end, which a few long requests set (when the longest one
    happened to start decides it, whatever the policy)."""
    admitted = [r.admitted for r in records if r.admitted is not None]
    finished = [r.finish for r in records if r.finish is not None]
    if not admitted or not finished:
        return None
    start, end = min(r.arrival for r in records), max(admitted)
    if end - start < 0.1 * (max(finished) - start):
        return None  # everything was admitted at once (fifo with room for all): no backlog to measure
    tokens = sum(1 for r in records for t in r.token_times if t <= end)
    return round(tokens / (end - start), 2)


def member_shares(result: RunResult, members: tuple[str, str], bucket_s: float = 2.0) -> dict:
    """Each member's share of scheduled tokens over time, and over the steps where both were backlogged."""
    if not result.steps:
        return {"series": [], "both_backlogged": None}
    t0 = result.steps[0].start
    buckets: dict[int, dict[str, int]] = {}
    both = {m: 0 for m in members}
    for s in result.steps:
        b = buckets.setdefault(int((s.start - t0) / bucket_s), {m: 0 for m in members})
        for m in members:
            b[m] += s.tokens_by_member.get(m, 0)
            if all(x in s.backlogged for x in members):
                both[m] += s.tokens_by_member.get(m, 0)
    series = []
    for k in sorted(buckets):
        total = sum(buckets[k].values())
        if total:
            series.append({"t_s": k * bucket_s, **{m: round(buckets[k][m] / total, 4) for m in members}})
    total = sum(both.values())
    return {"series": series,
            "both_backlogged": {m: round(both[m] / total, 4) for m in members} if total else None}


def markdown(report: dict) -> str:
    lines = [f"# homeai bench: {report['workload']}", ""]
    if report.get("simulated"):
        lines += [f"**This is a simulation** (step-cost model: {report['cost_profile']}); no model ran.", ""]
    lines += [f"Command: `{report['command']}`", "", f"Machine: {report.get('machine', '')}", "",
              "Workload: " + ", ".join(f"{k}: {v}" for k, v in report["params"].items()), ""]
    lines += ["## Per policy", "",
              "| policy | makespan s | tok/s | tok/s while backlogged | req/s | goodput req/s | success | max seqs | mean step tokens | KV peak | preemptions |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, m in report["policies"].items():
        o = m["overall"]
        lines.append(f"| {name} | {m['makespan_s']} | {o['throughput_tok_s']} | {m['backlogged_tok_s'] or '-'} | {o['throughput_req_s']} | "
                     f"{sum(l['all']['goodput_req_s'] for l in m['lanes'].values()):.3f} | {o['success_rate']} | "
                     f"{m['max_active_sequences']} | {m['token_budget']['mean_step_tokens']} | "
                     f"{m['kv_cells']['peak_used']}/{m['kv_cells']['total']} | {m['preemptions']} |")
    lines += ["", "## Per lane (ms: p50 / p95 / p99)", "",
              "| policy | lane | group | n | TTFT | ITL | end-to-end | tok/s | goodput req/s |",
              "|---|---|---|---:|---|---|---|---:|---:|"]
    fmt = lambda d: " / ".join("-" if v is None else f"{v:.0f}" for v in d.values())
    for name, m in report["policies"].items():
        for lane, groups in m["lanes"].items():
            for group, g in groups.items():
                lines.append(f"| {name} | {lane} | {group} | {g['requests']} | {fmt(g['ttft_ms'])} | {fmt(g['itl_ms'])} | "
                             f"{fmt(g['e2e_ms'])} | {g['throughput_tok_s']} | {g['goodput_req_s']} |")
    for title, body in report.get("findings", {}).items():
        lines += ["", f"## {title}", ""] + [f"* {line}" for line in body]
    if report.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]]
    return "\n".join(lines) + "\n"
