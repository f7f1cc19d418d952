"""The members bench's light phases alone (idle, voice refused, refused grammar, nested pattern),
larger than the sitting's run, for the before/after question it left open. The homeai measured is
the one on PYTHONPATH (a checkout of before, or this one):

    PYTHONPATH=CHECKOUT .venv/bin/python docs/bench/issue51/light_phases.py OUT.json [SAMPLES] [CAROL_TURNS]

Writes every one of bob's TTFTs and carol's first audios, by phase (light.sh runs the sides in turn)."""
import json
import sys
import time
from pathlib import Path

from homeai import config as config_mod
from homeai.bench import members_bench

LIGHT = ("idle", "voice refused", "refused grammar", "nested pattern")


def main() -> None:
    out = Path(sys.argv[1])
    samples = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    carol = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    members_bench.PHASES = tuple(p for p in members_bench.PHASES if p.name in LIGHT)
    shape = members_bench.Shape(samples=samples, streams=16, carol_turns=carol, trickle_sockets=300)
    seen = {}
    report_of = members_bench.build_report

    def kept(shape, phases, samples, floods, **kw):  # the raw figures, beside the report
        seen["bob"] = {p: [s.ttft_ms for s in samples if s.phase == p] for p in LIGHT}
        seen["carol"] = {p: [t.first_audio_ms for t in kw.get("turns") or [] if t.phase == p] for p in LIGHT}
        return report_of(shape, phases, samples, floods, **kw)

    members_bench.build_report = kept
    began = time.monotonic()
    members_bench.run(config_mod.load(None), shape=shape, out=out.parent / (out.stem + "-report"),
                      progress=lambda *a, **k: None)
    out.write_text(json.dumps({"homeai": members_bench.__file__, "samples": samples, "carol_turns": carol,
                               "elapsed_s": round(time.monotonic() - began, 1), **seen}, indent=1))


if __name__ == "__main__":
    main()
