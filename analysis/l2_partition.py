"""Which half of the L2 each SM is near, and which half each line lives in: the record of
``scripts/device/l2_partition_probe.cu`` (per block, the cycles of an L2 hit on each of two line
sets, three passes; one SM probing at a time).

    python -m analysis.l2_partition analysis/data/l2calib/h200_l2_partition/*.bin.gz
    python -m analysis.l2_partition --reread RERUN.csv.gz      # scripts/device/l2_reread_probe.cu's

The second form reads the re-read probe's CSV (one SM reads W MiB, then times every 16th line
twice: its first load, a hit or a miss, then hits) and prints, per W, how many of the lines on
each side (near or far from that SM, by their hit latency) the re-read lost: :func:`reread_table`,
beside what flashsim.l2's cache of a preset (``--gpu``, default h200) loses in the same probe
replayed: :func:`model_reread`, and what the same cache would lose with a random set for each
line: :func:`random_sets_loss`.

The latencies of a pass form a (blocks x lines) matrix.  With two partitions it is, up to noise,
the sum of a block's and a line's mean plus a near/far term of rank one: + delta where the block's
SM and the line are on different sides, - delta where on the same.  :func:`split` takes that term
as the first singular vectors of the matrix with the row and column means removed, and the sides
as their signs; :func:`summary` gives the sides' sizes, the mean cycles near and far, how far the
two classes overlap, whether the line sides are an XOR of address bits (:func:`xor_of_bits`), and
whether a second or third pass is faster on far lines than the first (a near copy made by a
read from the far side), and the share of each set's lines nearer the side of the block that
loaded them (about half where the address decides; all of them if lines stay near the SM that
wrote them: the probe's "write" mode, version 2 records).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from flashsim.cmdline import ToolParser

MAGIC = b"L2PP"
#: The committed H200 partition record whose SM sides a "written" re-read record is read against
SIDES_RECORD = Path(__file__).resolve().parents[1] / "analysis/data/l2calib/h200_l2_partition/l2pp_1.bin.gz"
PASSES = 3
SETS = 2


def read(path) -> dict:
    """The probe's binary record (gzip-compressed where the name ends in .gz): ``smid`` (blocks),
    ``rank`` (the order of the blocks' turns: rank 0 loaded every line first), ``cycles`` (blocks
    x sets x passes x lines, float), ``lines``, ``stride`` (bytes between set 1's lines; set 0's
    are 128 bytes apart), ``sms``, ``clock_khz``, ``write1`` (version 2: set 1 was written, not
    read, by rank 0) and ``set1_offset`` (bytes).  ValueError if it is not one."""
    p = Path(path)
    raw = (gzip.open if p.name.endswith(".gz") else open)(p, "rb").read()
    if raw[:4] != MAGIC or len(raw) < 8:
        raise ValueError(f"path={str(p)!r}: not an l2_partition_probe record (magic {raw[:4]!r})")
    version = int(np.frombuffer(raw[4:8], "<u4")[0])
    if version not in (1, 2):
        raise ValueError(f"path={str(p)!r}: version={version}, this reader takes 1 and 2")
    head = 28 if version == 1 else 36
    if len(raw) < head:
        raise ValueError(f"path={str(p)!r}: {len(raw)} bytes, shorter than a version {version} header")
    fields = [int(x) for x in np.frombuffer(raw[8:head], "<u4")]
    blocks, lines, stride, sms, khz = fields[:5]
    write1, offset = fields[5:] if version == 2 else (0, 0)
    per = 8 + 2 * SETS * PASSES * lines
    if len(raw) != head + blocks * per:
        raise ValueError(f"path={str(p)!r}: {len(raw)} bytes, {head + blocks * per} expected for {blocks} blocks "
                         f"of {lines} lines")
    rec = np.frombuffer(raw[head:], np.uint8).reshape(blocks, per)
    smid = rec[:, :4].copy().view("<u4")[:, 0].astype(int)
    cycles = rec[:, 8:].copy().view("<u2").reshape(blocks, SETS, PASSES, lines).astype(float)
    rank = rec[:, 4:8].copy().view("<u4")[:, 0].astype(int)
    return dict(smid=smid, rank=rank, cycles=cycles, lines=lines, stride=stride, sms=sms, clock_khz=khz,
                write1=bool(write1), set1_offset=offset, version=version)


def write(path, smid, cycles, stride: int, sms: int, clock_khz: int = 0, write1: bool | None = None,
          set1_offset: int = 0) -> None:
    """A record in the probe's format (for tests: ``cycles`` blocks x sets x passes x lines, block
    b of rank b); version 1 unless ``write1`` is given."""
    cycles = np.asarray(cycles)
    blocks, _, _, lines = cycles.shape
    head = [1, blocks, lines, stride, sms, clock_khz] if write1 is None else \
        [2, blocks, lines, stride, sms, clock_khz, int(write1), set1_offset]
    out = [MAGIC, np.array(head, "<u4").tobytes()]
    for b in range(blocks):
        out.append(np.array([smid[b], b], "<u4").tobytes())
        out.append(np.minimum(cycles[b], 65535).astype("<u2").tobytes())
    data = b"".join(out)
    p = Path(path)
    (gzip.open if p.name.endswith(".gz") else open)(p, "wb").write(data)


def split(m: np.ndarray, smid=None) -> tuple[np.ndarray, np.ndarray, float]:
    """(block sides, line sides, share of the centred matrix's energy in the first singular
    value) of a blocks x lines latency matrix: booleans, a line near the blocks of its own side
    (the centred term is s·u·v, positive, i.e. slower, where u and v have one sign: those cells
    are far).  Oriented so that the block of the smallest ``smid`` (default: block 0) is on side
    False."""
    c = m - m.mean(0) - m.mean(1)[:, None] + m.mean()
    u, s, vt = np.linalg.svd(c, full_matrices=False)
    bs, ls = u[:, 0] > 0, ~(vt[0] > 0)
    first = 0 if smid is None else int(np.argmin(smid))
    if bs[first]:
        bs, ls = ~bs, ~ls
    return bs, ls, float(s[0] ** 2 / max((s ** 2).sum(), 1e-300))


def xor_of_bits(addr: np.ndarray, side: np.ndarray, lo: int = 7, hi: int = 40):
    """The address bits lo..hi-1 whose XOR (with a constant) gives ``side`` at every address, or
    None when no such set exists (Gaussian elimination over GF(2))."""
    bits = [(addr >> k) & 1 for k in range(lo, hi)]
    a = np.array(bits + [np.ones_like(addr)], np.uint8).T
    b = side.astype(np.uint8)
    r, piv = 0, []
    for col in range(a.shape[1]):
        rows = np.nonzero(a[r:, col])[0]
        if not len(rows):
            continue
        p = r + rows[0]
        a[[r, p]], b[[r, p]] = a[[p, r]], b[[p, r]]
        hit = np.nonzero(a[:, col])[0]
        hit = hit[hit != r]
        a[hit] ^= a[r]
        b[hit] ^= b[r]
        piv.append(col)
        r += 1
        if r == a.shape[0]:
            break
    if b[r:].any():
        return None
    x = np.zeros(a.shape[1], np.uint8)
    for i, col in enumerate(piv):
        x[col] = b[i]
    return [lo + k for k in range(hi - lo) if x[k]]


def summary(rec: dict, pass_: int = 1) -> dict:
    """Per line set: the sides (from pass ``pass_``), their sizes, mean cycles near and far, the
    near class's 99th and the far class's 1st percentile, the smallest gap between a line's mean
    cycles from the two sides' blocks (``line_gap_min``), the XOR rule if any, and the far lines'
    mean cycles in each pass, the share of lines nearer the side of the block that loaded them
    (``near_loader``); and the SMs' sides (by smid; None where blocks of one SM disagree)."""
    cyc, smid = rec["cycles"], rec["smid"]
    out = {"sets": [], "sm_side": None, "write1": rec["write1"]}
    splits = [split(cyc[:, s, pass_], smid) for s in range(SETS)]
    # the blocks' sides from set 0 (read, so that its lines split by address); set 1's own split
    # finds no line-by-SM term if every line is near the block that wrote it
    sides0 = splits[0][0]
    loader = bool(sides0[int(np.argmin(rec["rank"]))])
    for s, (bs, ls, energy) in enumerate(splits):
        m = cyc[:, s, pass_]
        far = bs[:, None] != ls[None, :]
        spacing = 128 if s == 0 else rec["stride"]
        addr = (0 if s == 0 else rec["set1_offset"]) + np.arange(rec["lines"], dtype=np.int64) * spacing
        nearer_true = m[sides0].mean(0) < m[~sides0].mean(0)  # lower mean cycles from side True
        out["sets"].append(dict(
            set=s, spacing=spacing, lines_false=int((~ls).sum()), lines_true=int(ls.sum()),
            blocks_false=int((~bs).sum()), blocks_true=int(bs.sum()), energy=energy,
            near=float(m[~far].mean()), far=float(m[far].mean()),
            line_gap_min=float(np.abs(m[bs].mean(0) - m[~bs].mean(0)).min()),
            near_p99=float(np.percentile(m[~far], 99)), far_p1=float(np.percentile(m[far], 1)),
            xor=xor_of_bits(addr, ls), far_by_pass=[float(cyc[:, s, p][far].mean()) for p in range(PASSES)],
            near_by_pass=[float(cyc[:, s, p][~far].mean()) for p in range(PASSES)],
            near_loader=float((nearer_true == loader).mean())))
    sides = {}
    for b, sm in enumerate(smid):
        sides.setdefault(int(sm), set()).add(bool(sides0[b]))
    out["sm_side"] = {sm: (v.pop() if len(v) == 1 else None) for sm, v in sorted(sides.items())}
    return out


