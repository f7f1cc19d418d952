"""Per test, its wall and this process's CPU seconds (setup, call and teardown), written as TSV to $CPUWALL_OUT
(default cpuwall.tsv): `PYTHONPATH=.:docs/bench/issue51 .venv/bin/python -m pytest -p cpuwall ...`. CPU counts
this process's threads (llama.cpp's two among them), not child processes (`homeai serve` in tests/ops). Under
pytest-xdist each worker writes its own file, the worker's name appended ($CPUWALL_OUT.gw0, ...)."""
import os, time
import pytest

_rows = []

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    w0, c0 = time.monotonic(), time.process_time()
    yield
    _rows.append((item.nodeid, time.monotonic() - w0, time.process_time() - c0))

def pytest_sessionfinish(session):
    out = os.environ.get("CPUWALL_OUT", "cpuwall.tsv")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        out += "." + os.environ["PYTEST_XDIST_WORKER"]
    with open(out, "w") as f:
        for nodeid, w, c in _rows:
            f.write(f"{w:.2f}\t{c:.2f}\t{nodeid}\n")
