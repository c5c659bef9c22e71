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

The notebooks run with ``notebooks/`` as working directory (as under ``pytest --nbmake``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}")
KERNEL = {"name": "python3", "display_name": "Python 3", "language": "python"}


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


def _fill(client: NotebookClient, text: str, index: int) -> str:
    """Evaluate the markdown's placeholders in the kernel and substitute their values."""
    phs = PLACEHOLDER.findall(text)
    exprs = ", ".join(f"format(({e}), {s!r})" for e, s in map(_split, phs))
    probe = nbformat.v4.new_code_cell(f"import json as _json\nprint(_json.dumps([{exprs}]))")
    original = client.nb.cells[index]
    client.execute_cell(probe, index, store_history=False)
    client.nb.cells[index] = original  # execute_cell puts the cell it ran into the notebook
    errors = [o for o in probe.outputs if o.get("output_type") == "error"]
    if errors:
        raise RuntimeError(f"cell {index}: placeholder failed: {errors[0]['ename']}: {errors[0]['evalue']}")
    out = "".join(o.get("text", "") for o in probe.outputs if o.get("name") == "stdout")
    values = iter(json.loads(out.strip().splitlines()[-1]))
    return PLACEHOLDER.sub(lambda _m: next(values), text)


def execute(nb: nbformat.NotebookNode, timeout: int = 600) -> None:
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(HERE)}})
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
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
