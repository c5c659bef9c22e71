"""Where a result came from: the commit of the code that made it.

One function, :func:`git_state`, for every record the project writes (``flashsim measure``,
the L2 calibration, the tuner of ``kernels.perf.autotune``): it lives in the lowest layer so that
``kernels`` and ``analysis`` both use it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: The repository this package is a checkout of (if it is one).
REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    """``git -C REPO args`` (stdout), or None if git or the repository is not there."""
    try:
        p = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_state() -> dict:
    """``{"git_commit", "git_dirty"}`` of the code that runs.

    From ``git -C <this package's repository>``, so it holds when the command runs from another
    folder; None (unknown) when the package is not in a git checkout of its own (an installed
    copy).  ``git_dirty``: tracked files differ from the commit (staged or not; untracked files do
    not count).  On a machine that has the code without its ``.git`` (a copy of the working tree),
    the environment says: ``FLASHSIM_GIT_COMMIT`` and ``FLASHSIM_GIT_DIRTY`` (1 or 0).
    """
    commit = os.environ.get("FLASHSIM_GIT_COMMIT")
    if commit:
        flag = os.environ.get("FLASHSIM_GIT_DIRTY", "").strip().lower()
        dirty = True if flag in ("1", "true", "yes") else False if flag in ("0", "false", "no") else None
        return {"git_commit": commit, "git_dirty": dirty}
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != REPO:  # not a checkout of this package (e.g. a venv in one)
        return {"git_commit": None, "git_dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": _git("rev-parse", "HEAD"), "git_dirty": None if status is None else status != ""}
