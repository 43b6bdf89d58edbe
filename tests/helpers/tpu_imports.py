"""Import, in this interpreter, every module a stack's TPU path imports: the root modules and the imports
their functions make on first use (a Pallas kernel imports jax inside the call that runs it on a TPU).

The CPU twins replace those kernels, so nothing that runs here would notice a missing TPU-path package;
this does. Run under the stack's interpreter with ``{"roots": [...], "absent": [...]}`` on stdin; the last
stdout line is JSON ``{"imported": [...], "failed": {module: error}}``. A root ending in ``.*`` stands for
every module of that package; ``absent`` names packages the stack uses only when installed (another
backend). Imports guarded by ``except ImportError`` are optional by the stack's own word and skipped.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import pkgutil
import sys

OPTIONAL = {"ImportError", "ModuleNotFoundError"}


def _guarded(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        kind = handler.type
        names.update(e.id for e in (kind.elts if isinstance(kind, ast.Tuple) else [kind]) if isinstance(e, ast.Name))
    return bool(names & OPTIONAL)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_in(module: str) -> list[str]:
    """Every absolute module name ``module``'s source imports, at any depth, outside optional guards."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    tree = ast.parse(open(spec.origin, encoding="utf-8").read())
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Try) and _guarded(node) or _type_checking_only(node):
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module
            found.append(base)
            # `from pkg import submodule` imports a module too
            found.extend(f"{base}.{a.name}" for a in node.names if _is_submodule(base, a.name))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _is_submodule(package: str, name: str) -> bool:
    try:
        spec = importlib.util.find_spec(package)
        return bool(spec and spec.submodule_search_locations and importlib.util.find_spec(f"{package}.{name}"))
    except (ImportError, ValueError):
        return False


def expand(roots: list[str]) -> list[str]:
    modules: list[str] = []
    for root in roots:
        if root.endswith(".*"):
            package = importlib.import_module(root[:-2])
            modules += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
        else:
            modules.append(root)
    return modules


def check(roots: list[str], absent: tuple[str, ...] = ()) -> dict:
    imported: list[str] = []
    failed: dict[str, str] = {}
    for module in dict.fromkeys(expand(roots)):
        try:
            wanted = [m for m in [module, *imports_in(module)] if m.partition(".")[0] not in absent]
        except (ImportError, ValueError, SyntaxError) as exc:
            failed[module] = f"{type(exc).__name__}: {exc}"
            continue
        for name in dict.fromkeys(wanted):
            try:
                importlib.import_module(name)
                imported.append(name)
            except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
                failed[name] = f"{type(exc).__name__}: {exc}"
    return {"imported": sorted(set(imported)), "failed": failed}


if __name__ == "__main__":
    request = json.load(sys.stdin)
    print(json.dumps(check(request["roots"], tuple(request.get("absent", ())))))
