"""The TMA records against :mod:`flashsim.tma`'s rules: the box sweep
(``scripts/device/tma_box_sweep.sh``: per NVTX range, one workload's launches under Nsight
Compute, the sectors the SMs receive by TMA, all, multicast and to the issuing CTA itself) and
the multicast probe (``scripts/device/tma_mc_probe.sh``: one launch a box geometry).

    python -m analysis.tma_boxes [analysis/data/h200/tma_box_sweep] [--csv OUT.csv]
    python -m analysis.tma_boxes --mc analysis/data/h200/tma_mc_probe

In the probe a cluster of c CTAs takes the 4,096 rows of a (4,096 x d) fp16 tensor 64 at a time,
in boxes of W columns at column col0, each CTA copying one piece (a slice of the box's rows or of
its columns) multicast to the whole cluster (c = 1: a plain copy); :func:`mc_sectors` is the
rule's count, every CTA receiving every piece.

For ``fwd_fp16_v7`` (K and V copied in boxes of one swizzle atom, 32 or 64 columns, zeros past d;
no clusters) the prediction is :func:`flashsim.tma.box_row_sectors` over every CTA's boxes; for
cuBLAS's GEMMs (S = Q·Kᵀ, O = P·V, dV = Pᵀ·dO) the tile, K step and cluster come from the kernel's
name and the prediction is torch_naive's :meth:`_Gemm.received_by_operand`, A and B apart, so
that the multicast operand (A where the cluster spans C's columns, B where it spans its rows) is
compared with Nsight Compute's multicast count and the other with its count of copies to the
issuing CTA.  Prints a line a workload and a summary (:func:`summary`).
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path

import numpy as np

from flashsim.algorithms.torch_naive import _Gemm, parse_tiles
from flashsim.cmdline import ToolParser
from flashsim.tma import box_row_sectors, multicast_row_sectors
from flashsim.traffic import Launch, Schedule, TensorLayout, walk

from .torch_set import NVJET_KSTEP, gemm_shape

RECORD = Path(__file__).resolve().parents[1] / "analysis/data/h200/tma_box_sweep"
MC_RECORD = Path(__file__).resolve().parents[1] / "analysis/data/h200/tma_mc_probe"
#: The multicast probe's tensor rows and box rows (scripts/device/tma_mc_probe.cu)
MC_ROWS = 4096
_P = "l1tex__m_xbar2l1tex_read_sectors"
METRICS = {"tma": f"{_P}_mem_global_op_tma_ld.sum", "multicast": f"{_P}_mem_global_op_tma_ld_dest_multicast.sum",
           "self": f"{_P}_mem_global_op_tma_ld_dest_self.sum", "l2_write": "lts__t_sectors_srcunit_tex_op_write.sum"}
#: The record's workload kinds (scripts/device/tma_box_sweep.py)
OPS = ("v7", "qk", "pv", "ptv")


def _int(text: str) -> int:
    return int(float(text.replace(",", "")))


def _counts(r: dict, path: Path, keys=tuple(METRICS)) -> dict:
    """The METRICS' counts of one raw-page row (ValueError naming the file and a missing column)."""
    try:
        return {k: _int(r[METRICS[k]]) for k in keys}
    except KeyError as e:
        raise ValueError(f"{path}: no column {e.args[0]} (the probes' metrics)") from None
    except (TypeError, ValueError):
        raise ValueError(f"{path}: a launch's counts are not numbers") from None


def _positive(where: str, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: {name}={v!r}: a positive integer")
    return v


def _raw_rows(path: Path) -> list[dict]:
    """The launches of an Nsight Compute raw-page CSV (the units row dropped)."""
    lines = path.read_text().splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if head is None:
        raise ValueError(f"{path}: no Nsight Compute raw-page header (\"ID\", ...)")
    return list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))[1:]


