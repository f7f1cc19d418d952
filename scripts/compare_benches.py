"""Compare two benchmark folders written by scripts/before_after.sh: a Markdown report.

Measured runs (the real model): the latency and throughput figures side by side, with after/before
ratios. Simulated runs (`--simulate`, no model): the JSON must be identical apart from the command
line and the machine; every leaf that differs is listed.

    python scripts/compare_benches.py OUT/before OUT/after
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

IGNORED = re.compile(r"(^|\.)(command|machine|plots|generated_at|date|wall_s|elapsed_s)(\.|$)")
MEASURED = re.compile(r"(ttft|e2e|first|total|turn|throughput|tok_s|latency)[^.]*(\.(p50|p95|median|mean))?$")


def leaves(obj, path: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            out.update(leaves(value, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, value in enumerate(obj):
            out.update(leaves(value, f"{path}[{i}]"))
        return out
    return {path: obj}


def compare_simulated(name: str, before: dict, after: dict) -> list[str]:
    a = {k: v for k, v in leaves(before).items() if not IGNORED.search(k)}
    b = {k: v for k, v in leaves(after).items() if not IGNORED.search(k)}
    diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if not diff:
        return [f"- `{name}`: identical ({len(a)} values)"]
    lines = [f"- `{name}`: {len(diff)} of {len(a)} values differ"]
    lines += [f"  - `{k}`: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:40]]
    return lines


def compare_measured(name: str, before: dict, after: dict) -> list[str]:
    a, b = leaves(before), leaves(after)
    rows = []
    for key in sorted(a.keys() & b.keys()):
        if IGNORED.search(key) or not MEASURED.search(key):
            continue
        x, y = a[key], b[key]
        if not isinstance(x, (int, float)) or not isinstance(y, (int, float)) or isinstance(x, bool):
            continue
        if "p99" in key or "itl" in key:
            continue
        ratio = f"{y / x:.2f}" if x else "-"
        rows.append(f"| `{key}` | {x:g} | {y:g} | {ratio} |")
    head = [f"### {name}", "", "| figure | before | after | after/before |", "|---|---:|---:|---:|"]
    return [*head, *rows, ""]


def main(before_dir: str, after_dir: str) -> None:
    before, after = Path(before_dir), Path(after_dir)
    sim, measured = [], []
    for path in sorted(before.rglob("*.json")):
        twin = after / path.relative_to(before)
        if not twin.exists():
            sim.append(f"- `{path.relative_to(before)}`: missing after")
            continue
        a, b = json.loads(path.read_text()), json.loads(twin.read_text())
        name = str(path.relative_to(before))
        if name.startswith("sim-"):
            sim += compare_simulated(name, a, b)
        else:
            measured += compare_measured(name, a, b)
    print("## Simulated benchmarks (must be identical)\n")
    print("\n".join(sim) or "(none)")
    print("\n## Measured benchmarks (after/before; noise on this shared 2-core box is 10-20%)\n")
    print("\n".join(measured) or "(none)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
