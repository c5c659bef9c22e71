"""The decode bench's record as the README's table (issue 19's targets, from the committed CSV).

    python -m analysis.decode_table kernels/data/bench_decode_h100.csv --readme README.md

prints (or, with ``--readme``, writes between the markers ``<!-- decode-table:start -->`` and
``<!-- decode-table:end -->``) one row per configuration of the bench's ``main`` group: the
copy's GB/s, ours (``ours_fast``, the fast kernel as the launcher runs it) in GB/s and as a
fraction of the copy, each SDPA backend's GB/s, ours over the fastest backend, and the best of
all ``ours*`` variants timed; then ours against the issue's targets (≥ 0.8× the copy, ≥ 1.0× the
fastest SDPA backend) and one line each for the split sweep (the timed best, the
launcher's default, the simulator's proposal, flash-attention's heuristic) and the page sizes.
Every number is the CSV's (medians of its trials) or, for flash-attention's heuristic,
``flashsim.decode_splits.propose``'s; :mod:`analysis.nb_claims` reads the CSV for notebook 08
the same way.  Variants are read by name, so a re-run with other variants renders too.  A file
that is missing, empty or not such a record, and a ``--readme`` without the markers, end in one
``flashsim: error:`` line (exit status 2); ``--readme`` writes the file to a temporary name
beside it and renames it over the old one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flashsim.cmdline import ToolParser
from kernels import bench_table
from kernels.bench_table import meta_of

from .nb_claims import DECODE_KEYS, DECODE_OURS, decode_bench, decode_main_claims, decode_pages, decode_split_sweeps
from .notebook_data import _typed

START, END = "<!-- decode-table:start -->", "<!-- decode-table:end -->"
SDPA = (("sdpa_flash", "SDPA flash"), ("sdpa_cudnn", "SDPA cuDNN"), ("sdpa_mem_eff", "SDPA mem-eff"),
        ("sdpa_math", "SDPA math"))


#: The columns the table reads (a kernels.bench_decode CSV has them all).
COLUMNS = (*DECODE_KEYS, "variant", "ms", "ms_min", "ms_max", "gbps", "error")


def _bad(path: str | Path, what: str) -> ValueError:
    return ValueError(f"csv={str(path)!r}: {what}")


def load(path: str | Path) -> list[dict]:
    """The rows of a kernels.bench_decode CSV, typed; ValueError naming the file where it is
    missing, empty, lacks a column the table reads, or has no rows."""
    import csv

    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = [{k: _typed(v) for k, v in row.items()} for row in reader]
            fields = reader.fieldnames
    except OSError as e:
        raise _bad(path, e.strerror or str(e)) from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise _bad(path, f"not a readable CSV ({e})") from None
    if not fields:
        raise _bad(path, "the file is empty: not a kernels.bench_decode record")
    missing = [c for c in COLUMNS if c not in fields]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise _bad(path, f"column {missing[0]!r} missing{more}: not a kernels.bench_decode record")
    if not rows:
        raise _bad(path, "the header only: no rows")
    return rows


def _gb(v: dict | None) -> str:
    return "-" if v is None or v["error"] is not None else f"{v['gbps']:,.0f}"


def _x(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"


def _reason(error: str) -> str:
    """An error as the CSV records it, short: "RuntimeError('No available kernel. ...')" ->
    "RuntimeError: No available kernel"."""
    if "(" not in error:
        return error.strip()
    kind, rest = error.split("(", 1)
    return f"{kind.strip()}: {rest.strip(chr(39) + chr(34) + ')').split('.')[0].strip()}"


def render(rows: list[dict], meta: dict | None = None) -> str:
    meta = meta or {}
    main = decode_bench(rows, "main")

    def values(key):
        return "/".join(str(v) for v in sorted({c["config"][key] for c in main}, key=str))

    out = [f"GB/s of one decode step (K and V read once, Q read, O written, over the median of the trials) on "
           f"an {meta.get('gpu', 'unknown GPU')} (commit {meta.get('git_commit', '?')}, "
           f"torch {meta.get('torch', '?')}, numba-cuda {meta.get('numba_cuda', '?')}), {values('dtype')}, "
           f"d = {values('d')}, Hkv = {values('kv_heads')}, Nq = {values('nq')}; ours = `{DECODE_OURS}`; "
           f"ratios from the same run.", "",
           "| Hq | Nk | B | copy | ours | × copy | " + " | ".join(n for _, n in SDPA)
           + " | × best SDPA | best of ours (× copy) |",
           "| --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in SDPA) + " | --- | --- |"]
    failed: dict[tuple, list[str]] = {}
    for c in main:
        cf, vs = c["config"], c["variants"]
        ours = vs.get(DECODE_OURS)
        timed = {n: v for n, v in vs.items() if n.startswith("ours") and v["error"] is None}
        best = max(timed, key=lambda n: timed[n]["x_copy"]) if timed else None
        copy = c.get("copy", {}).get("gbps")
        out.append(f"| {cf['heads']} | {cf['nk']:,} | {cf['batch']} | {'-' if copy is None else f'{copy:,.0f}'} | "
                   f"{_gb(ours)} | {_x(ours['x_copy']) if ours else '-'} | "
                   + " | ".join(_gb(vs.get(n)) for n, _ in SDPA)
                   + f" | {_x(ours['x_sdpa_best']) if ours else '-'} | "
                   + (f"`{best}` ({timed[best]['x_copy']:.2f})" if best else "-") + " |")
        for n, v in vs.items():
            if v["error"] is not None:
                failed.setdefault((n, _reason(v["error"])), []).append(f"{cf['heads']}/{cf['nk']:,}")
    out.append("")
    if failed:
        out.append("Not timed (\"-\"), as Hq/Nk: " + "; ".join(f"`{n}` at {', '.join(where)} ({why})"
                                                          for (n, why), where in failed.items()) + ".")
        out.append("")
    mc = decode_main_claims(main)
    out.append(f"Against the issue's targets: `{DECODE_OURS}` reaches {mc['x_copy_min']:.2f}-{mc['x_copy_max']:.2f}× "
               f"the copy's bandwidth (target ≥ 0.8×: met in {mc['meet_copy']} of {mc['timed']} configurations timed) "
               f"and {mc['x_sdpa_min']:.2f}-{mc['x_sdpa_max']:.2f}× SDPA's fastest backend "
               f"({', '.join(f'`{n}`' for n in mc['sdpa_best_names'])}; target ≥ 1.0×: met in {mc['meet_sdpa']}); "
               f"SDPA's fastest runs at {mc['sdpa_best_x_copy_min']:.2f}-{mc['sdpa_best_x_copy_max']:.2f}× the copy; "
               f"the best of all `ours*` variants per configuration at {mc['best_ours_x_copy_min']:.2f}-"
               f"{mc['best_ours_x_copy_max']:.2f}×."
               + (" In this record ours misses both targets in every configuration."
                  if mc["meet_copy"] == mc["meet_sdpa"] == 0 else ""))
    out.append("")
    for s in decode_split_sweeps(rows):
        cf = s["config"]
        head = f"Splits at Hq = {cf['heads']}, Nk = {cf['nk']:,}, B = {cf['batch']}"
        if not s["ms"]:
            out.append(f"{head}: not timed ({len(s['failed'])} split counts failed).")
            continue
        out.append(f"{head} (`{DECODE_OURS}`, S = {', '.join(map(str, s['splits']))}): timed best S = {s['best']} "
                   f"({s['best_ms']:.3f} ms); the launcher's default S = {s['default']}; the simulator's proposal "
                   f"S = {s['model']} (nearest timed S = {s['model_nearest']}: {s['model_nearest_x_best']:.2f}× the "
                   f"best); flash-attention's heuristic S = {s['fa2']} (nearest timed S = {s['fa2_nearest']}: "
                   f"{s['fa2_nearest_x_best']:.2f}× the best).")
    pg = decode_pages(rows)
    cf = pg["config"]
    parts = [f"`{n}` {v['slowdown_min']:.2f}-{v['slowdown_max']:.2f}×" for n, v in pg["variants"].items()]
    out.append(f"Pages of {', '.join(str(p) for p in pg['pages'] if p)} rows at Nk = {cf['nk']:,}, B = {cf['batch']}, "
               f"Hq = {cf['heads']}, paged over contiguous time: {'; '.join(parts)}.")
    return "\n".join(out) + "\n"


def render_file(path: str | Path) -> str:
    """The table of one record; ValueError naming the file for anything it cannot render (no
    timed configuration of ours in the main group, no contiguous row in the pages group, a
    number that does not parse, a provenance that is not JSON)."""
    rows = load(path)
    try:
        meta = meta_of(path)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise _bad(path, f"its provenance is not readable JSON ({e})") from None
    try:
        main = decode_bench(rows, "main")
    except (ValueError, KeyError, TypeError) as e:
        raise _bad(path, f"group 'main' cannot be read ({type(e).__name__}: {e})") from None
    if not any(c["variants"].get(DECODE_OURS, {}).get("error", "") is None for c in main):
        raise _bad(path, f"no configuration of group 'main' where {DECODE_OURS} was timed: no table to render")
    if not any(r["group"] == "pages" and r["page_size"] == 0 for r in rows):
        raise _bad(path, "group 'pages' has no contiguous row (page_size 0): no page line to render")
    try:
        return render(rows, meta if isinstance(meta, dict) else None)
    except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError) as e:
        raise _bad(path, f"not a kernels.bench_decode record the table can render ({type(e).__name__}: {e})") from None


def replace_block(text: str, table: str) -> str:
    """``text`` with the decode table's block (between START and END) replaced by ``table``."""
    return bench_table.replace_block(text, table, START, END)


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="a kernels.bench_decode CSV")
    ap.add_argument("--readme", default=None, help="rewrite the table block of this file")
    a = ap.parse_args(argv)
    try:
        table = render_file(a.csv)
        if a.readme:
            bench_table.rewrite_block(a.readme, table, START, END)
    except ValueError as e:
        print(f"flashsim: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if a.readme:
        print(f"rewrote the decode table in {a.readme}")
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