def format_summary(path, rec: dict, s: dict) -> str:
    lines = [f"{path}: {len(rec['smid'])} blocks on {len(s['sm_side'])} of {rec['sms']} SMs, "
             f"{rec['lines']} lines a set"]
    for t in s["sets"]:
        rule = ("not an XOR of address bits 7-39" if t["xor"] is None
                else f"XOR of address bits {t['xor']}")
        lines.append(
            f"  set {t['set']} (lines {t['spacing']} B apart): lines {t['lines_false']} / {t['lines_true']}, "
            f"blocks {t['blocks_false']} / {t['blocks_true']}; near {t['near']:.1f} cycles, far {t['far']:.1f} "
            f"(near 99th pct {t['near_p99']:.0f}, far 1st pct {t['far_p1']:.0f}; a line's two sides at least "
            f"{t['line_gap_min']:.1f} apart; rank-1 share "
            f"{t['energy']:.2f}); line side {rule}; far by pass "
            + ", ".join(f"{x:.1f}" for x in t["far_by_pass"])
            + f"; {'written' if t['set'] == 1 and s['write1'] else 'read'} by the first block, "
            f"{t['near_loader']:.2f} of its lines nearer that block's side")
    sides = s["sm_side"]
    lines.append("  SM sides by smid: " + "".join("?" if v is None else str(int(v)) for v in sides.values()))
    return "\n".join(lines)


