"""The sitting's figures side by side: `python docs/bench/issue51/compare.py OUT` (OUT from sitting.sh)."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])


def load(side, name):
    return json.loads((out / side / name / f"{name}.json").read_text())


def engine(side):
    rows = {}
    for f in sorted((out / side).glob("engine-tiny-*.txt")):
        for line in f.read_text().splitlines():
            cells = [c.strip() for c in line.split("|")]
            if len(cells) > 4 and cells[1] in ("1", "4", "16"):
                rows.setdefault(cells[1], []).append(float(cells[4]))
    return {k: (statistics.median(v), v) for k, v in rows.items()}


print("| bench engine, tiny model | before: median (runs) | after: median (runs) | after - before |")
print("|---|---|---|---:|")
b, a = engine("before"), engine("after")
for k in ("1", "4", "16"):
    print(f"| {k} sequences, homeai / raw | {b[k][0]:.2f} ({' '.join(f'{x:.2f}' for x in b[k][1])}) | "
          f"{a[k][0]:.2f} ({' '.join(f'{x:.2f}' for x in a[k][1])}) | {a[k][0] - b[k][0]:+.2f} |")

print("\n| bench members: phase | bob TTFT p50 / p95 ms, before | after | carol first audio p95 ms, before | after |")
print("|---|---|---|---|---|")
mb, ma = load("before", "members"), load("after", "members")
for phase, fb in mb["phases"].items():
    fa = ma["phases"][phase]
    t = lambda f: f"{f['bob']['ttft_ms']['p50']} / {f['bob']['ttft_ms']['p95']}"
    print(f"| {phase} | {t(fb)} | {t(fa)} | {fb['carol']['first_audio_ms']['p95']} | {fa['carol']['first_audio_ms']['p95']} |")

print("\n| bench voice: phase | first token p50 / p95 ms, before | after | first audio p50 / p95 ms, before | after |")
print("|---|---|---|---|---|")
vb, va = load("before", "voice"), load("after", "voice")
for phase, fb in vb["phases"].items():
    fa = va["phases"][phase]
    t = lambda f, key: f"{f[key]['p50']} / {f[key]['p95']}"
    print(f"| {phase} | {t(fb, 'first_token_ms')} | {t(fa, 'first_token_ms')} | {t(fb, 'first_audio_ms')} | {t(fa, 'first_audio_ms')} |")

print("\n| bench assistant: phase, turns | end of speech to first token p50 / p95 ms, before | after | cached, before | after |")
print("|---|---|---|---|---|")
ab, aa = load("before", "assistant"), load("after", "assistant")
for phase, turns in ab["phases"].items():
    for turn, fb in turns.items():
        fa = aa["phases"][phase][turn]
        t = lambda f: f"{f['stop_to_first_ms']['p50']} / {f['stop_to_first_ms']['p95']}"
        print(f"| {phase}, {turn} | {t(fb)} | {t(fa)} | {fb['cached_share']:.1%} | {fa['cached_share']:.1%} |")
