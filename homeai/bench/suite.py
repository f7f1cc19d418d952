"""`homeai bench continuous|household|fairness`: run a workload under every policy, side by side.

All policies run in one process on the same loaded model (or the same step-cost model when
simulating), one after the other. Output: `<out>/<workload>.json`, `<out>/<workload>.md`
and PNG plots. A progress bar counts finished requests.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from homeai.bench import plots, report, workloads
from homeai.bench.driver import RunResult, SimRunner, run
from homeai.bench.policies import POLICIES
from homeai.sched import costmodel
from homeai.sched.scheduler import SchedulerLimits
from lanes.base import LanePolicy

BACKGROUND = {"summaries", "indexing", "embeddings"}

# Step-cost profiles for simulation (homeai.sched.costmodel): milliseconds per step =
# base + per_token * tokens + per_token_per_kcell * tokens * KV cells in use / 1000 + per_output * outputs.
PROFILES = {
    "cpu-smollm2": (11.0, 3.4, 1.2, 1.0),  # SmolLM2-135M Q4_1 on 2 CPU threads, fitted here
    "gpu-consumer-8b": (12.0, 0.12, 0.01, 0.05),  # an 8B Q4 model on a 24 GB consumer GPU (about 8k tok/s prefill)
    "cpu-desktop-8b": (85.0, 12.0, 1.5, 1.0),  # an 8B Q4 model on an 8-core desktop CPU (about 10 tok/s alone)
}


class Bench:
    def __init__(self, lanes: dict[str, LanePolicy], limits: SchedulerLimits, runner=None,
                 profile: str | None = None, out: Path = Path("bench-out"), quiet: bool = False,
                 plan_ahead: bool = False):
        self.lanes, self.limits, self.out, self.quiet = lanes, limits, Path(out), quiet
        self.plan_ahead = plan_ahead  # each step planned while the one before runs (scheduler.plan_ahead)
        self.simulated = runner is None
        self.profile = profile or "cpu-smollm2"
        self.runner = runner or SimRunner(*load_profile(self.profile))
        self.out.mkdir(parents=True, exist_ok=True)

    def run(self, workload, policy: str, lanes=None, max_seconds: float = 900.0) -> RunResult:
        with tqdm(total=len(workload.specs), desc=f"{workload.name} / {policy}", unit="req",
                  disable=self.quiet, file=sys.stderr, leave=False) as bar:
            return run(workload, policy, lanes or self.lanes, self.limits, self.runner,
                       simulated=self.simulated, progress=bar, max_seconds=max_seconds, plan_ahead=self.plan_ahead)

    def compare(self, workload, policies=POLICIES) -> dict[str, RunResult]:
        return {p: self.run(workload, p) for p in policies}

    def finish(self, name: str, workload, results: dict[str, RunResult], findings: dict, plot_paths: list[Path],
               extra: dict | None = None) -> dict:
        doc = {
            "workload": name, "params": workload.params, "simulated": self.simulated,
            **({"plan_ahead": True} if self.plan_ahead else {}),
            "cost_profile": f"{self.profile} {load_profile(self.profile)}" if self.simulated else None,
            "command": "homeai " + shlex.join(sys.argv[1:]) if "bench" in sys.argv[1:] else "homeai bench",
            "machine": _machine(self.runner),
            "limits": self.limits.__dict__, "policies": {p: report.run_metrics(r) for p, r in results.items()},
            "findings": findings, "plots": [p.name for p in plot_paths], **(extra or {}),
        }
        (self.out / f"{name}.json").write_text(json.dumps(doc, indent=2, default=str))
        (self.out / f"{name}.md").write_text(report.markdown(doc))
        return doc


def load_profile(profile: str) -> tuple[float, ...]:
    if profile in PROFILES:
        return PROFILES[profile]
    data = json.loads(Path(profile).read_text())  # a report from a real run: its fitted step-cost model
    cost = data["policies"]["homeai"]["step_cost_model_ms"]
    return tuple(float(cost.get(name, 0.0)) for name in costmodel.NAMES)


def _machine(runner) -> str:
    cores = os.cpu_count()
    info = getattr(runner, "info", None)
    model = f"{info.description} ({Path(info.path).name}, {info.size_bytes / 1e6:.0f} MB), " if info else ""
    return f"{model}{platform.processor() or platform.machine()}, {cores} cores"


def _ratio(a, b):
    return round(a / b, 3) if a and b else None


def continuous_bench(bench: Bench, n: int = 32, mean_output: int = 128, rate: float | None = None,
                     seed: int = 0) -> dict:
    workload = workloads.continuous(n=n, mean_output=mean_output, rate=rate, seed=seed)
    results = bench.compare(workload)
    m = {p: report.run_metrics(r) for p, r in results.items()}
    tput = {p: x["overall"]["throughput_tok_s"] for p, x in m.items()}
    busy = {p: x["backlogged_tok_s"] for p, x in m.items()}
    waited = lambda p: f", {_ratio(busy['homeai'], busy[p])} while requests waited" if busy[p] and busy["homeai"] else ""
    findings = {"Targets": [
        f"homeai / {p} throughput: {_ratio(tput['homeai'], tput[p])} over the makespan{waited(p)} ({goal})"
        for p, goal in (("fifo", "target >= 0.95"), ("static", "target > 1"),
                        ("serial", "target > 1; ~1.7 on this CPU"))]}
    plot_paths = [plots.ttft_by_lane(results, bench.out / "continuous_ttft.png")]
    return bench.finish("continuous", workload, results, findings, plot_paths,
                        {"throughput_tok_s": tput, "backlogged_tok_s": busy})


def household_bench(bench: Bench, duration_s: float = 40.0, seed: int = 0, doc_len: int = 2000,
                    documents: int = 2, embed_batch_size: int = 16, summary_len: int = 120) -> dict:
    workload = workloads.household(duration_s=duration_s, seed=seed, doc_len=doc_len, documents=documents,
                                   summary_len=summary_len, embed_batch_size=embed_batch_size)
    results = bench.compare(workload)
    quiet = bench.run(workload.without_lanes(BACKGROUND), "homeai")
    alone = bench.run(workload.only_lanes(BACKGROUND), "homeai")
    m = {p: report.run_metrics(r) for p, r in results.items()}
    quiet_m, alone_m = report.run_metrics(quiet), report.run_metrics(alone)
    chat_p95 = {p: x["lanes"]["chat"]["all"]["ttft_ms"]["p95"] for p, x in m.items()}
    itl_p95 = {p: _itl_during(results[p], "doc-0") for p in results}
    bg = {p: _background_tok_s(results[p]) for p in results}
    bg_alone = _background_tok_s(alone)
    target = bench.lanes["chat"].itl_target_ms
    findings = {"Targets": [
        f"chat TTFT p95 with background load: homeai {chat_p95['homeai']} ms, fifo {chat_p95['fifo']} ms; "
        f"without background (homeai): {quiet_m['lanes']['chat']['all']['ttft_ms']['p95']} ms "
        f"(ratio {_ratio(chat_p95['homeai'], quiet_m['lanes']['chat']['all']['ttft_ms']['p95'])}, target <= 2)",
        f"chat ITL p95 while doc-0 ({doc_len} tokens) is prefilled: "
        + ", ".join(f"{p} {v} ms" for p, v in itl_p95.items()) + f" (target < {target:.0f} ms)",
        f"background throughput (prompt+output tok/s): homeai {bg['homeai']}, alone {bg_alone} "
        f"(ratio {_ratio(bg['homeai'], bg_alone)}, target >= 0.5)",
    ]}
    plot_paths = [plots.ttft_by_lane(results, bench.out / "household_ttft.png"),
                  plots.chat_itl_during_prefill({p: results[p] for p in ("homeai", "fifo")}, "doc-0",
                                                bench.out / "household_chat_itl.png", target)]
    return bench.finish("household", workload, results, findings, plot_paths, {
        "baselines": {"homeai_without_background": quiet_m, "homeai_background_alone": alone_m},
        "chat_itl_p95_during_doc_prefill_ms": itl_p95, "background_tok_s": {**bg, "alone": bg_alone}})


def _itl_during(result: RunResult, doc_id: str) -> float | None:
    doc = next((r for r in result.records if r.spec.request_id == doc_id), None)
    if doc is None or doc.admitted is None or not doc.token_times:
        return None
    lo, hi = doc.admitted, doc.token_times[0]
    gaps = [b - a for r in result.records if r.spec.lane == "chat"
            for a, b in zip(r.token_times, r.token_times[1:]) if b > lo and a < hi]
    v = report.percentile(gaps, 95)
    return None if v is None else round(v * 1000, 1)


def _background_tok_s(result: RunResult) -> float | None:
    recs = [r for r in result.records if r.spec.lane in BACKGROUND and r.ok]
    if not recs:
        return None
    tokens = sum(r.spec.prompt_len + len(r.token_times) for r in recs)
    span = max(r.finish for r in recs) - min(r.arrival for r in recs)
    return round(tokens / span, 1) if span > 0 else None


def fairness_bench(bench: Bench, duration_s: float = 30.0, seed: int = 0, light_every_s: float = 0.5) -> dict:
    workload = workloads.fairness(duration_s=duration_s, seed=seed, light_every_s=light_every_s)
    lanes = {k: replace(v, max_queue=100_000) for k, v in bench.lanes.items()}
    # The heavy member never stops sending: measure the window of arrivals, then stop.
    results = {p: bench.run(workload, p, lanes, max_seconds=duration_s) for p in ("fifo", "homeai")}
    members = ("light", "heavy")
    shares = {p: report.member_shares(r, members) for p, r in results.items()}
    findings = {"Targets": [
        f"{p}: share while both backlogged {s['both_backlogged']} (configured 0.5 each; target within 0.1)"
        for p, s in shares.items()]}
    plot_paths = [plots.fair_share(shares, bench.out / "fairness_share.png", members, 0.5)]
    return bench.finish("fairness", workload, results, findings, plot_paths, {"shares": shares})
