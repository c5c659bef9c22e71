"""The notebooks: the committed ones match their sources in notebooks/src/, and every one runs.

``test_notebook_runs`` executes each source top to bottom the way ``python notebooks/build.py``
does (a kernel of this interpreter, with ``notebooks/`` as working directory, matplotlib's
inline backend, the takeaways' placeholders filled, every figure's axes checked for labels),
but in memory: nothing is written.  All notebooks together get ``NOTEBOOK_BUDGET_S`` seconds.
The result must match the committed notebook up to the digits of its numbers (which may move
in the last place from one machine to another): the same prose, figures in the same cells.  So
a notebook that fails, or whose committed outputs are stale (say, measurements landed and
nobody ran the builder), fails here.

The other tests only read the committed notebooks: nobody edited a source without rebuilding,
every placeholder was filled, and every figure has a takeaway right under it.
"""

import importlib.util
import re
import time
from pathlib import Path

import nbformat
import pytest

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
SOURCES = sorted((NB_DIR / "src").glob("*.py"))
#: seconds for executing all the notebooks together (about 30 s on two cores in 2025)
NOTEBOOK_BUDGET_S = 180.0
_spent = {"s": 0.0}
NUMBER = re.compile(r"[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def _builder():
    spec = importlib.util.spec_from_file_location("notebooks_build", NB_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _figure_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and any("image/png" in o.get("data", {}) for o in c.outputs)]


def _check_takeaways(nb) -> None:
    for i in _figure_cells(nb):
        nxt = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
        assert nxt is not None and nxt.cell_type == "markdown" and nxt.source.startswith("**Takeaway:**"), \
            f"cell {i}: a figure without a takeaway under it"


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
    _check_takeaways(nbformat.read(NB_DIR / f"{src.stem}.ipynb", as_version=4))


# One worker runs them all when pytest runs in several processes (pytest-xdist, --dist
# loadgroup), so that the budget above still counts every notebook.
@pytest.mark.xdist_group("notebooks")
@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_runs(src):
    build = _builder()
    left = NOTEBOOK_BUDGET_S - _spent["s"]
    if left <= 0:
        pytest.fail(f"the notebooks before {src.stem} took {_spent['s']:.0f} s of the {NOTEBOOK_BUDGET_S:.0f} s "
                    "allowed for all of them")
    nb = build.make_notebook(src)
    t0 = time.monotonic()
    try:
        build.execute(nb, timeout=left)  # raises on any error, with the cell and its traceback
    finally:
        _spent["s"] += time.monotonic() - t0
    _check_takeaways(nb)

    committed = nbformat.read(NB_DIR / f"{src.stem}.ipynb", as_version=4)
    assert len(nb.cells) == len(committed.cells)
    stale = f"{src.stem}.ipynb is stale: run python notebooks/build.py {src.stem[:2]} and commit it"
    for i, (new, old) in enumerate(zip(nb.cells, committed.cells)):
        if new.cell_type == "markdown":
            assert NUMBER.sub("#", new.source) == NUMBER.sub("#", old.source), \
                f"cell {i}: {stale}; it now reads\n{new.source}"
    assert _figure_cells(nb) == _figure_cells(committed), f"figures in other cells than committed: {stale}"


def test_unlabelled_axes_are_refused():
    build = _builder()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = build.KERNEL
    nb.cells = [nbformat.v4.new_code_cell(
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nax.set_xlabel('x (s)')\nplt.show()"
    )]
    with pytest.raises(Exception, match="y axis without a label"):
        build.execute(nb, timeout=60)
