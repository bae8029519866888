"""The import graph has no circle and only the directions docs/architecture.md documents.

The first test checks the real tree; the others build small trees to show that the checker
notices each kind of wrong arrow (a checker that never fails would make the first test
worthless).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from scripts import import_graph as ig


def test_the_project_has_no_circle_and_no_forbidden_arrow() -> None:
    found = ig.problems()
    assert found == [], "\n".join(found)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != "." and not (root / parent / "__init__.py").exists():
                (root / parent / "__init__.py").write_text("")
        path.write_text(textwrap.dedent(text))
    return root


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "counselor_engine/a.py": "from counselor_engine.b import f\n",
            "counselor_engine/b.py": "def f():\n    from counselor_engine import a\n    return a\n",
            "counselor_engine/c.py": "from . import a\n",
        },
    )
    assert ig.problems(root) == ["circle: counselor_engine.a <-> counselor_engine.b"]


def test_relative_imports_resolve_to_modules(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "webapp/accounts/models.py": "",
            "webapp/accounts/services.py": "from .models import User\nfrom ..lib import audit\n",
            "webapp/lib/audit.py": "",
        },
    )
    _, arrows = ig.build_graph(root)
    assert {(a.source, a.target) for a in arrows} == {
        ("webapp.accounts.services", "webapp.accounts.models"),
        ("webapp.accounts.services", "webapp.lib.audit"),
    }


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("webapp.counseling.turns", "webapp.oversight.alerts", True),  # later -> earlier
        ("webapp.oversight.alerts", "webapp.counseling.turns", False),  # earlier -> later
        ("webapp.accounts.services", "webapp.counseling.models", True),  # models: anyone
        ("webapp.counseling.models", "webapp.accounts.models", True),
        ("webapp.counseling.models", "webapp.accounts.services", False),
        ("webapp.lib.audit", "webapp.oversight.models", True),
        ("webapp.lib.audit", "webapp.oversight.services", False),
        ("webapp.oversight.services", "webapp.counseling.consumers", False),  # outer ring
        ("webapp.accounts.views", "webapp.counseling.services", True),  # outer -> domain
        ("webapp.counseling.views", "webapp.accounts.views", False),  # outer -> outer
        ("webapp.counseling.views", "webapp.counseling.forms", True),  # same app
        ("webapp.memory.services", "webapp.settings", False),
        ("webapp.urls", "webapp.counseling.views", True),  # composition root
        ("webapp.oversight.services", "webapp.celery", True),
    ],
)
def test_web_direction(source: str, target: str, allowed: bool) -> None:
    why = ig.violation(ig.Arrow(source, target, 1))
    assert (why is None) is allowed, why


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("counselor_engine.judge", "webapp.lib.audit"),
        ("counselor_engine.judge", "training_worker.round"),
        ("webapp.learning.management.commands.lipo_round", "training_worker.round"),
        ("webapp.learning.services", "scripts.datastores"),
    ],
)
def test_package_directions(source: str, target: str) -> None:
    assert ig.violation(ig.Arrow(source, target, 1)) is not None


def test_the_engine_may_not_import_a_web_framework(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "counselor_engine/judge.py": "def f():\n    from django.conf import settings\n",
            "webapp/settings.py": "import django\n",
        },
    )
    assert ig.problems(root) == ["counselor_engine.judge imports django"]


def test_the_command_line_exits_nonzero_on_a_problem(tmp_path: Path, capsys) -> None:
    root = _tree(
        tmp_path,
        {
            "webapp/lib/x.py": "from webapp.accounts import services\n",
            "webapp/accounts/services.py": "",
        },
    )
    assert ig.main(["--root", str(root)]) == 1
    assert "webapp.lib imports only apps' models" in capsys.readouterr().out
    assert ig.main(["--root", str(_tree(tmp_path / "ok", {"webapp/lib/y.py": ""}))]) == 0
