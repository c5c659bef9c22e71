"""The README's performance table, generated from the benchmark's CSV.

    python -m kernels.bench_table kernels/data/bench_h100.csv            # print the table
    python -m kernels.bench_table kernels/data/bench_h100.csv --readme README.md
    python -m kernels.bench_table --merge OUT.csv PART.csv [PART.csv ...]

The table has one line per configuration (pass, dtype, d, causal, N): the TFLOP/s of torch's
naive attention, of SDPA's flash and cuDNN backends, and of our fastest variant, with our
ratios to each, all from the same run of ``kernels.bench`` (the ratios are the CSV's own
``x_*`` columns, so no number here is recomputed from another run).  ``--readme`` replaces the
block between the markers ``<!-- perf-table:start -->`` and ``<!-- perf-table:end -->``; the
tests hold the README's block equal to the committed CSV's table.

``--merge`` joins CSVs written by separate ``kernels.bench`` runs (e.g. ``--only fwd-`` and
``--only bwd-``, to stay within a device call's time limit) into one, with a ``.meta.json``
listing each part's provenance; each configuration's rows come from one run, so its ratios
were still measured side by side.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
PEERS = ("naive", "sdpa_flash", "sdpa_cudnn")
SHOWN = PEERS + ("sdpa_mem_eff",)  # mem-eff: the one SDPA backend that takes fp32


def _num(x: str | None) -> float:
    try:
        return float(x) if x not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _fmt(x: float, digits: int) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def load(path: str | Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def ours_rows(rows: list[dict]) -> dict[tuple, dict]:
    """Per configuration key, the row of our fastest variant that ran (``ours_*``, no error)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if not r["variant"].startswith("ours_") or r.get("error") or math.isnan(_num(r.get("tflops"))):
            continue
        key = (r["pass"], r["dtype"], int(r["d"]), r["causal"] == "True", int(r["n"]))
        if key not in best or _num(r["tflops"]) > _num(best[key]["tflops"]):
            best[key] = r
    return best


def render(rows: list[dict], meta: dict | None = None) -> str:
    peers = {}
    for r in rows:
        if r["variant"] in SHOWN and not r.get("error"):
            key = (r["pass"], r["dtype"], int(r["d"]), r["causal"] == "True", int(r["n"]))
            peers[(key, r["variant"])] = _num(r["tflops"])
    ours = ours_rows(rows)
    keys = sorted({k for k, _ in peers} | set(ours),
                  key=lambda k: (k[0] != "fwd", k[1] != "fp16", k[2], k[3], k[4]))
    lines = []
    if meta:
        lines.append(f"TFLOP/s on an {meta.get('gpu')} (driver {meta.get('driver')}, torch {meta.get('torch')}, "
                     f"numba-cuda {meta.get('numba_cuda')}), B·H = 16·(16,384/N) for N < 16,384 else 16; "
                     "FLOPs 4·B·H·N²·d forward, 2.5x that backward, halved for causal.  "
                     "Ratios are ours over the peer, timed in the same run.")
        lines.append("")
    lines.append("| pass | dtype | d | causal | N | naive | SDPA flash | SDPA cuDNN | SDPA mem-eff | ours | variant "
                 "| × naive | × flash | × cuDNN |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in keys:
        p, dt, d, causal, n = k
        o = ours.get(k)
        cells = [p, dt, str(d), "yes" if causal else "no", f"{n:,}"]
        cells += [_fmt(peers.get((k, v), math.nan), 0) for v in SHOWN]
        if o is None:
            cells += ["-", "-", "-", "-", "-"]
        else:
            cells += [_fmt(_num(o["tflops"]), 0), f"`{o['variant'][len('ours_'):]}`"]
            cells += [_fmt(_num(o.get(f"x_{v}")), 2) for v in PEERS]
        lines.append("| " + " | ".join(cells) + " |")
    failed = sorted({(r["variant"], r.get("error")) + _key(r) for r in rows if r.get("error")},
                    key=lambda x: (x[2] != "fwd", x[3] != "fp16", x[4:], x[0]))
    if failed:
        lines.append("")
        lines.append("Not timed (\"-\" above): " + "; ".join(
            f"{v} {p} {dt} d = {d}{' causal' if c else ''} N = {n:,} ({e})" for v, e, p, dt, d, c, n in failed) + ".")
    return "\n".join(lines) + "\n"


def _key(r: dict) -> tuple:
    return (r["pass"], r["dtype"], int(r["d"]), r["causal"] == "True", int(r["n"]))


def meta_of(path: str | Path) -> dict | None:
    """The provenance beside a record (``NAME.meta.json`` next to ``NAME.csv``), or None."""
    path = Path(path)
    meta_path = path.with_name(path.stem + ".meta.json")
    return json.loads(meta_path.read_text()) if meta_path.is_file() else None


def render_file(path: str | Path) -> str:
    return render(load(path), meta_of(path))


def replace_block(text: str, table: str, start: str = START, end: str = END) -> str:
    """``text`` with what stands between the markers ``start`` and ``end`` replaced by ``table``."""
    if start not in text or end not in text:
        raise ValueError(f"readme: markers {start} ... {end} not found")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}{end}{tail}"


def merge(out: str | Path, parts: list[str | Path]) -> None:
    rows, metas = [], []
    for p in parts:
        p = Path(p)
        rows += load(p)
        m = p.with_name(p.stem + ".meta.json")
        metas.append(dict(json.loads(m.read_text()), part=p.name) if m.is_file() else {"part": p.name})
    fields = sorted({k for r in rows for k in r})
    out = Path(out)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    first = {k: v for k, v in metas[0].items() if k not in ("part", "date", "git_commit")}
    meta = dict(first, parts=[{k: m.get(k) for k in ("part", "date", "git_commit")} for m in metas])
    out.with_name(out.stem + ".meta.json").write_text(json.dumps(meta, indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", help="a kernels.bench CSV")
    ap.add_argument("--readme", default=None, help="rewrite the table block of this file")
    ap.add_argument("--merge", nargs="+", default=None, metavar=("OUT", "PART"), help="merge PART CSVs into OUT")
    a = ap.parse_args(argv)
    if a.merge:
        if len(a.merge) < 2:
            ap.error("--merge needs OUT and at least one PART")
        merge(a.merge[0], a.merge[1:])
        print(f"wrote {a.merge[0]}")
        return 0
    if not a.csv:
        ap.error("give a CSV (or --merge)")
    table = render_file(a.csv)
    if a.readme:
        p = Path(a.readme)
        p.write_text(replace_block(p.read_text(), table))
        print(f"rewrote the table in {p}")
    else:
        sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
