"""The layers docs/architecture.md draws, checked on the source: every ``import`` in aotc/, module level or
inside a function, read with ``ast`` (nothing is imported).

- the interface (``aotc.runners`` outside the backend packages) imports only leaves;
- a backend imports only the interface, the leaves and itself, never the core or another backend;
- the core never names a backend;
- no import circle anywhere (a package importing its own submodules is not one, nor an import for type checkers
  alone, ``if TYPE_CHECKING:``: the runner spec names ``Entry`` in its hooks' types, ``Entry`` finds its runner);
- only the CLI layer draws on a terminal (rich, tqdm): cli.py and render.py.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from .conftest import REPO

PACKAGE = REPO / "aotc"
BACKENDS = ("aotc.runners.vllm_tpu", "aotc.runners.tpu_inference")
INTERFACE = "aotc.runners"
# Data types and helpers every layer may use; each imports only other leaves and the runner spec.
LEAVES = frozenset({"aotc.errors", "aotc.files", "aotc.processes", "aotc.engine_args", "aotc.graphs", "aotc.matrix",
                    "aotc.hf_cache", "aotc.entry", "aotc.accelerators"})


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def type_checking_blocks(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:``: imports type checkers read and Python never runs."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            inside.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return inside


def imported(name: str, path: Path, known: dict[str, Path], typing: bool = True) -> set[str]:
    """The aotc modules ``name`` imports, ``from pkg import mod`` resolved to the module (``typing=False``: those
    it imports at run time only)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = set() if typing else type_checking_blocks(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def import_graph(typing: bool = True) -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known, typing) for name, path in known.items()}


def layer(name: str) -> str:
    if name.startswith(BACKENDS):
        return next(b for b in BACKENDS if name.startswith(b))
    if name in LEAVES:
        return "leaf"
    if name.startswith(INTERFACE + ".") or name == INTERFACE:
        return "interface"
    return "core"


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for name, deps in sorted(graph.items()):
        here = layer(name)
        for dep in sorted(deps):
            there = layer(dep)
            if here in BACKENDS and there not in ("interface", "leaf", here):
                found.append(f"{name} (backend) imports {dep} ({there})")
            elif here == "interface" and there not in ("interface", "leaf"):
                found.append(f"{name} (interface) imports {dep} ({there})")
            elif here == "leaf" and there not in ("leaf",) and dep != "aotc.runners.spec":
                found.append(f"{name} (leaf) imports {dep} ({there})")
            elif here == "core" and there in BACKENDS:
                found.append(f"{name} (core) imports {dep}: the core names no runner")
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), package -> own submodule edges left out."""
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in edges[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_each_layer_imports_only_what_it_may():
    assert violations(import_graph()) == []


def test_no_import_circles():
    assert circles(import_graph(typing=False)) == []


def test_the_checks_catch_a_backend_importing_the_core_and_a_circle():
    graph = import_graph()
    graph["aotc.runners.tpu_inference.watcher"] = graph["aotc.runners.tpu_inference.watcher"] | {"aotc.guard"}
    graph["aotc.store.core"] = graph["aotc.store.core"] | {"aotc.store.scan"}
    assert violations(graph) == ["aotc.runners.tpu_inference.watcher (backend) imports aotc.guard (core)"]
    assert ["aotc.store.core", "aotc.store.leases", "aotc.store.scan"] in circles(graph)


def third_party_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_only_the_cli_layer_draws_on_a_terminal():
    drawing = {name for name, path in modules().items() if third_party_imports(path) & {"rich", "tqdm"}}
    assert drawing <= {"aotc.cli", "aotc.render"}, drawing


def test_every_backend_package_exists():
    assert all(name in modules() for name in BACKENDS)


def entry_hooks(cls: type) -> dict[str, str]:
    """Each method of ``cls`` taking an ``entry``, with that parameter's annotation (a string: the modules
    postpone annotations)."""
    hooks = {}
    for name in dir(cls):
        member = inspect.getattr_static(cls, name)
        function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        if inspect.isfunction(function) and "entry" in inspect.signature(function).parameters:
            hooks[f"{cls.__name__}.{name}"] = inspect.signature(function).parameters["entry"].annotation
    return hooks


def test_every_backend_hook_takes_the_entry_typed():
    """The runner interface and each registered backend's spec and planner name ``Entry``, never ``Any`` or a
    dict: what a hook receives is the matrix's entry, the same in the core and in a runner process."""
    from aotc.runners.spec import Planner, RunnerSpec, registered

    classes = {Planner, RunnerSpec} | {c for spec in registered().values() for c in (type(spec), type(spec.planner))}
    hooks = {name: annotation for cls in classes for name, annotation in entry_hooks(cls).items()}
    assert {"Planner.capture_plan", "RunnerSpec.kv_blocks", "RunnerSpec.validate", "RunnerSpec.serve"} <= set(hooks)
    assert {name: annotation for name, annotation in hooks.items() if annotation != "Entry"} == {}


def test_a_backend_must_give_a_planner_and_its_two_required_rules():
    from aotc.runners.spec import Planner, RunnerSpec

    @dataclasses.dataclass(frozen=True)
    class NoPlanner(RunnerSpec):
        pass

    class NoSummary(Planner):
        def capture_plan(self, entry, hf_config):
            return []

    with pytest.raises(TypeError, match="planner"):
        NoPlanner(name="x", module="x", packages=())
    with pytest.raises(TypeError, match="bucket_summary"):
        NoSummary()


def top_level_names(path: Path) -> set[str]:
    body = ast.parse(path.read_text()).body
    return ({node.name for node in body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
            | {target.id for node in body if isinstance(node, (ast.Assign, ast.AnnAssign))
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Name)})


def test_every_entry_point_names_what_its_module_defines():
    """pyproject.toml's entry points (vLLM's plugins, the runners, the CLI) follow a module that moves: each value
    names a module of aotc/ defining that attribute. vLLM loads the plugins by these values in every process, a
    pod's too, and logs a plugin it cannot import instead of failing."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    found = modules()
    for group, points in groups.items():
        for name, value in points.items():
            module, _, attribute = value.partition(":")
            assert module in found, f"[{group}] {name} = {value}: no module {module} in aotc/"
            assert attribute in top_level_names(found[module]), f"[{group}] {name} = {value}: {module} has no {attribute}"
