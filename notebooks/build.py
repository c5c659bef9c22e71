"""Build the notebooks from their Python sources and execute them, outputs included.

    python notebooks/build.py              # every notebook
    python notebooks/build.py 02 04        # those whose name starts with 02 or 04
    python notebooks/build.py --no-exec    # write them without running (outputs empty)

Each notebook is written as ``notebooks/src/<name>.py`` in the "percent" format: a line
``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell whose lines are comments
(``# `` stripped).  A markdown cell may quote numbers computed by the code above it through
placeholders ``{{expression|format}}`` (format as in ``format(value, spec)``, may be empty):
the builder evaluates each expression in the notebook's kernel right after the cells before
it have run, and writes the value into the markdown.  So the takeaway under a figure always
quotes the numbers that the figure was drawn from, and re-running the builder after new data
lands updates both.

The notebooks run with ``notebooks/`` as working directory, in a kernel of the interpreter that
runs the builder (ipykernel's own kernel spec, whatever other "python3" kernel specs are
installed), with matplotlib's inline backend (non-interactive: each figure becomes a PNG in the
cell's output).  Every figure shown must have labelled axes: ``plt.show()`` fails otherwise.

``tests/test_notebooks.py`` executes every source the same way, in memory (nothing is
written), within a time budget, and checks the result against the committed notebook.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import default

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}")
KERNEL = {"name": "python3", "display_name": "Python 3", "language": "python"}
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"

# Run in the kernel before the first cell: plt.show() refuses a figure with an unlabelled axis.
FIGURE_CHECK = """\
def _flashsim_check_figures():
    import matplotlib.pyplot as plt

    show = plt.show

    def checked_show(*args, **kwargs):
        for num in plt.get_fignums():
            fig = plt.figure(num)
            for ax in fig.axes:
                if not ax.get_visible() or not ax.axison:
                    continue
                name = repr(ax.get_title() or fig.get_suptitle() or f"figure {num}")
                if hasattr(ax, "_colorbar"):
                    assert ax.get_xlabel() or ax.get_ylabel(), f"{name}: colorbar without a label"
                    continue
                assert ax.get_xlabel(), f"{name}: x axis without a label"
                shared = [o for o in ax.get_shared_y_axes().get_siblings(ax) if o is not ax]
                assert ax.get_ylabel() or any(o.get_ylabel() for o in shared), f"{name}: y axis without a label"
        return show(*args, **kwargs)

    plt.show = checked_show


_flashsim_check_figures()
del _flashsim_check_figures
"""


class _NativeKernelManager(AsyncKernelManager):
    """A kernel manager whose "python3" is always ipykernel's own spec, i.e. the interpreter
    running this script, even if a user-level kernel spec of that name points elsewhere."""

    @default("kernel_spec_manager")
    def _kernel_spec_manager_default(self) -> KernelSpecManager:
        return KernelSpecManager(kernel_dirs=[])


def parse_source(text: str) -> list[tuple[str, str]]:
    """The (cell type, source) pairs of a percent-format file."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            kind = "markdown" if "[markdown]" in line else "code"
            cells.append((kind, []))
            continue
        if not cells:
            if line.strip():
                raise ValueError(f"text before the first '# %%' marker: {line!r}")
            continue
        kind, body = cells[-1]
        if kind == "markdown":
            if line.strip() and not line.startswith("#"):
                raise ValueError(f"markdown line not commented out: {line!r}")
            line = line[2:] if line.startswith("# ") else line.lstrip("#")
        body.append(line)
    out = []
    for kind, body in cells:
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        out.append((kind, "\n".join(body)))
    return out


