"""The argument parser of the project's tools (``python -m kernels.bench``, ``analysis.worker``,
``benchmarks/...``): argparse's own complaints (an unknown flag, a missing argument, a bad choice,
a tool's ``ap.error(...)``) end in the one line ``flashsim: error: ...`` and exit status 2, as
bad input to ``flashsim`` itself does, rather than argparse's usage block and its error line.
"""

from __future__ import annotations

import argparse
import sys


def _prog_of(globals_: dict) -> str:
    """How the tool whose module globals are ``globals_`` is started: ``python -m package.module``
    (also when its ``main`` is called from elsewhere, e.g. a test), or ``python path/to/script.py``
    for a script run by path."""
    name = globals_.get("__name__") or "flashsim"
    if name == "__main__":
        spec = globals_.get("__spec__")
        if spec is None or not spec.name:  # a script run by its path
            return f"python {sys.argv[0] if sys.argv and sys.argv[0] else globals_.get('__file__', name)}"
        name = spec.name.removesuffix(".__main__")
    return f"python -m {name}"


class ToolParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one ``flashsim: error:`` line naming
    the tool's ``--help`` (exit 2); ``prog`` defaults to how the module building it is started."""

    def __init__(self, *args, **kwargs):
        if not args and "prog" not in kwargs:
            kwargs["prog"] = _prog_of(sys._getframe(1).f_globals)  # the module that builds the parser
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"flashsim: error: {message} (see '{self.prog} --help')\n")


__all__ = ["ToolParser"]
