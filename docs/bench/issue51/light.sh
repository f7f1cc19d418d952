#!/usr/bin/env bash
# The members bench's light phases, before and after in turn (before, after, after, before), on a
# quiet box: docs/bench/issue51/light.sh BASE_CHECKOUT OUT [SAMPLES] [CAROL_TURNS]
set -euo pipefail
base=$(cd "$1" && pwd); out=$2; samples=${3:-30}; carol=${4:-15}
here=$(cd "$(dirname "$0")/../../.." && pwd); py="$here/.venv/bin/python"
mkdir -p "$out"; out=$(cd "$out" && pwd)
one() { local tree; [ "$1" = before ] && tree=$base || tree=$here
  (cd "$tree" && PYTHONPATH="$tree" "$py" "$here/docs/bench/issue51/light_phases.py" "$out/$1-$2.json" "$samples" "$carol")
  echo "$1 $2 done $(date -u +%H:%M:%S)"; }
one before 1; one after 1; one after 2; one before 2
"$py" - "$out" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
def pct(v, q):
    v = sorted(x for x in v if x is not None)
    return round(v[min(len(v) - 1, int(q / 100 * len(v)))]) if v else None
runs = {f.stem: json.loads(f.read_text()) for f in sorted(out.glob("*-[12].json"))}
print("| phase | who | side | run | n | p50 ms | p95 ms |\n|---|---|---|---|---:|---:|---:|")
for phase in ("idle", "voice refused", "refused grammar", "nested pattern"):
    for who in ("bob", "carol"):
        for side in ("before", "after"):
            pooled = []
            for run in ("1", "2"):
                v = runs[f"{side}-{run}"][who][phase]; pooled += v
                print(f"| {phase} | {who} | {side} | {run} | {len(v)} | {pct(v, 50)} | {pct(v, 95)} |")
            print(f"| {phase} | {who} | {side} | both | {len(pooled)} | {pct(pooled, 50)} | {pct(pooled, 95)} |")
PY
