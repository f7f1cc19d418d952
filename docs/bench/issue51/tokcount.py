"""Per test, what llama.cpp was asked (`PYTHONPATH=.:docs/bench/issue51 .venv/bin/python -m pytest -p tokcount ...`):
llama_decode calls, their tokens (calls of one token, of 2-8, tokens in larger ones) and the wall seconds spent in
them, and the grammar checks sent to a checker process with their wall seconds. TSV to $TOKCOUNT_OUT (default
tokcount.tsv; under pytest-xdist one file a worker, its name appended). It found Open WebUI's title bodies asking
1,000 tokens: 999 one-token calls each. Child processes (`homeai serve` in tests/ops) are not counted."""
import collections
import os
import time

import pytest

import homeai.engine.grammar_check as grammar_check
import homeai.llama.runner as runner

now = collections.Counter()
_decode, _ask = runner.ll.llama_decode, grammar_check._Worker.ask


def decode(ctx, batch):
    began = time.monotonic()
    rc = _decode(ctx, batch)
    n = batch.n_tokens
    now["dec_s"] += time.monotonic() - began
    now["calls"] += 1
    now["tokens"] += n
    now["single" if n == 1 else "small" if n <= 8 else "big"] += 1 if n == 1 else n
    return rc


def ask(self, *args, **kwargs):
    began = time.monotonic()
    try:
        return _ask(self, *args, **kwargs)
    finally:
        now["checks"] += 1
        now["check_s"] += time.monotonic() - began


runner.ll.llama_decode, grammar_check._Worker.ask = decode, ask
_rows = []
FIELDS = ("calls", "tokens", "single", "small", "big", "dec_s", "checks", "check_s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    now.clear()
    w0, c0 = time.monotonic(), time.process_time()
    yield
    _rows.append((item.nodeid, time.monotonic() - w0, time.process_time() - c0, dict(now)))


def pytest_sessionfinish(session):
    out = os.environ.get("TOKCOUNT_OUT", "tokcount.tsv")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        out += "." + os.environ["PYTEST_XDIST_WORKER"]
    with open(out, "w") as f:
        f.write("\t".join(("wall_s", "cpu_s", *FIELDS, "test")) + "\n")
        for nodeid, wall, cpu, counts in _rows:
            values = [f"{counts.get(k, 0):.1f}" if k.endswith("_s") else str(counts.get(k, 0)) for k in FIELDS]
            f.write("\t".join((f"{wall:.1f}", f"{cpu:.1f}", *values, nodeid)) + "\n")
