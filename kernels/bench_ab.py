"""A/B of two trees' kernels: is a change in speed outside the trees' own run-to-run spread?

    python -m kernels.bench_ab RUNS           # RUNS: a folder of old_1.csv, new_1.csv, old_2.csv, ...
                                              # or one CSV of them packed (tree and run columns)
    python -m kernels.bench_ab --pack FOLDER OUT.csv [--force]

Each ``<tree>_<run>.csv`` is one ``kernels.bench`` process of tree ``old`` or ``new``
(``scripts/device/ab_bench.sh`` alternates them, old, new, old, new, ..., in one machine session,
the same bench file in both trees).  ``--pack`` joins a folder's runs into one CSV (columns
``tree`` and ``run`` added) and their ``.meta.json`` into ``OUT.meta.json`` (a list), since a
device call returns at most eight files; a folder without runs is refused, and so is an existing
``OUT`` (or ``OUT.meta.json``) without ``--force``.  Bad input (no runs, a file that is not a run or
a packed CSV) ends in one ``flashsim: error:`` line, exit status 2.  The measure is each of our
rows' same-run ratio to SDPA's flash backend (``x_sdpa_flash``; fp32, which that backend does not
take: ``x_sdpa_mem_eff``), the median over its rounds, so that the machine's drift between
processes cancels.

Per row (configuration, variant) it prints each run's ratio, new/old of the two trees' medians
over their runs, each tree's run-to-run spread ((max - min) / median of its runs' ratios), and a
verdict: ``outside`` where |new/old - 1| exceeds the larger of the two spreads (the change is
bigger than any disagreement between two runs of one tree), ``within`` where it does not, and
``?`` where a tree has fewer than two runs of the row (no spread to hold it against).
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics as st
import sys
from pathlib import Path

from flashsim.cmdline import ToolParser

from .bench import write

#: the peer whose same-run ratio is compared, per dtype (SDPA flash takes fp16/bf16 only)
PEER = {"fp16": "sdpa_flash", "bf16": "sdpa_flash", "fp32": "sdpa_mem_eff"}
_RUN = re.compile(r"^(old|new)_(\d+)\.csv$")


def _num(x) -> float:
    try:
        return float(x) if x not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _run_files(folder: str | Path) -> list[tuple[str, int, Path]]:
    """(tree, run, path) of a folder's ``<tree>_<run>.csv``, in run order, old before new."""
    found = []
    for p in Path(folder).iterdir():
        m = _RUN.match(p.name)
        if m:
            found.append((m.group(1), int(m.group(2)), p))
    return sorted(found, key=lambda x: (x[1], x[0] != "old"))


#: The columns every row of a run needs (and, in a packed CSV, ``tree`` and ``run`` too).
COLUMNS = ("config", "variant")


