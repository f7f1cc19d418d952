"""The rooms of homeai: every module imports, no import loop, no arrow up.

Imports are read from the source with `ast`, those inside functions (deferred) and under
`if TYPE_CHECKING:` too, and `importlib.import_module("...")` with the name written out: a
deferred import only hides a loop, it does not remove it.

* Every module of homeai and lanes imports on its own (but the migrations, which only Alembic runs).
* No loop among modules, and none among rooms (a top-level package or module of homeai:
  homeai.api, homeai.engine, homeai.config, ...; and lanes).
* No arrow up: the rooms below the routes never import homeai.api, the scheduler
  (homeai.sched) knows neither the engine, nor the service, nor the API, and the lanes (policies
  the scheduler reads as plain data) import nothing of homeai. Every room stands on one of the
  floors of docs/architecture.md (`FLOORS`), and imports only from its own floor or below.
* The nevers: the service's clients (api, jobs, wyoming), the service and the tools never import
  the runner's package (`homeai.llama`) nor `llama_cpp`: the program
  (`homeai.app`) assembles it, and they are handed the service; api does not import the scheduler,
  nor wyoming the store (it asks the service's rights).
* One package owns llama.cpp: only homeai.llama imports `llama_cpp`, and the rooms that are handed
  the runner's pieces (the service's clients, the service, the capabilities) never import homeai.llama.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("homeai", "lanes")
BELOW_API = ("homeai.sched", "homeai.engine", "homeai.store", "homeai.tools", "homeai.remote", "homeai.service",
             "homeai.speech", "homeai.jobs", "homeai.wyoming", "homeai.wire")
NEVER = {room: ("homeai.api",) for room in BELOW_API}
NEVER["homeai.sched"] = ("homeai.api", "homeai.engine", "homeai.service")
NEVER["lanes"] = ("homeai",)
RUNNER = ("homeai.llama", "llama_cpp")  # the model, which homeai.app loads
for _room in ("homeai.api", "homeai.jobs", "homeai.wyoming", "homeai.service", "homeai.tools"):
    NEVER[_room] = NEVER.get(_room, ()) + RUNNER
NEVER["homeai.api"] += ("homeai.sched",)
NEVER["homeai.wyoming"] += ("homeai.store",)
# The floors of docs/architecture.md, top down: a module imports only from its own floor or below.
FLOORS = (
    ("commands", ("homeai.cli", "homeai.doctor", "homeai.models_cli", "homeai.index_cli", "homeai.bench")),
    ("program", ("homeai.app",)),
    ("clients of the service", ("homeai.api", "homeai.wyoming", "homeai.jobs")),
    ("service", ("homeai.service",)),
    ("capabilities", ("homeai.tools", "homeai.remote", "homeai.speech")),
    ("engine", ("homeai.engine", "homeai.llama", "homeai.models")),
    ("scheduler, store", ("homeai.sched", "homeai.store")),
    ("config", ("homeai.config", "homeai.pull")),
    ("ground", ("lanes", "homeai.wire", "homeai.cron", "homeai.catalog", "homeai.gguf_header", "homeai.threads",
                "homeai.logs", "homeai.heap", "homeai")),
)
ALEMBIC = "homeai.store.migrations"  # scripts Alembic loads itself (env.py needs its context): read, not imported


def module_names() -> dict[str, Path]:
    """Every module of homeai and lanes by its dotted name (a package by its own name)."""
    names = {}
    for path in sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = module_names()


def imported(name: str, path: Path) -> set[str]:
    """The modules of ours `name` imports anywhere in its source: `from a import b` names the module
    a.b when there is one, else a."""
    return {target for target in imported_any(name, path) if target in MODULES and target != name}


def imported_any(name: str, path: Path) -> set[str]:
    """Every module `name` imports anywhere in its source, ours or not (`llama_cpp`)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                found.add(whole if whole in MODULES else base)
        elif _imports_by_name(node):
            found.add(node.args[0].value)
    return found


def imports_llama_cpp(path: Path) -> bool:
    """Whether the source imports `llama_cpp` (or a module of it) anywhere."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif _imports_by_name(node):
            names = [node.args[0].value]
        else:
            continue
        if any(name == "llama_cpp" or name.startswith("llama_cpp.") for name in names):
            return True
    return False


def _imports_by_name(node: ast.AST) -> bool:
    """`importlib.import_module("a.b")` (or `import_module(...)`) with the name written out."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name == "import_module" and isinstance(node.args[0].value, str)


def floor(module: str) -> int | None:
    """Which of `FLOORS` holds `module` (0 the top), by its longest named prefix; None: none does."""
    named = [(len(prefix), i) for i, (_, prefixes) in enumerate(FLOORS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".") and prefix != "homeai"]  # homeai: its face
    return max(named)[1] if named else None


def room(module: str) -> str:
    """The top-level package or module of homeai that holds `module`; lanes is one room."""
    return "lanes" if module.split(".")[0] == "lanes" else ".".join(module.split(".")[:2])


def graph(rooms: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        source = room(name) if rooms else name
        targets = {room(t) if rooms else t for t in imported(name, path)}
        edges.setdefault(source, set()).update(targets - {source})
    return edges


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan's), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_reader_sees_deferred_relative_and_importlib_imports(tmp_path):
    source = tmp_path / "metrics.py"
    source.write_text("from . import auth\n\ndef f():\n    from homeai.api.deps import RuntimeDep\n"
                      "    importlib.import_module('homeai.api.runtime')\n")
    assert imported("homeai.api.metrics", source) == {"homeai.api.auth", "homeai.api.deps", "homeai.api.runtime"}


def test_floors_place_a_module_by_its_longest_prefix():
    assert FLOORS[floor("homeai.api.openai")][0] == "clients of the service" and FLOORS[floor("lanes.chat")][0] == "ground"
    assert FLOORS[floor("homeai")][0] == "ground" and floor("homeai.newroom") is None


def test_the_nevers_see_the_runner_and_llama_cpp(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("import llama_cpp\n\ndef f():\n    from homeai.llama import Runner\n")
    assert {"llama_cpp", "homeai.llama"} <= imported_any("homeai.api.x", source)
    assert "llama_cpp" in NEVER["homeai.service"] and "homeai.store" in NEVER["homeai.wyoming"]


def test_a_loop_is_found():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith(ALEMBIC)))
def test_every_module_imports(name):
    importlib.import_module(name)


def test_no_loop_among_modules():
    assert loops(graph(rooms=False)) == []


def test_no_loop_among_rooms():
    assert loops(graph(rooms=True)) == []


def test_no_arrow_up():
    up = sorted(f"{name} -> {target}" for name, path in MODULES.items() for target in imported_any(name, path)
                if any(target == never or target.startswith(never + ".")
                       for never in NEVER.get(room(name), ())))
    assert up == []


def test_every_room_stands_on_a_floor():
    assert sorted({room(name) for name in MODULES if floor(name) is None}) == []  # a new room: give it a floor


def test_every_arrow_points_down_or_along_its_floor():
    up = sorted(f"{name} ({FLOORS[floor(name)][0]}) -> {target} ({FLOORS[floor(target)][0]})"
                for name, path in MODULES.items() if floor(name) is not None
                for target in imported(name, path) if floor(target) is not None and floor(target) < floor(name))
    assert up == []


def test_only_the_llama_package_imports_llama_cpp():
    assert sorted(name for name, path in MODULES.items()
                  if room(name) != "homeai.llama" and imports_llama_cpp(path)) == []