def load_mc(folder: Path) -> list[dict]:
    """The multicast probe's launches: the manifest's (d, w, col0, c, split: "rows" or "cols")
    with the METRICS' read counts, in launch order (ValueError naming the line and field of a
    manifest that is not the probe's)."""
    folder = Path(folder)
    path = folder / "manifest.txt"
    man = [(i, ln.split()) for i, ln in enumerate(path.read_text().splitlines(), 1) if ln.strip()]
    rows = _raw_rows(folder / "raw.csv")
    if len(rows) != len(man):
        raise ValueError(f"{folder}: {len(rows)} launches in raw.csv, {len(man)} lines in manifest.txt")
    out = []
    for r, (i, m) in zip(rows, man):
        where = f"{path}:{i}"
        if len(m) != 6 or not all(x.lstrip("-").isdigit() for x in m):
            raise ValueError(f"{where}: {' '.join(m)!r}: six integers (d W col0 c split index)")
        d, w, col0, c, split, _ = (int(x) for x in m)
        for name, v in (("d", d), ("W", w), ("c", c)):
            _positive(where, name, v)
        if split not in (0, 1) or w % c or not 0 <= col0 < d:
            raise ValueError(f"{where}: {split=}, W={w}, {c=}, {col0=}: split 0 (rows) or 1 (columns), "
                             "W a multiple of c, 0 <= col0 < d")
        out.append({"d": d, "w": w, "col0": col0, "c": c, "split": "cols" if split else "rows",
                    **_counts(r, folder / "raw.csv", ("tma", "multicast", "self"))})
    return out


