"""The committed notebooks match their sources in notebooks/src/ (without executing anything).

Executing them is CI's ``pytest --nbmake notebooks/``; this only checks that nobody edited a
source without rebuilding (``python notebooks/build.py``), that every placeholder of a takeaway
was filled, and that every figure has a takeaway right under it.
"""

import importlib.util
import re
from pathlib import Path

import pytest

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")


def _builder():
    spec = importlib.util.spec_from_file_location("notebooks_build", NB_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SOURCES = sorted((NB_DIR / "src").glob("*.py"))


def test_every_source_has_a_notebook():
    assert SOURCES
    for src in SOURCES:
        assert (NB_DIR / f"{src.stem}.ipynb").exists(), f"{src.name}: run python notebooks/build.py {src.stem[:2]}"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_matches_source(src):
    build = _builder()
    cells = build.parse_source(src.read_text())
    nb = nbformat.read(NB_DIR / f"{src.stem}.ipynb", as_version=4)
    assert [c.cell_type for c in nb.cells] == [k for k, _ in cells], "cells added or removed: rebuild"
    for i, ((kind, body), cell) in enumerate(zip(cells, nb.cells)):
        if kind == "code":
            assert cell.source == body, f"cell {i}: code differs from the source: rebuild"
            assert cell.execution_count is not None, f"cell {i}: not executed"
            assert not [o for o in cell.outputs if o.get("output_type") == "error"], f"cell {i}: error output"
        else:
            # the source's placeholders stand for whatever the build wrote in their place
            parts = build.PLACEHOLDER.split(body)[::2]
            pattern = "(.+?)".join(re.escape(p) for p in parts)
            assert re.fullmatch(pattern, cell.source, flags=re.S), f"cell {i}: markdown differs from the source"
            assert "{{" not in cell.source, f"cell {i}: unfilled placeholder"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_every_figure_has_a_takeaway(src):
    nb = nbformat.read(NB_DIR / f"{src.stem}.ipynb", as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if any("image/png" in o.get("data", {}) for o in cell.outputs):
            nxt = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
            assert nxt is not None and nxt.cell_type == "markdown" and nxt.source.startswith("**Takeaway:**"), \
                f"cell {i}: a figure without a takeaway under it"
