"""The project's import graph, its circles and the arrows docs/architecture.md forbids.

Run ``python scripts/import_graph.py`` (exit 1 when anything is wrong); the test
``tests/test_architecture.py`` runs the same checks. Imports are read as text (``ast``),
at every depth: an import inside a function is still an arrow, because it still ties the
two modules together; it only moves the failure from import time to call time.

Tests and migrations are left out: tests may reach anywhere, and migrations are frozen
history that Django generates.

Standard library only, so it runs before any environment is installed.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("counselor_engine", "webapp", "training_worker", "scripts")
SKIPPED_DIRS = frozenset({"tests", "migrations", "__pycache__"})

# The web apps in their one direction: a domain module may import domain modules of the
# apps before its own (docs/architecture.md, "Inside webapp").
APP_ORDER = ("accounts", "memory", "learning", "oversight", "counseling")
# Transports and presentation: they may call any app's domain modules, never another
# app's outer ring.
OUTER_NAMES = frozenset(
    {"views", "consumers", "urls", "admin", "forms", "simlab", "simreport", "apps"}
)
OUTER_PARTS = frozenset({"templatetags", "management"})
COMPOSITION_ROOT = frozenset(
    {
        "webapp",
        "webapp.settings",
        "webapp.urls",
        "webapp.asgi",
        "webapp.routing",
        "webapp.wsgi",
        "webapp.celery",
        "webapp.health",
    }
)
# Third-party top-level names that only the web side may import.
WEB_FRAMEWORKS = ("django", "channels", "celery", "daphne", "django_htmx")


@dataclass(frozen=True)
class Arrow:
    """One import: ``source`` imports ``target`` (both dotted module names)."""

    source: str
    target: str
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if SKIPPED_DIRS.intersection(path.relative_to(root).parts):
                continue
            modules[module_name(path, root)] = path
    return modules


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement asks for (``from a import b`` gives ``a.b``,
    which resolves to module ``a.b`` when it is one, else to ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]


def arrows_of(module: str, path: Path, modules: Mapping[str, Path]) -> list[Arrow]:
    """Every project module that ``module`` imports, once per target (first line)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names = _imported_names(node, module, is_package)
        if isinstance(node, ast.ImportFrom):
            # ``from a import b``: b is a submodule if one exists, else a name in a.
            members = [n for n in names[:-1] if n in modules]
            names = members or names[-1:]
        for name in names:
            target = _resolve(name, modules)
            if target and target != module:
                found.setdefault(target, node.lineno)
    return [Arrow(module, target, line) for target, line in sorted(found.items())]


def third_party_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def build_graph(root: Path = ROOT) -> tuple[dict[str, Path], list[Arrow]]:
    modules = find_modules(root)
    arrows = [a for m, p in modules.items() for a in arrows_of(m, p, modules)]
    return modules, arrows


def circles(nodes: Iterable[str], arrows: Iterable[Arrow]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a in arrows:
        succ.setdefault(a.source, []).append(a.target)
        succ.setdefault(a.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in succ:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
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
    return sorted(found)


# --- the documented directions ---------------------------------------------------------------
def _app(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "webapp" and len(parts) > 2 and parts[1] in APP_ORDER else None


def web_kind(module: str) -> str:
    """``root``, ``lib``, ``models``, ``outer`` or ``domain`` for a webapp module."""
    if module in COMPOSITION_ROOT:
        return "root"
    parts = module.split(".")
    if parts[1] == "lib":
        return "lib"
    if _app(module) is None:
        return "root"
    rest = parts[2:]
    if rest[0] == "models":
        return "models"
    leaf = rest[-1]
    if (
        OUTER_PARTS.intersection(rest)
        or leaf in OUTER_NAMES
        or leaf.endswith("_views")
        or leaf.endswith("_urls")
    ):
        return "outer"
    return "domain"


def web_violation(source: str, target: str) -> str | None:
    """Why ``source -> target`` breaks the web side's direction, or None when it is allowed."""
    src_kind, dst_kind = web_kind(source), web_kind(target)
    if src_kind == "root" or dst_kind == "lib":
        return None if dst_kind != "root" or src_kind == "root" else _root_rule(target)
    if dst_kind == "root":
        return _root_rule(target)
    src_app, dst_app = _app(source), _app(target)
    if src_kind == "lib":
        return None if dst_kind == "models" else "webapp.lib imports only apps' models"
    if src_kind == "models":
        return None if dst_kind == "models" else "models import only webapp.lib and models"
    if src_app == dst_app or dst_kind == "models":
        return None
    if dst_kind == "outer":
        return "no module imports another app's views, sockets, forms or commands"
    if src_kind == "outer":
        return None
    assert src_app is not None and dst_app is not None
    if APP_ORDER.index(dst_app) < APP_ORDER.index(src_app):
        return None
    return f"domain modules import earlier apps only ({' < '.join(APP_ORDER)})"


def _root_rule(target: str) -> str | None:
    # The Celery app is the one root module that everyone may name (to queue by task name).
    return None if target in {"webapp", "webapp.celery"} else "only the composition root imports it"


def violation(arrow: Arrow) -> str | None:
    """Why an arrow breaks the package directions, or None."""
    src, dst = arrow.source.split(".")[0], arrow.target.split(".")[0]
    if src == "counselor_engine" and dst != src:
        return "counselor_engine imports no other project package"
    if src == "webapp" and dst in {"training_worker", "scripts"}:
        return "webapp queues training by task name and never imports training_worker or scripts"
    if src == "training_worker" and dst == "scripts":
        return "training_worker never imports scripts"
    if src == dst == "webapp":
        return web_violation(arrow.source, arrow.target)
    return None


def engine_framework_imports(modules: Mapping[str, Path]) -> list[str]:
    """Engine modules that import a web framework: the engine must run without Django."""
    bad = []
    for name, path in modules.items():
        if name.split(".")[0] == "counselor_engine":
            hit = sorted(third_party_roots(path).intersection(WEB_FRAMEWORKS))
            if hit:
                bad.append(f"{name} imports {', '.join(hit)}")
    return bad


def problems(root: Path = ROOT) -> list[str]:
    modules, arrows = build_graph(root)
    found = [f"circle: {' <-> '.join(c)}" for c in circles(modules, arrows)]
    for arrow in arrows:
        why = violation(arrow)
        if why:
            found.append(f"{arrow.source}:{arrow.line} -> {arrow.target}: {why}")
    found.extend(engine_framework_imports(modules))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    found = problems(args.root)
    for line in found:
        print(line)
    modules, arrows = build_graph(args.root)
    print(f"{len(modules)} modules, {len(arrows)} arrows, {len(found)} problems", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