def mc_sectors(rec: dict, rows: int = MC_ROWS) -> int:
    """The rule's count for a launch of the multicast probe: every row of the tensor in one box
    per cluster; each CTA copies a piece (the box's rows: its row geometry; or a slice of w / c
    columns) that all c CTAs receive, by :func:`flashsim.tma.multicast_row_sectors` (c = 1:
    :func:`flashsim.tma.box_row_sectors`)."""
    d, w, col0, c = rec["d"], rec["w"], rec["col0"], rec["c"]
    pieces = [(col0, w)] if c == 1 or rec["split"] == "rows" else [(col0 + k * (w // c), w // c) for k in range(c)]
    rule = box_row_sectors if c == 1 else multicast_row_sectors
    total = 0
    for c0, pw in pieces:
        start = np.arange(rows, dtype=np.int64) * (d * 2) + c0 * 2
        inb = np.full(rows, max(0, min(d - c0, pw)) * 2, dtype=np.int64)
        total += int(rule(start, inb, pw * 2).sum())
    return c * total


def load(folder: Path) -> list[dict]:
    """The record's launches inside a workload's NVTX range, in order: the manifest's workload
    (op, d, n, bh, dtype) with ``range``, ``kernel``, ``grid`` (x, y, z) and the METRICS' counts."""
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    if not isinstance(manifest, dict) or not all(isinstance(v, dict) for v in manifest.values()):
        raise ValueError(f"{folder / 'manifest.json'}: a mapping of range names to workloads")
    rows = _raw_rows(folder / "raw.csv")
    nvtx = next((k for k in rows[0] if "Push/Pop_Range" in k), None) if rows else None
    if nvtx is None:
        raise ValueError(f"{folder / 'raw.csv'}: no NVTX column (the sweep runs ncu with --nvtx)")
    out = []
    for r in rows:
        m = re.search(r":(w\d+):", r[nvtx] or "")
        if not m:
            continue  # the random buffers and the kernels' compilation calls, outside every range
        w = manifest.get(m.group(1))
        where = f"{folder / 'manifest.json'}: {m.group(1)}"
        if w is None or w.get("op") not in OPS:
            raise ValueError(f"{where}: not a workload of the sweep (op one of {', '.join(OPS)})")
        for name in ("d", "n", "bh"):
            _positive(where, name, w.get(name))
        if w.get("dtype") not in ("fp16", "bf16"):
            raise ValueError(f"{where}: dtype={w.get('dtype')!r}: fp16 or bf16")
        rec = dict(w, range=m.group(1), kernel=r.get("Kernel Name", ""),
                   grid=tuple(int(x) for x in re.findall(r"\d+", r.get("Grid Size", ""))))
        rec.update(_counts(r, folder / "raw.csv"))
        out.append(rec)
    return out


def v7_sectors(rec: dict) -> int:
    """``fwd_fp16_v7``'s K and V as its CTAs receive them: each CTA (the grid's, not causal, N a
    multiple of Bc) copies every key row of its head in atoms of ``swizzle_bytes(d)`` bytes
    (kernels.perf.fwd_fp16), the last running past d into zeros."""
    from kernels.perf.fwd_fp16 import swizzle_bytes

    d, n, rb = rec["d"], rec["n"], swizzle_bytes(rec["d"])
    atom = rb // 2
    c0 = np.arange(0, -(-d // atom) * atom, atom, dtype=np.int64)[None, :]
    start = np.arange(n, dtype=np.int64)[:, None] * (d * 2) + c0 * 2
    inb = np.broadcast_to(np.clip(d - c0, 0, atom) * 2, start.shape)
    per_head = int(box_row_sectors(start, inb, rb).sum())  # heads start on a sector: N·d·2 % 32 == 0
    return math.prod(rec["grid"]) * 2 * per_head


def gemm_of(rec: dict) -> tuple[_Gemm, int]:
    """The record's GEMM as torch_naive's :class:`_Gemm` (tile and cluster from the kernel's
    name) and its K step."""
    shape, ks = gemm_shape(rec["kernel"]), NVJET_KSTEP.search(rec["kernel"])
    if shape is None or ks is None:
        raise ValueError(f"{rec['range']}: {rec['kernel'][:60]!r} is not an nvjet GEMM")
    (tm, tn), = parse_tiles(shape[0], 1)
    (cr, cc), = parse_tiles(shape[1], 1, "gemm_clusters")
    n, d = rec["n"], rec["d"]
    if rec["op"] == "qk":  # S = Q Kᵀ
        g = _Gemm(n, n, d, ("Q", "rows"), ("K", "rows"), "S", tm, tn, True, cr, cc, eb=2)
    elif rec["op"] == "pv":  # O = P V
        g = _Gemm(n, d, n, ("P", "rows"), ("V", "cols"), "O", tm, tn, True, cr, cc, eb=2)
    else:  # dV = Pᵀ dO
        g = _Gemm(n, d, n, ("P", "cols"), ("dO", "cols"), "dV", tm, tn, True, cr, cc, eb=2)
    return g, int(ks.group(1))


def written_sectors(g: _Gemm, rec: dict) -> int:
    """The walker's count of C's TMA store sectors for the record's GEMM (torch_naive's tiles of
    C, stored in 128-byte pieces): A, B and C laid out as the walker lays tensors, 256-byte
    aligned, each head's matrix after the last."""
    n, d, bh = rec["n"], rec["d"], rec["bh"]
    shapes = {"qk": {"Q": (n, d), "K": (n, d), "S": (n, n)}, "pv": {"P": (n, n), "V": (n, d), "O": (n, d)},
              "ptv": {"P": (n, n), "dO": (n, d), "dV": (n, d)}}[rec["op"]]
    tensors = {k: TensorLayout(k, r, c, 2, bh) for k, (r, c) in shapes.items()}
    launch = Launch("gemm", bh, {k: np.arange(bh, dtype=np.int64) for k in tensors}, g.accesses, g.counts)
    io = walk(Schedule("tma_box_sweep", tensors, [launch]))
    return sum(t.sectors for (_, kind), t in io.per_launch["gemm"].breakdown.items() if kind == "bulk_write")


def table(recs: list[dict]) -> list[dict]:
    """Each launch with its predictions: ``sim_tma`` (all), ``sim_multicast`` and ``sim_self``
    (the GEMMs' operands by cluster; v7: all to itself), and their errors (measured / sim - 1);
    the GEMMs' ``sim_l2_write`` (:func:`written_sectors`)."""
    out = []
    for r in recs:
        r = dict(r)
        if r["op"] == "v7":
            r.update(tile="", cluster="1x1", sim_self=v7_sectors(r), sim_multicast=0)
        else:
            g, ks = gemm_of(r)
            a, b = g.received_by_operand(2, r["bh"], ks)
            mc = (a if g.cc > 1 else 0) + (b if g.cr > 1 else 0)
            r.update(tile=f"{g.tm}x{g.tn}", cluster=f"{g.cr}x{g.cc}", sim_multicast=mc, sim_self=a + b - mc,
                     sim_l2_write=written_sectors(g, r))
        r["sim_tma"] = r["sim_self"] + r["sim_multicast"]
        for k in ("tma", "multicast", "self"):
            r[f"{k}_err"] = (r[k] / r[f"sim_{k}"] - 1) if r[f"sim_{k}"] else (0.0 if r[k] == 0 else math.inf)
        out.append(r)
    return out


def summary(rows: list[dict]) -> dict:
    """v7 launches exact; GEMM operands copied to one CTA exact (of those with any); multicast
    parts exact, and their errors' range; GEMM launches within 2% and exact; GEMMs' L2 writes exact."""
    v7 = [r for r in rows if r["op"] == "v7"]
    gm = [r for r in rows if r["op"] != "v7"]
    selfs = [r for r in gm if r["sim_self"] or r["self"]]
    mcs = [r for r in gm if r["sim_multicast"] or r["multicast"]]
    errs = [r["multicast_err"] for r in mcs]
    return {"v7": len(v7), "v7_exact": sum(r["tma"] == r["sim_tma"] for r in v7),
            "gemms": len(gm), "self_parts": len(selfs), "self_exact": sum(r["self"] == r["sim_self"] for r in selfs),
            "multicast_parts": len(mcs), "multicast_exact": sum(r["multicast"] == r["sim_multicast"] for r in mcs),
            "multicast_err_min": min(errs, default=0.0), "multicast_err_max": max(errs, default=0.0),
            "gemm_within_2pct": sum(abs(r["tma_err"]) <= 0.02 for r in gm),
            "gemm_exact": sum(r["tma"] == r["sim_tma"] for r in gm),
            "writes_exact": sum(r["l2_write"] == r["sim_l2_write"] for r in gm)}


def main(argv=None) -> int:
    ap = ToolParser(prog="python -m analysis.tma_boxes", description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(RECORD), help="the sweep's record (raw.csv, manifest.json)")
    ap.add_argument("--csv", default=None, help="write the table here")
    ap.add_argument("--force", action="store_true", help="overwrite an existing --csv file")
    ap.add_argument("--mc", default=None, metavar="FOLDER",
                    help="read the multicast probe's record instead (tma_mc_probe.sh: raw.csv, manifest.txt)")
    a = ap.parse_args(argv)
    err = lambda msg: ap.exit(2, f"flashsim: error: {msg}\n")  # noqa: E731
    if a.mc and a.folder != str(RECORD):
        err(f"give the sweep's folder ({a.folder}) or --mc {a.mc}, not both")
    if a.csv:
        out = Path(a.csv)
        if not out.parent.is_dir() or out.is_dir():
            err(f"--csv {a.csv}: not a file in an existing folder")
        if out.exists() and not a.force:
            err(f"--csv {a.csv}: exists (--force to overwrite)")
    if a.mc:
        try:
            recs = load_mc(Path(a.mc))
            sims = [mc_sectors(r) for r in recs]
        except (OSError, ValueError) as e:
            err(e)
        for r, sim in zip(recs, sims):
            print(f"d={r['d']:<4} W={r['w']:<3} col0={r['col0']:<4} c={r['c']} {r['split']:4} "
                  f"received {r['tma']:>7} (multicast {r['multicast']:>7}, self {r['self']:>7}) sim {sim:>7}"
                  f" ({r['tma'] / sim - 1:+.2%})")
        print(f"multicast probe: {sum(s == r['tma'] for r, s in zip(recs, sims))}/{len(recs)} launches to the sector")
        return 0
    try:
        rows = table(load(Path(a.folder)))
    except (OSError, ValueError) as e:
        err(e)
    for r in rows:
        name = "fwd_fp16_v7" if r["op"] == "v7" else re.sub(r"^nvjet_sm\d+_", "", r["kernel"])[:34]
        print(f"{r['op']:4} d={r['d']:<4} N={r['n']:<5} {r['dtype']} {name:34} cluster {r['cluster']:4}"
              f" self {r['self']:>9} sim {r['sim_self']:>9} ({r['self_err']:+.2%})"
              f"  multicast {r['multicast']:>9} sim {r['sim_multicast']:>9} ({r['multicast_err']:+.2%})"
              + ("" if r["op"] == "v7" else f"  L2 writes {r['l2_write']:>8} sim {r['sim_l2_write']:>8}"))
    s = summary(rows)
    print(f"fwd_fp16_v7 (boxes to one CTA): {s['v7_exact']}/{s['v7']} launches to the sector")
    print(f"GEMMs: operands copied to one CTA {s['self_exact']}/{s['self_parts']} to the sector; multicast "
          f"operands {s['multicast_exact']}/{s['multicast_parts']} to the sector (measured/sim - 1 from "
          f"{s['multicast_err_min']:+.2%} to {s['multicast_err_max']:+.2%}); launches within 2%: "
          f"{s['gemm_within_2pct']}/{s['gemms']}, to the sector: {s['gemm_exact']}/{s['gemms']}; their L2 write "
          f"sectors (TMA stores of C in 128-byte pieces) to the sector: {s['writes_exact']}/{s['gemms']}")
    if a.csv and rows:
        keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "grid"] + ["grid"]
        tmp = Path(a.csv + ".tmp")
        try:
            with tmp.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys)
                w.writeheader()
                for r in rows:
                    w.writerow({**r, "grid": "x".join(map(str, r["grid"]))})
            tmp.replace(a.csv)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            err(f"--csv {a.csv}: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
