"""Every workload under every policy, end to end on a tiny configuration; the report has every field.

Values are not asserted against timings (the machines are noisy): only that each figure exists.
"""

from __future__ import annotations

import json

import pytest

from homeai.bench import suite
from homeai.bench.policies import POLICIES
from homeai.engine.engine import scheduler_limits
from tests.conftest import small_config

GROUP_FIELDS = {"requests", "succeeded", "success_rate", "ttft_ms", "itl_ms", "e2e_ms", "throughput_req_s",
                "throughput_tok_s", "goodput_req_s", "preemptions"}
RUN_FIELDS = {"makespan_s", "overall", "lanes", "max_active_sequences", "token_budget", "kv_cells", "preemptions",
              "step_cost_model_ms", "backlogged_tok_s"}


def check_report(out, name: str, policies, lanes: set[str], require_success: bool = True,
                 optional_lanes: set[str] = frozenset()) -> dict:
    doc = json.loads((out / f"{name}.json").read_text())
    markdown = (out / f"{name}.md").read_text()
    assert doc["params"] and doc["command"] and doc["findings"]["Targets"]
    assert set(doc["policies"]) == set(policies)
    for policy, m in doc["policies"].items():
        assert RUN_FIELDS <= set(m), policy
        assert lanes <= set(m["lanes"]) <= lanes | optional_lanes
        for lane, groups in m["lanes"].items():
            for g in groups.values():
                assert GROUP_FIELDS <= set(g)
                assert set(g["ttft_ms"]) == {"p50", "p95", "p99"}
        assert m["steps"] > 0
        if require_success:
            assert m["overall"]["succeeded"] > 0
        assert policy in markdown
    for png in doc["plots"]:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return doc


@pytest.fixture
def bench(runner, tmp_path):
    cfg = small_config()
    return suite.Bench(cfg.lanes, scheduler_limits(cfg, runner.info), runner=runner, out=tmp_path, quiet=True)


def test_continuous_all_policies_real_model(bench, tmp_path):
    suite.continuous_bench(bench, n=6, mean_output=8)
    doc = check_report(tmp_path, "continuous", POLICIES, {"chat"})
    assert set(doc["throughput_tok_s"]) == set(doc["backlogged_tok_s"]) == set(POLICIES)
    assert "short" in doc["policies"]["homeai"]["lanes"]["chat"]


def test_backlogged_throughput_leaves_out_the_drain():
    from homeai.bench.driver import RequestRecord
    from homeai.bench.report import backlogged_tok_s
    from homeai.bench.workloads import Spec

    def record(admitted, times):
        return RequestRecord(Spec("r", 0.0, "chat", "m", 4, len(times)), arrival=0.0, admitted=admitted,
                             token_times=times)
    # Two requests: the second admitted at 2 s; 4 tokens came by then, the rest in the drain.
    records = [record(0.0, [0.5, 1.0, 1.5, 2.5, 9.0]), record(2.0, [2.0, 3.0])]
    for r in records:
        r.finish = r.token_times[-1]
    assert backlogged_tok_s(records) == 2.0
    records[1].admitted = 0.5  # all admitted within the run's first tenth: no backlog to measure
    assert backlogged_tok_s(records) is None


def test_household_all_policies_real_model(bench, tmp_path):
    # Two seconds of arrivals (seed 0): a chat, a summary of 16 tokens and two chunks to index, under
    # every policy and twice more for the baselines. A short household may or may not hear a voice question.
    suite.household_bench(bench, duration_s=2, doc_len=120, documents=1, embed_batch_size=1, summary_len=16)
    doc = check_report(tmp_path, "household", POLICIES, {"chat", "summaries", "indexing"}, optional_lanes={"voice"})
    assert {"homeai_without_background", "homeai_background_alone"} == set(doc["baselines"])
    assert set(doc["chat_itl_p95_during_doc_prefill_ms"]) == set(POLICIES)
    assert "household_chat_itl.png" in doc["plots"]


