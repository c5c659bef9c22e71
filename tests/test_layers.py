"""Layers only look down: flashsim <- kernels <- analysis.

Every module of the three packages is parsed with ``ast`` and every import it makes is checked,
including imports inside functions and ``importlib.import_module``/``__import__`` calls with a
literal (or f-string) name: ``flashsim`` imports neither ``kernels`` nor ``analysis``, ``kernels``
never imports ``analysis``.  ``analysis`` may import both; the whole command line is assembled
there (``analysis/cli.py``).  The one exception is ``flashsim/__main__.py``: it is the
``python -m flashsim`` program, which runs that command line, and no module imports it.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: package -> the packages of the project it may import (besides itself)
MAY_IMPORT = {"flashsim": set(), "kernels": {"flashsim"}, "analysis": {"flashsim", "kernels"}}
PROJECT = set(MAY_IMPORT)
#: modules allowed more than their layer, with the reason
EXEMPT = {
    "flashsim/__main__.py": ({"analysis"}, "the `python -m flashsim` program: it runs analysis.cli.main"),
}


def _modules() -> list[Path]:
    return sorted(p for pkg in MAY_IMPORT for p in (ROOT / pkg).rglob("*.py"))


def _literal_prefix(node: ast.AST) -> str | None:
    """A module name given as a string literal, or the literal start of an f-string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def imported_packages(path: Path) -> dict[str, int]:
    """Top-level package -> first line, for every absolute import in the module (relative imports
    stay inside the module's own package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, int] = {}

    def add(name: str | None, line: int) -> None:
        if name and not name.startswith("."):
            found.setdefault(name.split(".")[0], line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                add(node.module, node.lineno)
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in ("import_module", "__import__"):
                add(_literal_prefix(node.args[0]), node.lineno)
    return found


def test_every_package_is_found():
    mods = _modules()
    for pkg in MAY_IMPORT:
        assert any(p.relative_to(ROOT).parts[0] == pkg for p in mods), pkg
    assert len(mods) > 30


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_look_down(path):
    rel = path.relative_to(ROOT).as_posix()
    pkg = rel.split("/")[0]
    allowed = MAY_IMPORT[pkg] | EXEMPT.get(rel, (set(), ""))[0]
    wrong = {p: line for p, line in imported_packages(path).items() if p in PROJECT and p != pkg and p not in allowed}
    assert not wrong, f"{rel} imports a layer above its own: " + ", ".join(f"{p} (line {n})" for p, n in wrong.items())


def test_the_checker_sees_function_level_and_dynamic_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\n"
                   "def f():\n    from analysis.compare import run\n"
                   "def g(name):\n    import importlib\n    return importlib.import_module(f'kernels.perf.{name}')\n"
                   "from . import sibling\n")
    assert imported_packages(src) == {"os": 1, "analysis": 3, "importlib": 5, "kernels": 6}


def test_exemptions_are_still_needed():
    """An exemption that no longer imports what it is exempted for must be removed."""
    for rel, (extra, why) in EXEMPT.items():
        assert why
        assert extra & set(imported_packages(ROOT / rel)), rel
