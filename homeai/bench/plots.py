"""PNG plots for a benchmark report (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from homeai.bench.driver import RunResult  # noqa: E402


def ttft_by_lane(results: dict[str, RunResult], path: Path) -> Path:
    lanes = sorted({r.spec.lane for res in results.values() for r in res.records})
    fig, axes = plt.subplots(1, len(lanes), figsize=(4 * len(lanes), 3.6), squeeze=False)
    for ax, lane in zip(axes[0], lanes):
        data, labels = [], []
        for policy, res in results.items():
            values = [r.ttft * 1000 for r in res.records if r.spec.lane == lane and r.ok and r.ttft is not None]
            if values:
                data.append(values)
                labels.append(policy)
        if data:
            ax.boxplot(data, tick_labels=labels, showfliers=True)
            ax.set_yscale("log")
        ax.set_title(f"{lane}: time to first token")
        ax.set_ylabel("ms (log)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def chat_itl_during_prefill(results: dict[str, RunResult], doc_id: str, path: Path, target_ms: float) -> Path:
    """Inter-token gaps of the chat that overlaps a long document's prefill most, per policy."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for policy, res in results.items():
        doc = next((r for r in res.records if r.spec.request_id == doc_id), None)
        if doc is None or doc.admitted is None or not doc.token_times:
            continue
        window = (doc.admitted, doc.token_times[0])
        chat = _most_overlapping_chat(res, window)
        if chat is None:
            continue
        t0 = res.records[0].arrival
        xs = [t - t0 for t in chat.token_times[1:]]
        ax.plot(xs, [g * 1000 for g in chat.itls], marker=".", label=f"{policy} ({chat.spec.request_id})")
        ax.axvspan(window[0] - t0, window[1] - t0, alpha=0.08, color=ax.lines[-1].get_color())
    ax.axhline(target_ms, color="grey", linestyle="--", label=f"chat ITL target {target_ms:.0f} ms")
    ax.set_xlabel("seconds into the run (shaded: the document's prefill)")
    ax.set_ylabel("inter-token gap, ms")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("A chat's inter-token latency while a long document is prefilled")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _most_overlapping_chat(res: RunResult, window: tuple[float, float]):
    best, best_overlap = None, 0.0
    for r in res.records:
        if r.spec.lane != "chat" or len(r.token_times) < 2:
            continue
        overlap = min(r.token_times[-1], window[1]) - max(r.token_times[0], window[0])
        if overlap > best_overlap:
            best, best_overlap = r, overlap
    return best


def fair_share(shares: dict[str, dict], path: Path, members: tuple[str, str], target: float) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for policy, data in shares.items():
        xs = [p["t_s"] for p in data["series"]]
        ax.plot(xs, [p[members[0]] for p in data["series"]], marker=".", label=f"{policy}: {members[0]}'s share")
    ax.axhline(target, color="grey", linestyle="--", label=f"configured share {target:.0%}")
    ax.set_ylim(0, 1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("share of scheduled tokens")
    ax.legend(fontsize=8)
    ax.set_title(f"Fair share between {members[0]} and {members[1]} (10x the requests)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