def test_fairness_real_model(bench, tmp_path):
    suite.fairness_bench(bench, duration_s=3, light_every_s=0.5)
    # The heavy member never stops: the run is cut at its time limit, finished or not.
    doc = check_report(tmp_path, "fairness", ("fifo", "homeai"), {"chat"}, require_success=False)
    for policy, shares in doc["shares"].items():
        assert shares["series"], policy
        assert set(shares["series"][0]) == {"t_s", "light", "heavy"}


def test_simulation_mode_says_so(tmp_path):
    cfg = small_config()
    bench = suite.Bench(cfg.lanes, scheduler_limits(cfg), runner=None, profile="gpu-consumer-8b",
                        out=tmp_path, quiet=True)
    suite.continuous_bench(bench, n=16, mean_output=32)
    suite.fairness_bench(bench, duration_s=5)
    doc = check_report(tmp_path, "continuous", POLICIES, {"chat"})
    assert doc["simulated"] is True
    assert "This is a simulation" in (tmp_path / "continuous.md").read_text()
    fitted = suite.load_profile(str(tmp_path / "continuous.json"))
    assert fitted[1] > 0


def test_fair_share_holds_in_simulation(tmp_path):
    """The pure scheduler, driven by a step-cost model: the light member gets its half."""
    cfg = small_config()
    bench = suite.Bench(cfg.lanes, scheduler_limits(cfg), runner=None, out=tmp_path, quiet=True)
    suite.fairness_bench(bench, duration_s=10)
    shares = json.loads((tmp_path / "fairness.json").read_text())["shares"]
    assert abs(shares["homeai"]["both_backlogged"]["light"] - 0.5) < 0.1
    assert shares["fifo"]["both_backlogged"]["light"] < 0.3


def test_household_at_full_size_completes_under_every_policy_in_simulation(tmp_path):
    """Embedding inputs longer than a step and 2,000-token documents: nothing is left behind."""
    cfg = small_config()
    bench = suite.Bench(cfg.lanes, scheduler_limits(cfg), runner=None, out=tmp_path, quiet=True)
    workload = suite.workloads.household(duration_s=20, documents=1)
    for policy in POLICIES:
        result = bench.run(workload, policy, max_seconds=600)
        assert all(r.ok for r in result.records), (policy, [r.spec.request_id for r in result.records if not r.ok])


def test_the_raw_loop_reads_prompts_longer_than_one_batch_together(runner):
    """`homeai bench engine` at 16 sequences: their prompts exceed one llama.cpp batch."""
    from homeai.bench.raw_loop import raw_batched_decode

    prompts = [runner.tokenize(f"Question {i}: " + "why is the sky blue? " * 6) for i in range(8)]
    assert sum(map(len, prompts)) > len(runner.batch.token)
    out = raw_batched_decode(runner, prompts, 4)
    assert out["tokens"] == 8 * 4


def test_planning_ahead_keeps_the_bars_in_simulation(tmp_path):
    """The household and fairness workloads on a consumer GPU's step costs, each step planned while
    the one before runs (`scheduler.plan_ahead`): chat's first token with background load and
    the light member's share are where the plain loop has them, and every request completes."""
    cfg = small_config()
    figures = {}
    for ahead in (False, True):
        bench = suite.Bench(cfg.lanes, scheduler_limits(cfg), runner=None, profile="gpu-consumer-8b",
                            out=tmp_path / str(ahead), quiet=True, plan_ahead=ahead)
        household = suite.household_bench(bench, duration_s=10, documents=1)
        fairness = suite.fairness_bench(bench, duration_s=5)
        homeai = household["policies"]["homeai"]
        figures[ahead] = (homeai["lanes"]["chat"]["all"]["ttft_ms"]["p95"],
                          fairness["shares"]["homeai"]["both_backlogged"]["light"], homeai["overall"]["succeeded"])
    (plain_ttft, plain_share, plain_done), (ttft, share, done) = figures[False], figures[True]
    assert ttft <= plain_ttft * 1.1, (plain_ttft, ttft)
    assert abs(share - plain_share) < 0.02, (plain_share, share)
    assert done == plain_done
    assert json.loads((tmp_path / "True" / "household.json").read_text())["plan_ahead"] is True