def two_means(x: np.ndarray, iters: int = 50) -> float:
    """The threshold between the two groups of 1-D values ``x`` (Lloyd's 2-means from the 10th
    and 90th percentiles): the midpoint of the two means."""
    lo, hi = np.percentile(x, [10, 90])
    for _ in range(iters):
        cut = (lo + hi) / 2
        a, b = x[x <= cut], x[x > cut]
        if not len(a) or not len(b):
            break
        lo, hi = a.mean(), b.mean()
    return float((lo + hi) / 2)


def read_reread(path) -> list[dict]:
    """The re-read probe's rows (columns w_mib, smid, line, first, second, and writer in the
    "written" modes; gzip where the name ends in .gz) as ints; ValueError naming what is missing
    or not an integer."""
    import csv
    import io

    p = Path(path)
    try:
        text = (gzip.open(p, "rt") if p.name.endswith(".gz") else open(p)).read()
    except UnicodeDecodeError:
        raise ValueError(f"path={str(p)!r}: not a re-read probe record (not text: a partition record? "
                         "drop --reread)") from None
    rows = list(csv.DictReader(io.StringIO(text)))
    need = ("w_mib", "smid", "line", "first", "second")
    if not rows or any(k not in rows[0] for k in need):
        raise ValueError(f"path={str(p)!r}: not a re-read probe record (columns {', '.join(need)})")
    need = need + (("writer",) if "writer" in rows[0] else ())
    out = []
    for i, r in enumerate(rows):
        try:
            out.append({k: int(r[k]) for k in need})
        except (TypeError, ValueError):
            raise ValueError(f"path={str(p)!r}: row {i + 2}: {r} is not all integers") from None
    return out