def make_notebook(src: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    for kind, body in parse_source(src.read_text()):
        if kind == "code":
            nb.cells.append(nbformat.v4.new_code_cell(body))
        else:
            nb.cells.append(nbformat.v4.new_markdown_cell(body))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{src.stem[:2]}-{i:02d}"  # stable ids: rebuilding changes only what changed
    return nb


def _split(ph: str) -> tuple[str, str]:
    expr, _, spec = ph.rpartition("|") if "|" in ph else (ph, "", "")
    return expr.strip(), spec.strip()


def _probe(client: NotebookClient, code: str, index: int, what: str):
    """Run code in the kernel outside the notebook; the JSON it prints last is returned."""
    probe = nbformat.v4.new_code_cell(code)
    original = client.nb.cells[index]
    try:
        client.execute_cell(probe, index, store_history=False)
    except Exception as e:
        raise RuntimeError(f"cell {index}: {what} failed: {e}") from e
    finally:
        client.nb.cells[index] = original  # execute_cell puts the cell it ran into the notebook
    out = "".join(o.get("text", "") for o in probe.outputs if o.get("name") == "stdout")
    return json.loads(out.strip().splitlines()[-1])


def _fill(client: NotebookClient, text: str, index: int) -> str:
    """Evaluate the markdown's placeholders in the kernel and substitute their values."""
    phs = PLACEHOLDER.findall(text)
    exprs = ", ".join(f"format(({e}), {s!r})" for e, s in map(_split, phs))
    values = iter(_probe(client, f"import json as _json\nprint(_json.dumps([{exprs}]))", index, "placeholder"))
    return PLACEHOLDER.sub(lambda _m: next(values), text)


def _check_kernel(client: NotebookClient) -> None:
    """The kernel runs this interpreter, in notebooks/, and plt.show() checks the axis labels."""
    where = _probe(client, "import json as _json, os as _os, sys as _sys\n"
                           "print(_json.dumps([_sys.prefix, _os.getcwd()]))", 0, "kernel check")
    if Path(where[0]).resolve() != Path(sys.prefix).resolve():
        raise RuntimeError(f"the kernel runs the Python of {where[0]}, not this one ({sys.prefix})")
    if Path(where[1]).resolve() != HERE:
        raise RuntimeError(f"the kernel runs in {where[1]}, not in {HERE}")
    _probe(client, FIGURE_CHECK + "print('[]')", 0, "figure check setup")


def execute(nb: nbformat.NotebookNode, timeout: float = 1800) -> None:
    """Run the notebook's cells in order and fill its placeholders, in place; any error raises
    (nbclient's CellExecutionError, with the traceback).  timeout: seconds for the whole
    notebook, kernel start excepted."""
    client = NotebookClient(nb, kernel_name="python3", kernel_manager_class=_NativeKernelManager,
                            record_timing=False, resources={"metadata": {"path": str(HERE)}})
    with client.setup_kernel(env={**os.environ, "MPLBACKEND": INLINE_BACKEND}):
        deadline = time.monotonic() + timeout
        client.timeout = max(1, math.ceil(timeout))
        _check_kernel(client)
        for i, cell in enumerate(nb.cells):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"cell {i}: the notebook has run past its {timeout:g} s")
            client.timeout = max(1, math.ceil(left))  # nbclient's timeout is per cell
            if cell.cell_type == "code":
                client.execute_cell(cell, i)
            elif PLACEHOLDER.search(cell.source):
                cell.source = _fill(client, cell.source, i)


def build(names: list[str], run: bool = True) -> None:
    sources = sorted(SRC.glob("*.py"))
    if names:
        sources = [s for s in sources if any(s.stem.startswith(n) for n in names)]
    for src in sources:
        t0 = time.time()
        nb = make_notebook(src)
        if run:
            execute(nb)
        nbformat.validate(nb)
        dest = HERE / f"{src.stem}.ipynb"
        nbformat.write(nb, dest)
        print(f"{dest.relative_to(HERE.parent)}: {len(nb.cells)} cells, {time.time() - t0:.1f} s", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook name prefixes (default: all)")
    ap.add_argument("--no-exec", action="store_true", help="write the notebooks without executing them")
    args = ap.parse_args(argv)
    build(args.names, run=not args.no_exec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
