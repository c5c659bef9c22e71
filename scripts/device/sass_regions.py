"""usage: python scripts/device/sass_regions.py SOURCE.csv[.gz] [--top 12] [--out CSV [--force]]

Where a kernel's warps spend their time, by region of its SASS: prologue (before the main loop),
main loop, epilogue.  Reads Nsight Compute's source page of one profiled launch, as written by

    ncu --section SourceCounters --page source --print-source sass --csv ... > SOURCE.csv

(``profile_one.py`` launches one call of a variant).  The main loop is the span of the backward
branch that jumps the farthest (the kernel's outermost loop); every instruction before its target
is the prologue, every one after the branch the epilogue.  Prints per region the share of the
warp-state samples (all samples: a resident warp's time, issued or not), of the instructions
executed and of the long-scoreboard samples, then the ``--top`` instructions by samples outside
the loop with their main stall reason.  ``--out`` writes the per-region figures as CSV (written to
a temporary name, then renamed; an existing file only with ``--force``).  A missing or unreadable
table, a negative ``--top`` or an existing ``--out`` is one ``sass_regions: error:`` line and
exit 2.
"""

import argparse
import csv
import gzip
import os
import re
import sys

STALLS = "stall_"


class Bad(Exception):
    """A source page this script cannot read: one ``sass_regions: error:`` line, exit 2."""


def read_source(path: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the source table in ncu's output (the lines before it are ncu's own)."""
    try:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise Bad(f"{path}: {e}") from None
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    except StopIteration:
        raise Bad(f"{path}: no source table (a line starting with \"Address\")") from None
    rows = list(csv.reader(lines[start:]))
    return rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]


def loop_span(addr: list[int], src: list[str]) -> tuple[int, int]:
    """(first, last) row index of the outermost loop: the backward branch with the longest jump."""
    best = None
    for i, s in enumerate(src):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", s)
        if m:
            target = int(m.group(1), 16)
            if target < addr[i] and (best is None or addr[i] - target > best[0]):
                best = (addr[i] - target, target, i)
    if best is None:
        raise Bad("no backward branch: the kernel has no loop")
    _, target, last = best
    first = next(i for i, a in enumerate(addr) if a >= target)
    return first, last


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", default=None)
    ap.add_argument("--force", action="store_true", help="overwrite an existing --out")
    a = ap.parse_args(argv)
    try:
        if a.top < 0:
            raise Bad(f"top={a.top}: must be >= 0")
        if a.out and os.path.exists(a.out) and not a.force:
            raise Bad(f"out={a.out!r} exists (give --force to overwrite it)")
        return regions(a)
    except Bad as e:
        print(f"sass_regions: error: {e}", file=sys.stderr)
        return 2


def regions(a) -> int:
    """The per-region figures of ``a.source`` printed (and written to ``a.out``)."""
    hdr, rows = read_source(a.source)
    col = {h: i for i, h in enumerate(hdr)}
    need = ("Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb")
    missing = [h for h in need if h not in col]
    if missing:
        raise Bad(f"{a.source}: no column {missing[0]!r} (profile with SourceCounters)")
    addr = [int(r[col["Address"]], 16) for r in rows]
    src = [r[col["Source"]].strip() for r in rows]
    num = lambda r, h: float(r[col[h]] or 0)  # noqa: E731
    first, last = loop_span(addr, src)
    region = ["prologue" if i < first else "loop" if i <= last else "epilogue" for i in range(len(rows))]
    keys = ("Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb")
    tot = {k: sum(num(r, k) for r in rows) or 1.0 for k in keys}
    out = []
    for reg in ("prologue", "loop", "epilogue"):
        sel = [r for r, g in zip(rows, region) if g == reg]
        share = {k: sum(num(r, k) for r in sel) / tot[k] for k in keys}
        out.append(dict(region=reg, sass_instructions=len(sel), samples_share=share[keys[0]],
                        executed_share=share[keys[1]], long_sb_share=share[keys[2]]))
        print(f"{reg:9s} {len(sel):5d} SASS lines: samples {100 * share[keys[0]]:5.2f}%  instructions executed "
              f"{100 * share[keys[1]]:5.2f}%  long-scoreboard samples {100 * share[keys[2]]:5.2f}%")
    stalls = [h for h in hdr if h.startswith(STALLS) and "Not Issued" not in h]
    outside = sorted((i for i in range(len(rows)) if region[i] != "loop"), key=lambda i: -num(rows[i], keys[0]))
    for i in sorted(outside[:a.top]):
        main_stall = max(stalls, key=lambda h: num(rows[i], h))
        print(f"  {region[i]:8s} +0x{addr[i] - addr[0]:05x} {100 * num(rows[i], keys[0]) / tot[keys[0]]:5.2f}%  "
              f"{main_stall[len(STALLS):]:12s} {src[i][:70]}")
    if a.out:
        with open(a.out + ".tmp", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0]))
            w.writeheader()
            w.writerows(out)
        os.replace(a.out + ".tmp", a.out)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
