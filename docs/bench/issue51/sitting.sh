#!/usr/bin/env bash
# Issue 51's quiet sitting: the engine's core redesigned, behaviour and speed kept. Before and after
# in one run, on a quiet box, each side on its own PYTHONPATH with this checkout's venv.
#   docs/bench/issue51/sitting.sh BASE_CHECKOUT OUT
# BASE_CHECKOUT: a checkout of the commit before (`git worktree add /tmp/base ee097ac`).
# Writes OUT/{before,after}/..., and prints what matched.
set -euo pipefail
base=$(cd "$1" && pwd); out=$2; here=$(cd "$(dirname "$0")/../../.." && pwd)
py="$here/.venv/bin/python"
mkdir -p "$out/before" "$out/after"; out=$(cd "$out" && pwd)
side() { [ "$1" = before ] && echo "$base" || echo "$here"; }
homeai() { local tree; tree=$(side "$1"); shift; (cd "$tree" && PYTHONPATH="$tree" "$py" -m homeai.cli "$@"); }

echo "== 1. the scheduler's plans, byte for byte (scripts/sched_trace.py, four seed ranges)"
for s in before after; do
  for seeds in 0-40 100-130 200-215 300-315; do
    tree=$(side $s); (cd "$tree" && PYTHONPATH="$tree" "$py" scripts/sched_trace.py "$out/$s/trace-$seeds.txt" "$seeds")
  done
done
for seeds in 0-40 100-130 200-215 300-315; do
  cmp "$out/before/trace-$seeds.txt" "$out/after/trace-$seeds.txt" && echo "trace $seeds: identical ($(wc -c < "$out/after/trace-$seeds.txt") bytes)"
done

echo "== 2. bench all --simulate, both profiles"
for s in before after; do
  for profile in gpu-consumer-8b cpu-desktop-8b; do homeai $s bench all --simulate $profile --out "$out/$s/sim-$profile" > /dev/null; done
done
"$py" - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for profile in ("gpu-consumer-8b", "cpu-desktop-8b"):
    for f in sorted((out / "before" / f"sim-{profile}").glob("*.json")):
        a, b = json.loads(f.read_text()), json.loads((out / "after" / f"sim-{profile}" / f.name).read_text())
        for doc in (a, b):
            doc.pop("command", None)
        print(f"simulate {profile} {f.name}: {'identical' if a == b else 'DIFFERENT'}")
PY

echo "== 3. bench engine on the tiny model (n_threads = 1), sides alternating"
tiny="$out/tiny.gguf"
[ -f "$tiny" ] || homeai after bench model "$tiny" --shape tiny --type q4_0 > /dev/null
printf '[model]\npath = "%s"\nn_threads = 1\n' "$tiny" > "$out/tiny.toml"
for run in 1 2 3; do
  for s in before after; do
    homeai $s --config "$out/tiny.toml" bench engine --seqs 1,4,16 --tokens 128 --rounds 15 > "$out/$s/engine-tiny-$run.txt" 2>&1
  done
done

echo "== 4. bench members, voice and assistant on SmolLM2 (before, then after)"
for s in before after; do
  homeai $s bench members --samples 10 --streams 16 --carol-turns 6 --trickle 300 --out "$out/$s/members" > "$out/$s/members.log" 2>&1
  homeai $s bench voice --n 6 --out "$out/$s/voice" > "$out/$s/voice.log" 2>&1
  homeai $s bench assistant --conversations 2 --turns 3 --devices 20 --reps 10 --out "$out/$s/assistant" > "$out/$s/assistant.log" 2>&1
done
echo "done: $out"
