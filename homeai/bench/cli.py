"""`homeai bench ...`: the benchmarks' subcommands, their arguments and how each is run (see
docs/benchmarks.md). `add_bench_parser` adds them to the `homeai` command (homeai/cli.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from homeai import config as config_mod


def add_bench_parser(sub) -> list[argparse.ArgumentParser]:
    """`homeai bench` and its workloads under `sub`; the parsers that also take --config after their name."""
    bench = sub.add_parser("bench", help="benchmarks (see docs/benchmarks.md)")
    bsub = bench.add_subparsers(dest="workload", required=True)
    engine = bsub.add_parser("engine", help="decode tok/s vs a raw llama.cpp loop; scheduler planning cost")
    engine.add_argument("--seqs", default="1,4,8,16")
    engine.add_argument("--tokens", type=int, default=64)
    engine.add_argument("--rounds", type=int, default=3, help="engine and raw loop alternating per row; medians reported")
    grammar = bsub.add_parser("grammar", help="decode tok/s with a JSON-schema grammar and an untriggered lazy one vs free text")
    grammar.add_argument("--seqs", default="1,8")
    grammar.add_argument("--tokens", type=int, default=64)
    grammar.add_argument("--reps", type=int, default=3, help="rounds of the three ways; medians reported")
    voice = bsub.add_parser("voice", help="end of speech to first answer token over /v1/voice, idle and loaded")
    voice.add_argument("--n", type=int, default=10, help="questions per phase")
    voice.add_argument("--out", default="bench-out", help="folder for voice.json and voice.md")
    voice.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
    neighbour = bsub.add_parser("neighbour", help="chat latency and embeddings beside busy processes: before, during, after")
    neighbour.add_argument("--phase", type=float, default=20.0, help="seconds of each phase (quiet, busy, after)")
    neighbour.add_argument("--busy", type=int, default=2, help="busy processes at nice 10 during the busy phase")
    neighbour.add_argument("--out", default="bench-out", help="folder for neighbour.json and neighbour.md")
    http = bsub.add_parser("http", help="the household workload over HTTP: homeai beside another OpenAI-compatible server")
    http.add_argument("--peer", required=True, help="the other server's URL, e.g. llama-server's http://127.0.0.1:8080")
    http.add_argument("--peer-name", default="peer", help="its name in the report, e.g. llama-server")
    http.add_argument("--peer-model", default="", help="the model to ask the peer for (Ollama needs one)")
    http.add_argument("--url", help="homeai's URL (default: the config's server address)")
    http.add_argument("--api-key", default="", help="bearer token sent to both servers (homeai with auth on)")
    http.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    http.add_argument("--chat-rate", type=float, default=0.08, help="chats a second per member (3 members)")
    http.add_argument("--documents", type=int, default=2, help="long documents to summarise")
    http.add_argument("--doc-len", type=int, default=2000, help="tokens of each document")
    http.add_argument("--seed", type=int, default=0)
    http.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
    http.add_argument("--out", default="bench-out", help="folder for http.json and http.md")
    multi = bsub.add_parser("multiturn", help="conversations re-sending a long stable prompt: prompt reuse on and off")
    multi.add_argument("--members", type=int, default=3, help="conversations at once (a one-member run is added)")
    multi.add_argument("--turns", type=int, default=6)
    multi.add_argument("--system-len", type=int, default=1500, help="tokens of the stable system prompt")
    multi.add_argument("--policies", default=",".join(("homeai", "homeai-no-reuse", "fifo", "static", "serial")))
    multi.add_argument("--simulate", nargs="?", const="cpu-smollm2", metavar="PROFILE",
                       help="no model: a step-cost profile (see `bench all --simulate`)")
    multi.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
    multi.add_argument("--out", default="bench-out", help="folder for multiturn.json and multiturn.md")
    assistant = bsub.add_parser("assistant", help="a Home Assistant voice turn: Wyoming speech-to-text, then /api/chat")
    assistant.add_argument("--conversations", type=int, default=3, help="conversations per phase (idle, saturated)")
    assistant.add_argument("--turns", type=int, default=3, help="turns per conversation")
    assistant.add_argument("--devices", type=int, default=40, help="exposed devices listed in the system prompt")
    assistant.add_argument("--reps", type=int, default=100, help="pairs of /api/chat and /v1/chat/completions")
    assistant.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
    assistant.add_argument("--out", default="bench-out", help="folder for assistant.json and assistant.md")
    assistant.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    members_bench = bsub.add_parser("members", help="a member's chat beside another member's flood, lanes and grammar")
    members_bench.add_argument("--samples", type=int, default=20, help="the member's chats per phase")
    members_bench.add_argument("--streams", type=int, default=30, help="the other member's streams in flight")
    members_bench.add_argument("--stream-tokens", type=int, default=300, help="tokens of each of those streams")
    members_bench.add_argument("--carol-turns", type=int, default=10, help="the speaking member's spoken turns per phase")
    members_bench.add_argument("--trickle", type=int, default=1000, help="the guest's sockets trickling a body")
    members_bench.add_argument("--seed", type=int, default=0)
    members_bench.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
    members_bench.add_argument("--out", default="bench-out", help="folder for members.json and members.md")
    members_bench.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    owui = bsub.add_parser("owui", help="Open WebUI's users behind one proxy member taking turns with its 36-tool body")
    owui.add_argument("--users", type=int, default=2, choices=range(2, 5), help="people behind the proxy (2 to 4)")
    owui.add_argument("--turns", type=int, default=2, help="each user's messages")
    owui.add_argument("--max-tokens", type=int, default=32, help="each answer's length (short: the prompt side is measured)")
    owui.add_argument("--tools", type=int, default=36, help="the first this many of the recorded body's 36 tools")
    owui.add_argument("--overlap", action="store_true", help="two users' turns at a time instead of one")
    owui.add_argument("--seed", type=int, default=0)
    owui.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
    owui.add_argument("--out", default="bench-out", help="folder for owui.json and owui.md")
    owui.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    spec = bsub.add_parser("spec", help="drafted tokens off and on: one talker's tokens/s, and the household mix")
    spec.add_argument("--reps", type=int, default=3, help="off and on in turn per one-talker workload; medians")
    spec.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
    spec.add_argument("--max-draft", type=int, default=None, help="tokens an answer drafts at most (default: [speculative])")
    spec.add_argument("--out", default="bench-out", help="folder for spec.json and spec.md")
    images = bsub.add_parser("images", help="image questions' TTFT, and the chat's TTFT beside them against idle")
    images.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
    images.add_argument("--tower", default="vit-b", choices=("tiny", "vit-b", "vit-l"),
                        help="with no [model] mmproj: the random projector's vision tower (its encode's cost)")
    images.add_argument("--camera-every", type=float, default=None, metavar="S",
                        help="the camera's new snapshot every S seconds (default 2; 0: back to back)")
    images.add_argument("--out", default="bench-out", help="folder for images.json and images.md")
    rmodel = bsub.add_parser("model", help="write a GGUF with random weights in a real model's shape (speed only)")
    rmodel.add_argument("out", help="the GGUF file to write; then set model.path to it")
    rmodel.add_argument("--shape", default="smollm2-360m", help="smollm2-360m, llama-1b, llama-8b (or tiny)")
    rmodel.add_argument("--type", default="q8_0", help="weight type: q4_0, q8_0, f16")
    rmodel.add_argument("--mmproj", metavar="PATH", help="also write a random vision projector for it (images in)")
    workloads = []
    for name, help_text in (("continuous", "static vs continuous batching: N requests, exponential outputs"),
                            ("household", "chats and voice while documents are summarised and embedded"),
                            ("fairness", "two members on one lane, one sending 10x as much"),
                            ("all", "continuous, household and fairness")):
        w = bsub.add_parser(name, help=help_text)
        w.add_argument("--out", default="bench-out", help="folder for the JSON, Markdown and PNG files")
        w.add_argument("--seed", type=int, default=0)
        w.add_argument("--simulate", nargs="?", const="cpu-smollm2", metavar="PROFILE",
                       help="no model: a step-cost profile (cpu-smollm2, gpu-consumer-8b, cpu-desktop-8b) or a report JSON to fit from")
        w.add_argument("--quick", action="store_true", help="a small version (for tests and smoke runs)")
        w.add_argument("--n", type=int, default=32, help="continuous: number of requests")
        w.add_argument("--mean-output", type=int, default=128, help="continuous: mean output length")
        w.add_argument("--rate", type=float, default=None, help="continuous: Poisson arrivals per second")
        w.add_argument("--duration", type=float, default=40.0, help="household/fairness: seconds of arrivals")
        workloads.append(w)
    bench.set_defaults(func=cmd_bench)
    return [bench, engine, grammar, voice, neighbour, http, multi, spec, images, rmodel, *workloads]


def cmd_bench(cfg: config_mod.Config, args) -> int:
    if args.workload == "engine":
        from homeai.bench.engine_bench import engine_throughput, planning_cost, report
        from homeai.app import engine_over, load_runner

        seqs = [int(s) for s in args.seqs.split(",")]
        runner = load_runner(cfg, embeddings=False, grammar=False)
        engine = engine_over(cfg, runner).start()
        try:
            from homeai.threads import default_threads

            print(f"model {runner.info.description}, {cfg.model.n_threads or default_threads()} threads, "
                  f"planning ahead {'on' if engine.plan_ahead else 'off'}", flush=True)
            plans: list[dict] = []  # one before each round: the median is the run's, not one moment's
            rows = engine_throughput(engine, seqs, args.tokens, rounds=max(args.rounds, 1),
                                     progress=lambda r: print(f"  {r['seqs']:>3} seqs: homeai {r['homeai_tok_s']:.1f}"
                                                              f" tok/s, raw {r['raw_tok_s']:.1f} tok/s", flush=True),
                                     between=lambda: plans.append(planning_cost()))
        finally:
            engine.stop()
            runner.close()
        plans.sort(key=lambda p: p["ms_per_step"])
        print(report(rows, plans[len(plans) // 2]))
        return 0
    if args.workload == "grammar":
        return run_grammar(cfg, args)
    if args.workload == "neighbour":
        return run_neighbour(cfg, args)
    if args.workload == "http":
        return run_http(cfg, args)
    if args.workload == "multiturn":
        return run_multiturn(cfg, args)
    if args.workload == "model":
        from homeai.bench.random_model import SHAPES, write

        try:
            size = write(Path(args.out), args.shape, args.type)
        except (RuntimeError, ValueError) as e:
            print(f"homeai: {e}", file=sys.stderr)
            return 2
        print(f"{args.out}: {size / 1e6:.0f} MB, random weights in the {args.shape} shape ({args.type});"
              f" set model.path to it to benchmark it")
        if args.mmproj:
            from homeai.bench.random_mmproj import n_image_tokens, write_mmproj

            size = write_mmproj(Path(args.mmproj), SHAPES[args.shape].hidden)
            print(f"{args.mmproj}: {size / 1e6:.1f} MB, a random LLaVA-style vision projector for it"
                  f" ({n_image_tokens()} tokens an image)")
        return 0
    if args.workload == "assistant":
        from homeai.bench import assistant_bench

        return assistant_bench.main(cfg, args)
    if args.workload == "members":
        from homeai.bench import members_bench

        return members_bench.main(cfg, args)
    if args.workload == "images":
        from homeai.bench.image_bench import main as run_images

        return run_images(cfg, args)
    if args.workload == "spec":
        from homeai.bench import spec_bench

        return spec_bench.main(cfg, args)
    if args.workload == "owui":
        from homeai.bench import owui_bench

        return owui_bench.main(cfg, args)
    if args.workload == "voice":
        from homeai.bench.voice_bench import run

        run(cfg, n=args.n, out=Path(args.out), quick=args.quick)
        return 0
    return run_workloads(cfg, args)


def run_grammar(cfg: config_mod.Config, args) -> int:
    from homeai.bench.grammar_bench import grammar_throughput, report
    from homeai.app import engine_over, load_runner

    runner = load_runner(cfg, embeddings=False, grammar=False)
    engine = engine_over(cfg, runner).start()
    try:
        rows = grammar_throughput(engine, [int(s) for s in args.seqs.split(",")], args.tokens, args.reps,
                                  progress=lambda r: print(f"  {r['seqs']:>3} seqs: free {r['free_tok_s']:.1f}, "
                                                           f"json_schema {r['json_schema_tok_s']:.1f}, lazy "
                                                           f"{r['lazy_untriggered_tok_s']:.1f} tok/s", flush=True))
    finally:
        engine.stop()
        runner.close()
    print(report(rows))
    return 0


def run_neighbour(cfg: config_mod.Config, args) -> int:
    from homeai import threads
    from homeai.bench import neighbour
    from homeai.app import engine_over, load_runner

    runner = load_runner(cfg, embeddings=False, grammar=False)
    engine = engine_over(cfg, runner).start()
    try:
        doc = neighbour.run(engine, phase_s=args.phase, num_busy=args.busy)
    finally:
        engine.stop()
        runner.close()
    count = (f"{cfg.model.n_threads} threads" if cfg.model.n_threads
             else "threads following the box (model.n_threads 0, the core watch)")
    machine = f"{runner.info.description}, {count}, {os.cpu_count()} cores, OpenMP: {threads.wait_policy()}"
    neighbour.write(doc, machine, Path(args.out))
    print(neighbour.markdown(doc, machine))
    return 0


def run_http(cfg: config_mod.Config, args) -> int:
    from homeai.bench import http_bench, workloads

    quick = args.quick
    workload = workloads.household(duration_s=4 if quick else args.duration, seed=args.seed, chat_rate=args.chat_rate,
                                   documents=1 if quick else args.documents, doc_len=200 if quick else args.doc_len)
    url = args.url or f"http://{cfg.server.host}:{cfg.server.port}"
    targets = [http_bench.Target("homeai", http_bench.base_url(url), api_key=args.api_key),
               http_bench.Target(args.peer_name, http_bench.base_url(args.peer), args.peer_model, args.api_key)]
    doc = http_bench.run(targets, workload, cfg.lanes)
    http_bench.write(doc, " ".join(["homeai", *sys.argv[1:]]), Path(args.out))
    print("\n".join(doc["findings"]))
    print(f"report in {Path(args.out) / 'http.md'}")
    return 0


def run_multiturn(cfg: config_mod.Config, args) -> int:
    from homeai.bench import multiturn, suite
    from homeai.bench.driver import SimRunner
    from homeai.engine.engine import scheduler_limits

    runner = None
    if not args.simulate:
        from homeai.app import load_runner

        runner = load_runner(cfg, embeddings=False, grammar=False)
    quick = args.quick
    base = multiturn.Shape(members=args.members, turns=3 if quick else args.turns,
                           system_len=200 if quick else args.system_len, output_len=8 if quick else 24,
                           doc_len=200 if quick else 1500)
    shapes = {"one conversation, idle": multiturn.replace(base, members=1),
              f"{args.members} members, idle": base,
              f"{args.members} members, background saturated": multiturn.replace(base, background=True)}
    policies = [p for p in args.policies.split(",") if p]
    unknown = set(policies) - set(multiturn.POLICIES)
    if unknown:
        print(f"homeai: unknown policies {', '.join(sorted(unknown))} (known: {', '.join(multiturn.POLICIES)})",
              file=sys.stderr)
        return 2
    try:
        limits = scheduler_limits(cfg, runner and runner.info)
        doc = multiturn.run(shapes, cfg.lanes, limits, runner or SimRunner(*suite.load_profile(args.simulate)),
                            simulated=runner is None, policies=policies,
                            progress=lambda s, p, r: print(f"  {s} / {p}: turn 1 {r['turn1_ttft_ms']['p50']} ms, "
                                                           f"later {r['later_ttft_ms']['p50']} ms", flush=True))
        machine = suite._machine(runner) if runner else f"simulated ({args.simulate})"
    finally:
        if runner is not None:
            runner.close()
    doc["findings"] = multiturn.findings(doc)
    multiturn.write(doc, Path(args.out), " ".join(["homeai", *sys.argv[1:]]), machine)
    print("\n".join(doc["findings"]))
    print(f"report in {Path(args.out) / 'multiturn.md'}")
    return 0


def run_workloads(cfg: config_mod.Config, args) -> int:
    from homeai.bench import suite
    from homeai.engine.engine import scheduler_limits

    runner = None
    if not args.simulate:
        from homeai.app import load_runner

        runner = load_runner(cfg, embeddings=False, grammar=False)
    from homeai.engine.gpu import plans_ahead

    ahead = plans_ahead(cfg.scheduler.plan_ahead, cfg.model, bool(runner and runner.info.gpu_offload))
    bench = suite.Bench(cfg.lanes, scheduler_limits(cfg, runner and runner.info), runner=runner, profile=args.simulate,
                        out=Path(args.out), plan_ahead=ahead)
    names = ["continuous", "household", "fairness"] if args.workload == "all" else [args.workload]
    quick = args.quick
    try:
        for name in names:
            if name == "continuous":
                doc = suite.continuous_bench(bench, n=8 if quick else args.n,
                                             mean_output=16 if quick else args.mean_output, rate=args.rate, seed=args.seed)
            elif name == "household":
                doc = suite.household_bench(bench, duration_s=6 if quick else args.duration, seed=args.seed,
                                            doc_len=300 if quick else 2000, documents=1 if quick else 2,
                                            embed_batch_size=4 if quick else 16)
            else:
                doc = suite.fairness_bench(bench, duration_s=4 if quick else min(args.duration, 30.0), seed=args.seed)
            for line in doc["findings"]["Targets"]:
                print(f"{name}: {line}")
            print(f"{name}: report in {Path(args.out) / (name + '.md')}", flush=True)
    finally:
        if runner is not None:
            runner.close()
    return 0
