"""Import circles in a package: every strongly connected component of its module graph.

Usage: ``python tools/import_cycles.py [PACKAGE_DIR] [--json] [--min-files N]``

Every ``.py`` file under PACKAGE_DIR (default ``fabric``) is parsed with :mod:`ast`; each
``import`` and ``from ... import`` counts wherever it stands: at module level, under
``if TYPE_CHECKING:``, inside a function. Relative imports are resolved against the importing
module. ``from a.b import c`` is an edge to ``a.b.c`` when that is a module of the package, else
to ``a.b``; an import of ``a.b.c`` is an edge to the deepest module of the package it names (a
package's ``__init__`` is that package's module). The parent packages whose ``__init__``
Python runs on the way are not counted as imported (each import would else close a circle
through a package that re-exports its modules). Imports of modules outside the package are
left out.

A circle of more than ``--min-files`` files (default 2) is a closed path of imports through that
many distinct modules. Each strongly connected component (Tarjan) holding one is printed, largest
first, with its members and one such circle; a component made only of pairs that import each
other through one hub (a module whose helpers import it back for its type) holds no longer circle
and is named as pairs, which do not fail the check. With ``--json``, one JSON document
``{"package": ..., "modules": N, "cycles": [[module, ...], ...], "circles": [[module, ...], ...],
"pairs": [[module, ...], ...]}``. Exits 1 when any circle is found, 0 when none, 2 on bad input.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file below ``root`` (the package dir)."""
    base = root.resolve().parent
    names: dict[str, Path] = {}
    for path in sorted(root.resolve().rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest module of the package that ``name`` (dotted) names, or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its file."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # a relative import: level 1 is the module's own package
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                up = node.level - 1
                if up > len(anchor):
                    continue  # beyond the top of the tree: not ours
                anchor = anchor[: len(anchor) - up] if up else anchor
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            for alias in node.names:
                target = modules.get(f"{base}.{alias.name}") and f"{base}.{alias.name}"
                target = target or _resolve(base, modules)
                if target is not None:
                    found.add(target)
    found.discard(module)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components (iterative Tarjan), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                result.append(sorted(comp))
    result.sort(key=lambda c: (-len(c), c))
    return result


def circle_longer_than(comp: list[str], edges: dict[str, set[str]], n: int, budget: int = 200_000) -> list[str] | None:
    """A closed path of imports through more than ``n`` distinct modules of ``comp``, or None.

    Depth-first from each member over simple paths inside the component; ``budget`` bounds the
    steps (components here have tens of modules; past the budget the whole component is
    returned, counted as a circle rather than passed)."""
    inside = set(comp)
    steps = 0
    for start in comp:
        path = [start]
        on_path = {start}
        todo = [sorted(e for e in edges.get(start, ()) if e in inside)]
        while todo:
            steps += 1
            if steps > budget:
                return list(comp)
            if not todo[-1]:
                todo.pop()
                on_path.discard(path.pop())
                continue
            nxt = todo[-1].pop()
            if nxt == start and len(path) > n:
                return list(path)
            if nxt in on_path or nxt < start:  # each circle is found from its smallest member
                continue
            path.append(nxt)
            on_path.add(nxt)
            todo.append(sorted(e for e in edges.get(nxt, ()) if e in inside))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Import circles (strongly connected components) in a package.")
    parser.add_argument("package", nargs="?", default="fabric", help="the package directory (default: fabric)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--min-files", type=int, default=2, help="report components of more files than this")
    args = parser.parse_args(argv)
    root = Path(args.package)
    if not (root / "__init__.py").is_file():
        print(f"error: {root} is not a package directory (no __init__.py)", file=sys.stderr)
        return 2
    if args.min_files < 1:
        print("error: --min-files must be at least 1", file=sys.stderr)
        return 2
    try:
        edges = graph(root)
    except SyntaxError as exc:
        print(f"error: cannot parse {exc.filename}: {exc.msg} (line {exc.lineno})", file=sys.stderr)
        return 2
    cycles: list[list[str]] = []
    circles: list[list[str]] = []
    pairs: list[list[str]] = []
    for comp in components(edges):
        if len(comp) <= args.min_files:
            continue
        circle = circle_longer_than(comp, edges, args.min_files)
        if circle is None:
            pairs.append(comp)
        else:
            cycles.append(comp)
            circles.append(circle)
    if args.json:
        doc = {"package": str(root), "modules": len(edges), "cycles": cycles, "circles": circles, "pairs": pairs}
        print(json.dumps(doc, indent=1))
    else:
        for c, circle in zip(cycles, circles, strict=True):
            print(f"{len(c)} files: {' '.join(c)}")
            print(f"  for one: {' -> '.join([*circle, circle[0]])}")
        for c in pairs:
            print(f"pairs only (no longer circle), {len(c)} files: {' '.join(c)}")
        print(f"{len(cycles)} import circles of more than {args.min_files} files in {len(edges)} modules of {root}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
