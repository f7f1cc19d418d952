"""llama-server's drafting on the prompts `homeai bench spec` uses (issue 52), in one sitting with it:
`python docs/bench/issue52/llama_server.py LLAMA_SERVER OUT.json [--reps 3]`, from the checkout.

The same model (the config's: the embedded SmolLM2 by default) and the same prompt tokens (the tool
call and the notice, rendered by homeai's template: sent as token ids to `/completion`), greedy, 96
tokens; llama-server started once for each of `--spec-type` none, ngram-simple and ngram-mod, with two
threads and one slot. Its own `timings.predicted_per_second` is each answer's decode rate (first token
to last, as the bench times homeai's); the medians over the reps, and each side's speedup over its own
none, are written to OUT.json and printed."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from homeai.app import load_runner
from homeai.bench import spec_bench
from homeai.config import load
from homeai.models import generation_model

SPEC_TYPES = ("none", "ngram-simple", "ngram-mod")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary: str, model: Path, spec: str, port: int) -> subprocess.Popen:
    args = [binary, "-m", str(model), "--port", str(port), "--host", "127.0.0.1", "-t", "2", "-np", "1",
            "-c", "4096", "--no-webui"]
    if spec != "none":
        args += ["--spec-type", spec]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"llama-server did not start ({spec})")


def main() -> int:
    binary, out = sys.argv[1], Path(sys.argv[2])
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 3
    cfg = load(None)
    runner = load_runner(cfg, embeddings=False, grammar=False)
    prompts = spec_bench.one_talker_prompts(runner, spec_bench.Shape())
    runner.close()
    model = generation_model(cfg)
    rates: dict[str, dict[str, float]] = {}
    answers: dict[str, dict[str, list[int]]] = {}
    for spec in SPEC_TYPES:
        port = free_port()
        proc = serve(binary, model, spec, port)
        try:
            for name, tokens in prompts.items():
                each = []
                for _ in range(reps):
                    r = httpx.post(f"http://127.0.0.1:{port}/completion", timeout=300, json={
                        "prompt": tokens, "n_predict": 96, "temperature": 0, "cache_prompt": False,
                        "return_tokens": True})
                    body = r.json()
                    each.append(body["timings"]["predicted_per_second"])
                    answers.setdefault(spec, {})[name] = body.get("tokens", [])
                rates.setdefault(spec, {})[name] = round(statistics.median(each), 2)
                print(f"llama-server {spec:>12}, {name}: {rates[spec][name]} tok/s", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    report = {"model": str(model), "reps": reps, "tok_s": rates,
              "speedup": {spec: {name: round(rates[spec][name] / rates["none"][name], 3) for name in prompts}
                          for spec in SPEC_TYPES},
              "greedy_identical": {spec: {name: answers[spec][name] == answers["none"][name] for name in prompts}
                                   for spec in SPEC_TYPES}}
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["speedup"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
