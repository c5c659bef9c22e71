"""The README's performance table, generated from the benchmark's CSV.

    python -m kernels.bench_table kernels/data/bench_h100.csv            # print the table
    python -m kernels.bench_table kernels/data/bench_h100.csv [OFFGRID.csv ...] --readme README.md
    python -m kernels.bench_table GRID.csv OFFGRID.csv --readme README.md --block h200
    python -m kernels.bench_table --merge OUT.csv PART.csv [PART.csv ...] [--force]

The table has one line per configuration of the grid (pass, dtype, d, causal, N): the TFLOP/s of
torch's naive attention, of SDPA's flash, cuDNN and memory-efficient backends, and of our fastest
variant, with our ratios to naive, flash and cuDNN, all from the same run of ``kernels.bench``
(the ratios are the CSV's own ``x_*`` columns, so no number here is recomputed from another run;
a record timed in rounds shows each as its median ± half its interquartile range over the
rounds).  Rows of the off-grid shapes (``--shapes offgrid``), from the same CSV or from further
CSVs given after it, make a second table, one line per shape, pass and dtype.  A peer or ours
that does not take a configuration shows "n/a", listed with its reason under the tables, as are
the variants that failed.  The provenance line is the first CSV's.  ``--readme`` replaces the
block between the markers ``<!-- perf-table:start -->`` and ``<!-- perf-table:end -->``, or with
``--block NAME`` between ``<!-- perf-table-NAME:start -->`` and ``<!-- perf-table-NAME:end -->``
(the README has one block per record: the H100's, and the H200's at one commit); the tests hold
each README block equal to its committed CSVs' table.

``--merge`` joins CSVs written by separate ``kernels.bench`` runs (e.g. ``--only fwd-`` and
``--only bwd-``, to stay within a device call's time limit) into one, with a ``.meta.json``
listing each part's provenance (an existing OUT is refused without ``--force``); each
configuration's rows come from one run, so its ratios were still measured side by side.  A file
that is missing or not a ``kernels.bench`` record ends in one ``flashsim: error:`` line.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

from flashsim.cmdline import ToolParser
from flashsim.output import atomic_write

from .bench import write

START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
PEERS = ("naive", "sdpa_flash", "sdpa_cudnn")
SHOWN = PEERS + ("sdpa_mem_eff",)  # mem-eff: the one SDPA backend that takes fp32


def markers(block: str | None = None) -> tuple[str, str]:
    """The README markers around the table block ``block`` (None: the first, unnamed one)."""
    if block is None:
        return START, END
    if not block.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"block={block!r}: letters, digits, '-' and '_' only")
    return f"<!-- perf-table-{block}:start -->", f"<!-- perf-table-{block}:end -->"


def _num(x: str | None) -> float:
    try:
        return float(x) if x not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _fmt(x: float, digits: int) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


#: The columns every kernels.bench record has (what the tables read).
COLUMNS = ("variant", "pass", "dtype", "d", "causal", "n")


def load(path: str | Path) -> list[dict]:
    """The rows of a kernels.bench CSV; ValueError for a missing file or one without its columns."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            fields = reader.fieldnames  # read here: after the file closes, an empty file's header read fails
    except OSError as e:
        raise ValueError(f"csv={str(path)!r}: {e.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"csv={str(path)!r}: not a readable CSV ({e})") from None
    if not fields:
        raise ValueError(f"csv={str(path)!r}: the file is empty: not a kernels.bench record")
    missing = [c for c in COLUMNS if c not in fields]
    if missing or not rows:
        raise ValueError(f"csv={str(path)!r}: not a kernels.bench record (" +
                         (f"no {', '.join(missing)} column" if missing else "no rows") + ")")
    return rows


def _key(r: dict) -> tuple:
    return (r["pass"], r["dtype"], int(r["d"]), r["causal"] == "True", int(r["n"]))


def _offkey(r: dict) -> tuple:
    """An off-grid configuration: (set, pass, dtype, d, causal, N, Nk, B, H, Hkv)."""
    n = int(r["n"])
    return (r.get("set") or "grid", r["pass"], r["dtype"], int(r["d"]), r["causal"] == "True", n,
            int(r.get("nk") or n), int(r["batch"]), int(r["heads"]), int(r.get("kv_heads") or r["heads"]))


def is_grid(r: dict) -> bool:
    """Whether a row is of the bench grid (rows of records before the off-grid shapes have no set)."""
    return (r.get("set") or "grid") == "grid"


def _timed(r: dict) -> bool:
    return not r.get("error") and not r.get("na") and not math.isnan(_num(r.get("tflops")))


def ours_rows(rows: list[dict], key=_key) -> dict[tuple, dict]:
    """Per configuration key, the row of our fastest variant that ran (``ours_*``, no error)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if not r["variant"].startswith("ours_") or not _timed(r):
            continue
        k = key(r)
        if k not in best or _num(r["tflops"]) > _num(best[k]["tflops"]):
            best[k] = r
    return best


def has_spread(rows: list[dict]) -> bool:
    """Whether the record has each ratio's spread (runs with ``--rounds``)."""
    return any(r.get("x_sdpa_flash_q1") not in (None, "") or r.get("x_naive_q1") not in (None, "") for r in rows)


def _ratio(r: dict, peer: str, spread: bool) -> str:
    """Our ratio to a peer: the CSV's ``x_<peer>``, with ± half the interquartile range of the
    per-round ratios where the record has them."""
    x = _num(r.get(f"x_{peer}"))
    if math.isnan(x) or not spread:
        return _fmt(x, 2)
    q1, q3 = _num(r.get(f"x_{peer}_q1")), _num(r.get(f"x_{peer}_q3"))
    return f"{x:.2f}" if math.isnan(q1) or math.isnan(q3) else f"{x:.2f} ± {(q3 - q1) / 2:.2f}"


def _cells(k, peers, na, ours, ours_na, spread) -> list[str]:
    """The peers' TFLOP/s, ours, its variant and its ratios, for configuration key ``k``."""
    cells = [("n/a" if (k, v) in na else _fmt(peers.get((k, v), math.nan), 0)) for v in SHOWN]
    o = ours.get(k)
    if o is None:
        cells += ["n/a" if k in ours_na else "-", "-", "-", "-", "-"]
    else:
        cells += [_fmt(_num(o["tflops"]), 0), f"`{o['variant'][len('ours_'):]}`"]
        cells += [_ratio(o, v, spread) for v in PEERS]
    return cells


def _gather(rows, key):
    peers, na, ours_na = {}, set(), set()
    for r in rows:
        k = key(r)
        if r.get("na"):
            (ours_na.add(k) if r["variant"].startswith("ours") else na.add((k, r["variant"])))
        elif r["variant"] in SHOWN and not r.get("error"):
            peers[(k, r["variant"])] = _num(r["tflops"])
    return peers, na, ours_na, ours_rows(rows, key)


def _order(dtype: str) -> int:
    return {"fp16": 0, "bf16": 1, "fp32": 2}.get(dtype, 3)


def _footnotes(rows: list[dict]) -> list[str]:
    lines = []
    failed = sorted({(r["variant"], r.get("error")) + _key(r) + _extra(r) for r in rows if r.get("error")},
                    key=lambda x: (x[2] != "fwd", x[3] != "fp16", x[4:], x[0]))
    if failed:
        lines.append("")
        lines.append("Not timed (\"-\" above): " + "; ".join(
            f"{v} {p} {dt} d = {d}{' causal' if c else ''} N = {n:,}{ex} ({e})"
            for v, e, p, dt, d, c, n, ex in failed) + ".")
    na: dict[tuple, list] = {}
    for r in rows:
        if r.get("na"):
            na.setdefault((r["variant"], r["na"]), []).append(r)
    if na:
        lines.append("")
        lines.append("n/a (the variant does not take the configuration): " + "; ".join(
            f"{v} on {len(rs)} configuration{'s' if len(rs) > 1 else ''} ({why})" for (v, why), rs in
            sorted(na.items(), key=lambda x: (not x[0][0].startswith("ours"), x[0]))) + ".")
    return lines


def _extra(r: dict) -> tuple:
    """What names an off-grid row beyond the grid's key (empty for grid rows)."""
    if is_grid(r):
        return ("",)
    _, _, _, _, _, n, nk, b, h, hkv = _offkey(r)
    return (f"{' Nk = ' + format(nk, ',') if nk != n else ''} B = {b} H = {h}{f' Hkv = {hkv}' if hkv != h else ''}",)


def render(rows: list[dict], meta: dict | None = None) -> str:
    grid = [r for r in rows if is_grid(r)]
    spread = has_spread(rows)
    peers, na, ours_na, ours = _gather(grid, _key)
    keys = sorted({k for k, _ in peers} | {k for k, _ in na} | ours_na | set(ours),
                  key=lambda k: (k[0] != "fwd", k[1] != "fp16", k[1], k[2], k[3], k[4]))
    lines = []
    if meta:
        lines.append(f"TFLOP/s on an {meta.get('gpu')} (driver {meta.get('driver')}, torch {meta.get('torch')}, "
                     f"numba-cuda {meta.get('numba_cuda')}), B·H = 16·(16,384/N) for N < 16,384 else 16; "
                     "FLOPs 4·B·H·N²·d forward, 2.5x that backward, halved for causal.  "
                     "Ratios are ours over the peer, timed in the same run." + (
                         f"  Each ratio is the median over {meta.get('rounds', 'the')} rounds (variants interleaved) "
                         "of that round's ratio, ± half the interquartile range of those ratios." if spread else ""))
        lines.append("")
    lines.append("| pass | dtype | d | causal | N | naive | SDPA flash | SDPA cuDNN | SDPA mem-eff | ours | variant "
                 "| × naive | × flash | × cuDNN |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in keys:
        p, dt, d, causal, n = k
        cells = [p, dt, str(d), "yes" if causal else "no", f"{n:,}"] + _cells(k, peers, na, ours, ours_na, spread)
        lines.append("| " + " | ".join(cells) + " |")
    off = [r for r in rows if not is_grid(r)]
    if off:
        lines += ["", *render_offgrid(off, spread)]
    lines += _footnotes(rows)
    return "\n".join(lines) + "\n"


def render_offgrid(rows: list[dict], spread: bool) -> list[str]:
    """The off-grid shapes' table (``kernels.bench --shapes offgrid``): one line per shape,
    pass and dtype, the fixed list first, then the seeded sample."""
    peers, na, ours_na, ours = _gather(rows, _offkey)
    notes = {_offkey(r): r.get("note") or "" for r in rows}
    keys = sorted({k for k, _ in peers} | {k for k, _ in na} | ours_na | set(ours),
                  key=lambda k: (k[0] != "offgrid", k[1] != "fwd", _order(k[2]), k[3:]))
    lines = ["Off the grid (the fixed shapes, then the seeded sample): TFLOP/s, FLOPs counting the visible "
             "(query, key) pairs (the causal triangle as half a square).",
             "",
             "| shape | pass | dtype | B | H:Hkv | Nq | Nk | d | causal | naive | SDPA flash | SDPA cuDNN "
             "| SDPA mem-eff | ours | variant | × naive | × flash | × cuDNN |",
             "| --- " * 19 + "|"]
    for k in keys:
        set_, p, dt, d, causal, n, nk, b, h, hkv = k
        cells = [notes.get(k) or set_, p, dt, str(b), f"{h}:{hkv}", f"{n:,}", f"{nk:,}", str(d),
                 "yes" if causal else "no"] + _cells(k, peers, na, ours, ours_na, spread)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def meta_of(path: str | Path) -> dict | None:
    """The provenance beside a record (``NAME.meta.json`` next to ``NAME.csv``), or None."""
    path = Path(path)
    meta_path = path.with_name(path.stem + ".meta.json")
    return json.loads(meta_path.read_text()) if meta_path.is_file() else None


def render_file(path: str | Path, *more: str | Path) -> str:
    """The tables of one record, or of several (the provenance line is the first's)."""
    return render([r for p in (path, *more) for r in load(p)], meta_of(path))


def replace_block(text: str, table: str, start: str = START, end: str = END) -> str:
    """``text`` with what stands between the markers ``start`` and ``end`` replaced by ``table``."""
    if start not in text or end not in text:
        raise ValueError(f"readme: markers {start} ... {end} not found")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}{end}{tail}"


def rewrite_block(path: str | Path, table: str, start: str = START, end: str = END) -> None:
    """Replace the block between ``start`` and ``end`` in the file ``path`` with ``table``: read,
    replaced (ValueError, naming the file, where it cannot be read or lacks the markers) and
    written to a temporary name beside it, then renamed over it."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"readme={str(path)!r}: {getattr(e, 'strerror', None) or e}") from None
    try:
        new = replace_block(text, table, start, end)
    except ValueError as e:
        raise ValueError(f"readme={str(path)!r}: {str(e).removeprefix('readme: ')}") from None
    atomic_write(path, lambda f: f.write(new))


def merge(out: str | Path, parts: list[str | Path], force: bool = False) -> None:
    """Write the rows of ``parts`` into ``out`` (and its ``.meta.json``, each part's provenance
    listed with the configurations it supplies, a merged part's own parts in its place, a part
    that supplies none left out); an existing ``out`` is refused (ValueError) unless ``force``.  A
    configuration that a later part holds takes all its rows from that part (its ratios are
    same-run ones: the rows of one configuration never mix runs).  Both files are written to
    temporary names and renamed."""
    out = Path(out)
    meta_out = out.with_name(out.stem + ".meta.json")
    if not force and (out.exists() or meta_out.exists()):
        raise ValueError(f"out={str(out)!r} exists (give --force to overwrite it)")
    rows, metas = [], []
    for p in parts:
        p = Path(p)
        new = load(p)
        again = {r.get("config") for r in new} - {None, ""}
        rows = [r for r in rows if r.get("config") not in again] + new
        for m in metas:  # what a later part re-ran is no longer this part's
            m["configs"] -= again
        mp = p.with_name(p.stem + ".meta.json")
        meta = json.loads(mp.read_text()) if mp.is_file() else {}
        if meta.get("parts"):  # a merged record (OUT, extended in place): its own parts
            if not isinstance(meta["parts"], list) or not all(isinstance(q, dict) for q in meta["parts"]):
                raise ValueError(f"{str(mp)!r}: 'parts' must be a list of objects")
            for q in meta["parts"]:
                had = set(q.get("configs") or ()) or set(again)
                metas.append({**meta, "date": None, "git_commit": None, **q, "configs": had & again, "had": had})
        else:
            metas.append(dict(meta, part=p.name, configs=set(again), had=set(again)))
    # a part whose every configuration a later part re-ran supplies no row: it leaves the list
    metas = [m for m in metas if m["configs"] or not m["had"]]
    first = {k: v for k, v in metas[0].items() if k not in ("part", "parts", "date", "git_commit", "configs", "had")}
    write(out, rows, dict(first, parts=[dict({k: m.get(k) for k in ("part", "date", "git_commit")},
                                             configs=sorted(m["configs"])) for m in metas]))


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="*", help="kernels.bench CSVs (the first's provenance is shown)")
    ap.add_argument("--readme", default=None, help="rewrite the table block of this file")
    ap.add_argument("--merge", nargs="+", default=None, metavar=("OUT", "PART"), help="merge PART CSVs into OUT")
    ap.add_argument("--force", action="store_true", help="with --merge: overwrite an existing OUT")
    ap.add_argument("--block", default=None, help="with --readme: the named table block (perf-table-NAME)")
    a = ap.parse_args(argv)
    if a.merge:
        if len(a.merge) < 2:
            ap.error("--merge needs OUT and at least one PART")
        try:
            merge(a.merge[0], a.merge[1:], force=a.force)
        except ValueError as e:
            print(f"flashsim: error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {a.merge[0]}")
        return 0
    if not a.csv:
        ap.error("give a CSV (or --merge)")
    try:
        table = render_file(*a.csv)
        start, end = markers(a.block)
        if a.readme:
            rewrite_block(a.readme, table, start, end)
    except ValueError as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    if a.readme:
        print(f"rewrote the table block {a.block or 'perf-table'} in {a.readme}")
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
