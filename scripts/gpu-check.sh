#!/usr/bin/env bash
# homeai on one GPU, in under 8 minutes, with no network: what docs/benchmarks.md ("On a GPU")
# still has to measure. Writes OUT/report.md (and each step's own output beside it).
#
# usage: scripts/gpu-check.sh OUT [LLAMA_SERVER]      (from the project's root)
#   LLAMA_SERVER: a llama-server binary of the same llama.cpp build, for the HTTP comparison
# env:   HOMEAI   the homeai command (default: python3 -m homeai.cli; the GPU kit's env.sh sets
#                 PYTHONPATH and the CUDA libraries: source it first)
#        MODEL    the random-weight GGUF to write and use (default: /tmp/homeai-gpu-check.gguf)
#        FA       model.flash_attn (default off: the kit's CUDA build has no flash attention)
#        PYTHON   the Python that runs homeai's modules (default python3)
#        SHAPE    the model's shape (default llama-8b; tiny for a smoke run of this script on a CPU)
#
# Steps, each under its own timeout (status 124: it ran out; 134: SIGABRT, e.g. a CUDA abort):
#   1. homeai bench model: random weights in Llama 3.1 8B's shape, q4_0 (about 4 GB, seconds)
#   2. homeai doctor: the backends, layers offloaded by default, CUDA graphs in force and why
#   3. homeai bench engine: homeai against the raw loop at 1-32 sequences (graphs as auto decides:
#      off, with two generation contexts), and 1 sequence with one cache (graphs on): their cost;
#      then 1-16 sequences with scheduler.plan_ahead off (auto plans each step while the one
#      before computes, on a GPU): what planning ahead hides
#   4. homeai bench household: the household workload, homeai against fifo and the others
#   5. the abort of issue 16 with CUDA graphs on and two generation contexts: the bare
#      two-context loop (python -m homeai.bench.graphs_repro), then `bench engine --seqs 32
#      --tokens 256` as the issue ran it; "abort" or "no abort" for each
#   6. with LLAMA_SERVER: homeai serve and llama-server side by side, `homeai bench http`
set -u
out=$(realpath -m "${1:?usage: scripts/gpu-check.sh OUT [LLAMA_SERVER]}"); server_bin=${2:-}
homeai=${HOMEAI:-python3 -m homeai.cli}; model=${MODEL:-/tmp/homeai-gpu-check.gguf}; fa=${FA:-off}
shape=${SHAPE:-llama-8b}
mkdir -p "$out"; report=$out/report.md
started=$(date +%s)

config() {  # config NAME INTERACTIVE_N_CTX CUDA_GRAPHS [PLAN_AHEAD]: issue 16's GPU config, n_gpu_layers left at its default
  printf '[server]\nport = 8701\ndata_dir = "%s/data"\n[model]\npath = "%s"\nflash_attn = "%s"\nn_ctx = 65536\ninteractive_n_ctx = %s\nn_seq_max = 64\nn_batch = 2048\ncuda_graphs = "%s"\n[scheduler]\nplan_ahead = "%s"\n' \
    "$out" "$model" "$fa" "$2" "$3" "${4:-auto}" > "$out/$1.toml"
}

step() {  # step NAME SECONDS COMMAND...: run it under a timeout, keep its output, note its status
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local verdict=ok
  case $rc in 0) ;; 124|137) verdict="timed out after ${limit} s" ;; 134) verdict="ABORTED (SIGABRT)" ;; *) verdict="failed ($rc)" ;; esac
  printf '## %s: %s (%d s)\n\n`%s`\n\n```\n%s\n```\n\n' "$name" "$verdict" $(( $(date +%s) - t0 )) "$*" \
    "$(tr '\r' '\n' < "$out/$name.log" | grep -v '^\(llama_\|load_\|print_info\|ggml_\|sched_\|graph_\|~llama\)' \
       | grep -v 'req/s]\|s/req]\|^ *$' | tail -n 40)" >> "$report"
  return $rc
}

printf '# homeai GPU check (%s)\n\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" > "$report"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv >> "$report"
echo >> "$report"

config gpu 16384 auto
config graphs-on 16384 on
config one-cache 0 auto
config plain 16384 auto off
step model 120 $homeai bench model "$model" --shape "$shape" --type q4_0 || { echo "no model: stopping" >> "$report"; exit 1; }
step doctor 60 $homeai --config "$out/gpu.toml" doctor
step engine 150 $homeai --config "$out/gpu.toml" bench engine --tokens 128 --seqs 1,4,16,32
step engine-one-cache-graphs-on 60 $homeai --config "$out/one-cache.toml" bench engine --tokens 128 --seqs 1
step engine-plan-ahead-off 100 $homeai --config "$out/plain.toml" bench engine --tokens 128 --seqs 1,4,16
step household 200 $homeai --config "$out/gpu.toml" bench household --duration 12 --out "$out/household"

abort() { case $1 in 134) echo "abort" ;; 0) echo "no abort" ;; 124|137) echo "timed out (no abort seen)" ;; *) echo "failed ($1)" ;; esac; }
step repro-two-context-loop 90 ${PYTHON:-python3} -m homeai.bench.graphs_repro --config "$out/graphs-on.toml" --seqs 32 --tokens 256
loop_rc=$?
step repro-bench-engine 120 $homeai --config "$out/graphs-on.toml" bench engine --tokens 256 --seqs 32
engine_rc=$?
printf '## CUDA graphs on, two generation contexts\n\n* bare two-context loop: %s\n* bench engine --seqs 32 --tokens 256: %s\n\n' \
  "$(abort $loop_rc)" "$(abort $engine_rc)" >> "$report"

if [ -n "$server_bin" ]; then
  wait_up() {  # wait_up URL: until it answers 200, at most 120 s
    python3 - "$1" <<'PY'
import sys, time, urllib.request
for _ in range(240):
    try:
        if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        time.sleep(0.5)
sys.exit(1)
PY
  }
  $homeai --config "$out/gpu.toml" serve --port 8701 > "$out/serve.log" 2>&1 &
  homeai_pid=$!
  "$server_bin" -m "$model" -ngl 99 -c 65536 -np 16 -fa "$fa" --port 8702 > "$out/llama-server.log" 2>&1 &
  peer_pid=$!
  if wait_up http://127.0.0.1:8701/healthz && wait_up http://127.0.0.1:8702/health; then
    step http 240 $homeai --config "$out/gpu.toml" bench http --url http://127.0.0.1:8701 --peer http://127.0.0.1:8702 \
      --peer-name llama-server --duration 15 --chat-rate 0.67 --documents 4 --doc-len 3000 --out "$out/http"
  else
    echo "## http: a server did not come up (serve.log, llama-server.log)" >> "$report"
  fi
  kill "$homeai_pid" "$peer_pid" 2>/dev/null; wait "$homeai_pid" "$peer_pid" 2>/dev/null
  grep -q "stopping with exit status 70" "$out/serve.log" && echo "homeai serve: its engine died (serve.log)" >> "$report"
fi

printf 'total: %d s\n' $(( $(date +%s) - started )) >> "$report"
echo "report: $report"
