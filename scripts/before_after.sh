#!/usr/bin/env bash
# Behaviour kept across a redesign: the same benchmarks on two checkouts, back to back, in one run.
#   scripts/before_after.sh BASE_CHECKOUT OUT [quick]
# BASE_CHECKOUT is a checkout of the commit before (e.g. `git worktree add /tmp/base <sha>`); the
# code after is this checkout. Both run with this checkout's venv, each on its own PYTHONPATH.
# Writes OUT/{before,after}/<bench>/... and OUT/compare.md (scripts/compare_benches.py).
# Both sides read OUT/pinned.toml (written here unless it exists): the cache sizes and thread count
# the commit before had as defaults, so what changed on purpose elsewhere (KV caches sized from the
# model, threads following the box) does not hide whether the redesign kept behaviour.
set -euo pipefail
base=$(cd "$1" && pwd); out=$2; quick=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
py="$here/.venv/bin/python"
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -f "$out/pinned.toml" ] || printf '[model]\nn_ctx = 8192\ninteractive_n_ctx = 4096\nn_threads = 1\n' > "$out/pinned.toml"
cfg=(--config "$out/pinned.toml")
run() {  # side checkout
  local side=$1 tree=$2 dest="$out/$1"
  mkdir -p "$dest"
  echo "== $side: $tree"
  (cd "$tree" && PYTHONPATH="$tree" "$py" -m homeai.cli "${cfg[@]}" bench continuous --n ${N:-48} --out "$dest/continuous")
  (cd "$tree" && PYTHONPATH="$tree" "$py" -m homeai.cli "${cfg[@]}" bench household --duration ${DURATION:-40} --out "$dest/household")
  (cd "$tree" && PYTHONPATH="$tree" "$py" -m homeai.cli "${cfg[@]}" bench multiturn --members 2 --turns ${TURNS:-4} --out "$dest/multiturn")
  (cd "$tree" && PYTHONPATH="$tree" "$py" -m homeai.cli "${cfg[@]}" bench assistant --conversations ${CONV:-3} --turns 3 --reps 3 --out "$dest/assistant")
  for profile in gpu-consumer-8b cpu-desktop-8b; do
    (cd "$tree" && PYTHONPATH="$tree" "$py" -m homeai.cli "${cfg[@]}" bench all --simulate $profile --out "$dest/sim-$profile")
  done
}
run before "$base"
run after "$here"
"$py" "$here/scripts/compare_benches.py" "$out/before" "$out/after" | tee "$out/compare.md"