def _read(path: Path, columns: tuple[str, ...] = COLUMNS) -> list[dict]:
    """A CSV's rows; ValueError naming the file when it cannot be read or has rows but lacks
    ``columns`` (a run that timed nothing has neither rows nor header: no rows, not an error)."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            fields = reader.fieldnames or ()
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"csv={str(path)!r}: {getattr(e, 'strerror', None) or e}") from None
    missing = [c for c in columns if c not in fields]
    if rows and missing:
        raise ValueError(f"csv={str(path)!r}: not a kernels.bench run (no {', '.join(missing)} column)")
    return rows


def load_runs(path: str | Path) -> dict[str, list[dict]]:
    """tree -> its runs in order, each {(config, variant): row} of our variants' rows; from a folder
    of ``<tree>_<run>.csv`` or from one packed CSV (:func:`pack`)."""
    path = Path(path)
    if path.is_file():
        tagged = []
        for line, r in enumerate(_read(path, (*COLUMNS, "tree", "run")), 2):
            try:
                tagged.append((r["tree"], int(r["run"]), r))
            except (TypeError, ValueError):
                raise ValueError(f"csv={str(path)!r}: line {line}: run={r['run']!r} is not an integer") from None
    else:
        tagged = [(t, i, r) for t, i, p in _run_files(path) for r in _read(p)]
    runs: dict[str, dict[int, dict]] = {"old": {}, "new": {}}
    for tree, i, r in tagged:
        if tree in runs and r["variant"].startswith("ours_"):
            runs[tree].setdefault(i, {})[(r["config"], r["variant"])] = r
    return {t: [rs[i] for i in sorted(rs)] for t, rs in runs.items()}


def pack(folder: str | Path, out: str | Path, force: bool = False) -> int:
    """One CSV of a folder's runs (``tree`` and ``run`` columns added) and ``OUT.meta.json``, the
    list of their provenance; returns the number of runs packed.  ValueError, before anything is
    written, for a folder without runs, a run that cannot be read, or an existing ``OUT`` or
    ``OUT.meta.json`` unless ``force``.  Written to temporary names, then renamed."""
    out = Path(out)
    meta_out = out.with_name(out.stem + ".meta.json")
    if out.is_dir():
        raise ValueError(f"out={str(out)!r}: is a folder (give the packed CSV's file name)")
    if not force and (out.exists() or meta_out.exists()):
        there = out if out.exists() else meta_out
        raise ValueError(f"out={str(there)!r} exists (give --force to overwrite it)")
    if not Path(folder).is_dir():
        raise ValueError(f"folder={str(folder)!r} is not a folder")
    found = _run_files(folder)
    if not found:
        raise ValueError(f"folder={str(folder)!r}: no runs (old_<i>.csv, new_<i>.csv) to pack")
    rows, metas = [], []
    for tree, i, p in found:
        rows += [dict(r, tree=tree, run=i) for r in _read(p)]
        m = p.with_name(p.stem + ".meta.json")
        try:
            meta = json.loads(m.read_text()) if m.is_file() else {}
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"{str(m)!r}: not a JSON provenance ({e})") from None
        metas.append(dict(meta if isinstance(meta, dict) else {"meta": meta}, tree=tree, run=i))
    write(out, rows, metas)
    return len(metas)


def ratio(row: dict) -> tuple[str, float]:
    """(peer, the row's same-run ratio to it)."""
    peer = PEER.get(row.get("dtype", ""), "sdpa_flash")
    return peer, _num(row.get(f"x_{peer}"))


def spread(xs: list[float]) -> float:
    """(max - min) / median of a tree's runs (NaN for fewer than two)."""
    return (max(xs) - min(xs)) / st.median(xs) if len(xs) >= 2 else math.nan


def compare(runs: dict[str, list[dict]]) -> list[dict]:
    """One entry per row that both trees ran: the runs' ratios, new/old, spreads, verdict."""
    keys = sorted({k for rs in runs.values() for r in rs for k in r})
    out = []
    for key in keys:
        peer, xs = None, {}
        for tree in ("old", "new"):
            vals = []
            for r in runs.get(tree, []):
                if key in r:
                    peer, x = ratio(r[key])
                    if math.isfinite(x):
                        vals.append(x)
            xs[tree] = vals
        if not xs["old"] or not xs["new"]:
            continue
        rel = st.median(xs["new"]) / st.median(xs["old"])
        so, sn = spread(xs["old"]), spread(xs["new"])
        noise = max(so, sn)
        verdict = "?" if math.isnan(so) or math.isnan(sn) else ("outside" if abs(rel - 1) > noise else "within")
        out.append({"config": key[0], "variant": key[1], "peer": peer, "old": xs["old"], "new": xs["new"],
                    "new_over_old": rel, "old_spread": so, "new_spread": sn, "verdict": verdict})
    return out


def render(rows: list[dict]) -> str:
    if not rows:
        return "no row was run by both trees\n"
    width = max(len(r["old"]) for r in rows), max(len(r["new"]) for r in rows)
    lines = [f"{'config':30s} {'variant':18s} {'peer':12s} {'old runs':>{8 * width[0]}s} "
             f"{'new runs':>{8 * width[1]}s}  new/old  old spr  new spr  verdict"]

    def runs(xs, w):
        return " ".join(f"{x:7.3f}" for x in xs).rjust(8 * w)

    def pct(x):
        return "      -" if math.isnan(x) else f"{x:7.1%}"

    for r in rows:
        lines.append(f"{r['config']:30s} {r['variant']:18s} {r['peer']:12s} {runs(r['old'], width[0])} "
                     f"{runs(r['new'], width[1])}  {r['new_over_old']:7.3f}  {pct(r['old_spread'])}  "
                     f"{pct(r['new_spread'])}  {r['verdict']}")
    rel = [r["new_over_old"] for r in rows]
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("within", "outside", "?")}
    lines.append(f"new/old of the same-run ratio over {len(rows)} rows: median {st.median(rel):.3f}, "
                 f"min {min(rel):.3f}, max {max(rel):.3f}; within the trees' run-to-run spread: {counts['within']}, "
                 f"outside it: {counts['outside']}, fewer than two runs of a tree: {counts['?']}")
    outside = [r for r in rows if r["verdict"] == "outside"]
    for r in outside:
        noise = max(r["old_spread"], r["new_spread"])
        lines.append(f"  outside: {r['config']} {r['variant']}: new/old {r['new_over_old']:.3f} against a "
                     f"run-to-run spread of {noise:.1%}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", help="folder of old_<i>.csv and new_<i>.csv (kernels.bench runs), or "
                                            "their packed CSV")
    ap.add_argument("--pack", nargs=2, default=None, metavar=("FOLDER", "OUT"), help="pack FOLDER's runs into OUT")
    ap.add_argument("--force", action="store_true", help="with --pack: overwrite an existing OUT")
    a = ap.parse_args(argv)
    if a.pack:
        try:
            n = pack(*a.pack, force=a.force)
        except ValueError as e:
            print(f"flashsim: error: {e}", file=sys.stderr)
            return 2
        print(f"packed {n} runs into {a.pack[1]}")
        return 0
    if a.force:
        print("flashsim: error: --force: only with --pack (nothing else is written)", file=sys.stderr)
        return 2
    if not a.runs or not Path(a.runs).exists():
        print(f"flashsim: error: runs={a.runs!r}: give a folder of runs or a packed CSV", file=sys.stderr)
        return 2
    try:
        runs = load_runs(a.runs)
        if not runs["old"] and not runs["new"]:
            raise ValueError(f"runs={a.runs!r}: no run of either tree (a folder of old_<i>.csv and new_<i>.csv, "
                             "or their packed CSV)")
    except ValueError as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    print(f"runs: old {len(runs['old'])}, new {len(runs['new'])}")
    sys.stdout.write(render(compare(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
