"""Result files that never damage an earlier result: refuse to overwrite, write all or nothing.

Every command that writes files (``flashsim sweep``, ``report``, ``measure``, ``compare --out``)
writes them through :func:`staged`:

* the output folder must be named (``out=""`` is refused) and must not be an existing file;
* unless ``force``, it refuses to replace a file of an earlier result: an absent folder, an
  existing empty one, or one that holds none of the names about to be written is fine;
* the files are first written into a staging folder inside the output folder (same file system,
  so a rename is atomic); only when every one of them is complete are they moved into place,
  one ``os.replace`` each.  If anything fails before that, the staging folder is removed and the
  output folder holds what it held before, byte for byte (a folder the call created is removed
  again if it is left empty).

:func:`atomic_write` is the same for a single file written in one go.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: The process's umask, read once: a file made by :func:`tempfile.mkstemp` is private (0600) and gets
#: the permissions an ordinary ``open`` would have given it before it is renamed into place.
_UMASK = os.umask(0o022)
os.umask(_UMASK)

#: Prefix of the staging folder inside an output folder (a leading dot: hidden from ``ls``).
STAGING_PREFIX = ".flashsim-staging-"


class OutputExists(ValueError):
    """The output folder already holds files of an earlier result (pass ``force`` to replace them)."""


def output_folder(out: str | os.PathLike) -> Path:
    """``out`` as a Path, refused if empty or an existing file (``ValueError`` naming ``out``)."""
    if out is None or str(out) == "" or (isinstance(out, str) and not out.strip()):
        raise ValueError(f"out={None if out is None else str(out)!r}: give a folder for the results")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(out)!r}: is a file, not a folder")
    return path


def check_overwrite(out: str | os.PathLike, names: Iterable[str], force: bool = False,
                    what: str = "an earlier result") -> Path:
    """Refuse (:class:`OutputExists`) if ``out`` holds any of ``names`` and ``force`` is false.

    Returns ``out`` as a Path.  Call it before long work, so a refusal comes first, not last.
    """
    path = output_folder(out)
    if not force and path.is_dir():
        there = [n for n in names if (path / n).exists()]
        if there:
            raise OutputExists(f"out={str(out)!r}: holds {what} ({', '.join(there)}); "
                               "pass force=True to overwrite it")
    return path


@contextmanager
def staged(out: str | os.PathLike, names: Iterable[str] = (), force: bool = False,
           what: str = "an earlier result") -> Iterator[Path]:
    """Yield a staging folder; write the result's files into it.  On a normal exit they are moved
    into ``out`` (refused first, as a whole, if one would replace a file and ``force`` is false);
    on an exception they are deleted and ``out`` is left as it was."""
    path = check_overwrite(out, names, force, what)
    created = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=path))
    try:
        try:
            yield stage
            files = sorted(stage.iterdir())
            sub = [f.name for f in files if not f.is_file()]
            if sub:
                raise ValueError(f"out={str(out)!r}: results must be plain files, not {sub}")
            if not force:
                there = [f.name for f in files if (path / f.name).exists()]
                if there:
                    raise OutputExists(f"out={str(out)!r}: holds {what} ({', '.join(there)}); "
                                       "pass force=True to overwrite it")
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            for p in created:  # innermost first; only folders this call made, and only if empty
                try:
                    p.rmdir()
                except OSError:
                    break
            raise
        for f in files:
            os.replace(f, path / f.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def atomic_write(path: str | os.PathLike, write, mode: str = "w", **open_kw) -> None:
    """Write one file through a temporary name in its folder and ``os.replace``: readers see the
    old file or the new one, never half of one.  ``write(fh)`` writes the contents."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kw) as fh:
            write(fh)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["OutputExists", "output_folder", "check_overwrite", "staged", "atomic_write", "STAGING_PREFIX"]