# An L2 hit costs 200-300 cycles on Hopper (266 near, 296 far on the H200): a record whose loads
# took a few cycles timed nothing
MIN_HIT_CYCLES = 100
#: A line's first load is a miss where it took more than its hit latency plus this many cycles.
#: On the H200 (analysis/data/l2calib/h200_l2_reread) a DRAM read took 20 to 800 cycles more than
#: the line's hits (reread_cold: every timed line a DRAM read; 0.6% of them 40 or less), a hit at
#: most 5 more (reread_1/2 at W = 16 and 24 MiB, where nothing is lost) and the first read of a
#: line the grid had just written at most 36 more (reread_written): 40 parts them but for those
#: 0.6%.  The first reading of these records used 150, which took 43% of the DRAM reads for hits.
MISS_MARGIN = 40.0


def _timed(rows: list[dict], hops: int, miss_margin: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(hit latency, lost, near/far cut) of a re-read record's rows: a line's hit latency is its
    second total / ``hops``; its first load took first - (hops - 1) / hops x second cycles, a miss
    where that exceeds the hit latency by ``miss_margin`` (:data:`MISS_MARGIN`); the near side is
    the lower group of the hit latencies (:func:`two_means` over the whole record).  ValueError
    where the hits are too fast to have been timed."""
    hit = np.array([r["second"] / hops for r in rows], dtype=float)
    if len(hit) and np.median(hit) < MIN_HIT_CYCLES:
        raise ValueError(f"median hit latency {np.median(hit):.1f} cycles (< {MIN_HIT_CYCLES}): the timed loads "
                         "were not between the clock reads (the probe at 8ab49da, whose loads ptxas dropped)")
    first = np.array([r["first"] for r in rows], dtype=float) - (hops - 1) * hit
    return hit, first > hit + miss_margin, (two_means(hit) if len(hit) else float("nan"))


def reread_table(rows: list[dict], hops: int = 16, miss_margin: float = MISS_MARGIN) -> list[dict]:
    """Per (W, smid): the timed lines on each side (near: hit latency at most the cut) and the
    share the re-read lost, a line lost as :func:`_timed` says."""
    hit, lost, cut = _timed(rows, hops, miss_margin)
    groups: dict = {}
    for r, h, miss in zip(rows, hit, lost):
        g = groups.setdefault((r["w_mib"], r["smid"]), {"near": 0, "far": 0, "near_lost": 0, "far_lost": 0,
                                                         "near_hit": [], "far_hit": []})
        side = "near" if h <= cut else "far"
        g[side] += 1
        g[side + "_lost"] += bool(miss)
        g[side + "_hit"].append(h)
    return [dict(w_mib=w, smid=sm, near=g["near"], far=g["far"],
                 near_lost=g["near_lost"] / max(g["near"], 1), far_lost=g["far_lost"] / max(g["far"], 1),
                 near_cycles=float(np.mean(g["near_hit"])) if g["near_hit"] else float("nan"),
                 far_cycles=float(np.mean(g["far_hit"])) if g["far_hit"] else float("nan"), cut=cut)
            for (w, sm), g in sorted(groups.items())]


def reread_order(rows: list[dict], hops: int = 16, miss_margin: float = MISS_MARGIN) -> list[dict]:
    """Per W: which lines the first pass lost, across the probe's runs of that W (one per worker
    block, each on its own SM, over the same buffer: the rows of a W in file order, a run starting
    where ``line`` is 0 again).  ``lost``: the share of timed lines lost, over all runs; ``agree``:
    the share of lines that every run found in the same state (lost or kept); ``by_tenth``: the
    share lost in each tenth of the window, in address order; ``kept_mib``: (1 - lost) x W, the
    MiB the L2 still held (where the timed lines stand for the rest).  A line is lost as
    :func:`_timed` says."""
    _, lost_rows, _ = _timed(rows, hops, miss_margin)
    out = []
    for w in sorted({r["w_mib"] for r in rows}):
        runs: list[list[bool]] = []
        for r, miss in zip(rows, lost_rows):
            if r["w_mib"] != w:
                continue
            if r["line"] == 0 or not runs:
                runs.append([])
            runs[-1].append(bool(miss))
        n = min(len(x) for x in runs)
        m = np.array([x[:n] for x in runs], dtype=bool)
        lost = float(m.mean())
        out.append(dict(w_mib=w, runs=len(runs), lines=n, lost=lost,
                        agree=float((m.min(axis=0) == m.max(axis=0)).mean()),
                        by_tenth=[float(m[:, t].mean()) for t in np.array_split(np.arange(n), 10)],
                        kept_mib=(1 - lost) * w))
    return out


def written_sides(rows: list[dict], sm_side: dict, hops: int = 16, miss_margin: float = MISS_MARGIN) -> list[dict]:
    """For a "written" record (each row names the SM that wrote its line): per W, the lines by
    whether their writer's SM is on the reading SM's side (``sm_side``: smid -> side, as
    :func:`summary` gives it from a partition record of the same GPU) and whether the line is near
    the reader, with the share whose first read was a miss (:func:`_timed`)."""
    if not rows or "writer" not in rows[0]:
        raise ValueError("rows: not a 'written' record (no writer column)")
    known = {k for k, v in sm_side.items() if v is not None}
    missing = sorted({r[k] for r in rows for k in ("smid", "writer")} - known)
    if missing:
        raise ValueError(f"sm_side: no side for SMs {missing[:8]} (a partition record of another GPU?)")
    hit, lost_rows, cut = _timed(rows, hops, miss_margin)
    groups: dict = {}
    for r, h, miss in zip(rows, hit, lost_rows):
        key = (r["w_mib"], sm_side[r["writer"]] == sm_side[r["smid"]], bool(h <= cut))
        g = groups.setdefault(key, [0, 0])
        g[0] += 1
        g[1] += bool(miss)
    return [dict(w_mib=w, writer_same_side=same, near=near, lines=n, lost=lost / n)
            for (w, same, near), (n, lost) in sorted(groups.items())]


def model_reread(gpu: str, w_mib: int, every: int = 16) -> float:
    """The share of the timed lines the re-read probe finds lost, in flashsim.l2's cache of the
    preset ``gpu`` (its capacity, ways, replacement, fetch granule): one pass over the W MiB in
    address order from an empty L2, then a 4-byte read of every ``every``-th line in order (the
    probe's timed loads, whose misses allocate as the probe's do), each counted lost where it
    misses."""
    from flashsim.config import get_gpu
    from flashsim.l2 import L2

    g = get_gpu(gpu)
    cache = L2.for_gpu(g)
    w = int(w_mib) << 20
    ctr = np.zeros(4, dtype=np.int64)
    for a in range(0, w, 1 << 20):
        cache.access(a, min(1 << 20, w - a), False, ctr)
    lost = n = 0
    for line in range(0, w // g.l2_line_bytes, every):
        before = int(ctr[2])
        cache.access(line * g.l2_line_bytes, 4, False, ctr)
        lost += int(ctr[2]) > before
        n += 1
    return lost / max(n, 1)


def random_sets_loss(gpu: str, w_mib: int, seed: int = 0) -> float:
    """The share of W MiB of lines a cache of the preset's capacity and ways cannot hold when each
    line falls into a random set (a hashed set index, balls in bins: a set keeps at most ``ways``
    of its lines), against the model's sets by address modulo their count, which a window of
    consecutive lines fills evenly."""
    from flashsim.config import get_gpu

    g = get_gpu(gpu)
    nsets = g.l2_effective_bytes // (g.l2_line_bytes * g.l2_ways)
    lines = (int(w_mib) << 20) // g.l2_line_bytes
    per_set = np.bincount(np.random.default_rng(seed).integers(0, nsets, lines), minlength=nsets)
    return float(1 - np.minimum(per_set, g.l2_ways).sum() / lines)


def main(argv=None) -> int:
    ap = ToolParser(prog="python -m analysis.l2_partition", description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", help="l2_partition_probe records (.bin or .bin.gz), or with --reread "
                    "l2_reread_probe CSVs (.csv or .csv.gz)")
    ap.add_argument("--reread", action="store_true", help="the records are the re-read probe's CSVs")
    ap.add_argument("--gpu", default="h200", help="with --reread: the preset whose L2 model replays the probe "
                    "(default h200)")
    ap.add_argument("--sides", default=str(SIDES_RECORD), help="with --reread on a 'written' record: a partition "
                    "record of the same GPU, whose SM sides say which writers were on the reader's side")
    ap.add_argument("--pass", dest="pass_", type=int, default=1, choices=range(PASSES),
                    help="the pass whose latencies give the sides (default 1)")
    args = ap.parse_args(argv)
    for path in args.records:
        if args.reread:
            try:
                rows = read_reread(path)
                table = reread_table(rows)
            except (OSError, EOFError, ValueError) as e:
                ap.exit(2, f"flashsim: error: {e}\n")
            print(f"{path}: near/far by hit latency (cut {table[0]['cut']:.0f} cycles)" if table else path)
            try:
                ws = sorted({t["w_mib"] for t in table})
                model = {w: model_reread(args.gpu, w) for w in ws}
                rand = {w: random_sets_loss(args.gpu, w) for w in ws}
            except ValueError as e:
                ap.exit(2, f"flashsim: error: {e}\n")
            for t in table:
                print(f"  W {t['w_mib']:4d} MiB, SM {t['smid']:3d}: near {t['near']:6d} lines ({t['near_cycles']:.0f} "
                      f"cycles) lost {t['near_lost']:.3f}; far {t['far']:6d} ({t['far_cycles']:.0f}) lost "
                      f"{t['far_lost']:.3f}; model ({args.gpu}) {model[t['w_mib']]:.3f}, random sets "
                      f"{rand[t['w_mib']]:.3f}")
            print("  by W, over the runs: lost, runs agreeing line by line, lost by tenth of the window in address "
                  "order, MiB kept")
            for o in reread_order(rows):
                print(f"  W {o['w_mib']:4d} MiB ({o['runs']} runs): lost {o['lost']:.3f}, agree {o['agree']:.3f}, "
                      f"by tenth {' '.join(f'{x:.2f}' for x in o['by_tenth'])}; kept {o['kept_mib']:.1f}")
            if "writer" in rows[0]:
                try:
                    sides = summary(read(args.sides))["sm_side"]
                    table = written_sides(rows, sides)
                except (OSError, EOFError, ValueError) as e:
                    ap.exit(2, f"flashsim: error: {e}\n")
                print(f"  by writer (sides from {args.sides}): lost share of each group's first reads")
                for t in table:
                    print(f"  W {t['w_mib']:4d} MiB, writer {'on' if t['writer_same_side'] else 'off'} the reader's "
                          f"side, line {'near' if t['near'] else 'far'}: {t['lines']:6d} lines, lost {t['lost']:.3f}")
            continue
        try:
            rec = read(path)
        except (OSError, EOFError, ValueError) as e:
            ap.exit(2, f"flashsim: error: {e}\n")
        print(format_summary(path, rec, summary(rec, args.pass_)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
