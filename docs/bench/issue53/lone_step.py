"""The experiment behind docs/benchmarks.md's "Images": `homeai bench images` (vit-b tower, 30 s phases)
with the scheduler's `PaceTuning.lone_step` set to the argument (3.0 is homeai's; 1.0: a prompt read
with nothing decoding takes plain steps). Prints the chat's TTFT p95 ratios and each phase.

    .venv/bin/python docs/bench/issue53/lone_step.py 1.0
"""
import dataclasses, sys, tempfile
from pathlib import Path
from homeai.config import from_dict
from homeai.app import engine_over, load_runner
from homeai.bench import image_bench
from homeai.bench.random_mmproj import TOWERS, write_mmproj, embedding_length
from homeai.models import embedded_gguf
from homeai.sched import pacing
lone = float(sys.argv[1])
tmp = tempfile.mkdtemp(); tower, size, patch = TOWERS["vit-b"]; proj = Path(tmp)/"p.gguf"
write_mmproj(proj, embedding_length(embedded_gguf()), image_size=size, patch_size=patch, tower=tower)
cfg = from_dict({"model": {"mmproj": str(proj)}})
runner = load_runner(cfg, embeddings=False, grammar=False)
engine = engine_over(cfg, runner)
engine.scheduler.pacing.tuning = dataclasses.replace(engine.scheduler.pacing.tuning, lone_step=lone)
engine.start()
shape = dataclasses.replace(image_bench.Shape(), phase_s=30.0)
try:
    r = image_bench.run(engine, runner, shape, cfg.limits, progress=lambda s: None)
finally:
    engine.stop(); runner.close()
print(lone, {k: r[k] for k in ("chat_ttft_p95_ratio", "chat_ttft_p95_ratio_text")}, r["idle"], r["beside_text"], r["beside_images"])
