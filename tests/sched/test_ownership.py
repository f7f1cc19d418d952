"""One owner per concern in the scheduler, read from the source: a request's status is written
only by the scheduler's lifecycle methods, and no rule asks whether the interactive lanes have a
cache of their own except through the cache layout.

Run: .venv/bin/python -m pytest -q tests/sched/test_ownership.py
"""

from __future__ import annotations

import ast
from pathlib import Path

import homeai.sched

SCHED = Path(homeai.sched.__file__).parent


def _status_writers() -> set[tuple[str, str]]:
    """(module, function) pairs that assign some object's `.status`."""
    found = set()
    for path in sorted(SCHED.glob("*.py")):
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                for target in targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Attribute) and t.attr == "status":
                            found.add((path.name, func.name))
    return found


def test_a_requests_status_is_written_by_the_schedulers_lifecycle_alone():
    assert _status_writers() == {("scheduler.py", "_start"), ("scheduler.py", "_requeue"),
                                 ("scheduler.py", "_finish")}


def test_only_the_layout_knows_the_interactive_lanes_cache():
    """`Pool.INTERACTIVE` and `interactive_cells` appear in the layout (and the limits that name
    it, and the pool list), not in the rules."""
    for path in sorted(SCHED.glob("*.py")):
        if path.name in ("layout.py", "pools.py"):
            continue
        text = path.read_text()
        assert "Pool.INTERACTIVE" not in text, path.name
        uses = text.count("interactive_cells")  # the limit's field, and the layout chosen from it
        assert uses == 0 or (path.name in ("limits.py", "scheduler.py") and uses == 1), path.name
