"""The CUDA-graphs abort of issue 16, reduced to llama.cpp's calls: a GPU check, not a benchmark.

Run: `python -m homeai.bench.graphs_repro --config gpu.toml [--seqs 32] [--tokens 256]`
(`scripts/gpu-check.sh` runs it with `model.cuda_graphs = "on"` under a timeout). It loads
the configured model with its two generation contexts (`model.interactive_n_ctx` > 0) and
decodes `seqs` sequences for `tokens` steps, half in each context, back to back in every step,
as `Runner.run` does, without the scheduler (`homeai.bench.raw_loop.raw_two_context_decode`). It prints what is in
force and, if the process lives, "completed"; an abort shows as the process dying by SIGABRT
(exit status 134) with llama.cpp's CUDA error on stderr. On a CPU it checks that both contexts
give the same greedy tokens for the same prompt.
"""

from __future__ import annotations

import argparse
import sys

from homeai import config as config_mod


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m homeai.bench.graphs_repro", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML config (default: $HOMEAI_CONFIG)")
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args(argv)
    cfg = config_mod.load(config_mod.resolve_path(args.config))
    if not cfg.model.interactive_n_ctx:
        print("homeai: the reproduction needs model.interactive_n_ctx > 0 (two generation contexts)", file=sys.stderr)
        return 2
    from homeai.bench.raw_loop import raw_two_context_decode
    from homeai.engine import gpu
    from homeai.app import load_runner
    from homeai.llama import backend_facts

    backend = backend_facts()
    graphs = gpu.cuda_graphs(cfg.model, backend["gpu_offload"])
    print(f"backends {', '.join(backend['backends'])}; layers offloaded: "
          f"{gpu.describe_offload(cfg.model, backend['gpu_offload'])}; CUDA graphs: {graphs.reason}", flush=True)
    runner = load_runner(cfg, embeddings=False, grammar=False)
    try:
        prompts = [[1000 + 7 * i + k for k in range(64)] for i in range(args.seqs)]
        result = raw_two_context_decode(runner, prompts, args.tokens)
    finally:
        runner.close()
    print(f"completed: {result['tokens']} tokens over two contexts in {result['seconds']:.1f} s "
          f"({result['tokens'] / result['seconds']:.0f} tok/s), no abort", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
