"""The ``fast`` measurement set: the kernels users get by default (``kernels.perf.BEST``), their
every launch, against the schedules of :mod:`flashsim.algorithms.fast`.

A configuration's ``kernel`` is the variant's name (``fwd_fp16_v4``, ``bwd_fp16_v3``, ...): the
worker runs exactly that variant with its default block shape (:func:`make_call`), the
simulator walks its schedule (algorithm ``fast``, option ``kernel``), and ``block_m`` /
``block_n`` record the tiles (the forward's, or the backward key-block kernel's query rows per
step and keys per block) for the reader.  A bf16 configuration runs the fp16 variant on torch
bfloat16 tensors (the kernels take bf16 as torch tensors; :func:`make_call`).  A backward
configuration measures the backward's launches only: D = rowsum(dO ∘ O), the dQ accumulator's
zero fill, the main kernel(s), the fp32 -> fp16 dQ conversion (O and L come from the shipped
forward, made before the profiler starts).

Besides the LSU loads and stores, the set asks Nsight Compute for the bytes of global
reductions and atomics (``red.global`` / ``atom``: the backwards' dQ) and of cp.async's
global-to-shared loads (LDGSTS), each where the installed ncu knows the metric
(:func:`metrics`); ``compare`` sets the reductions beside the walker's reduction class.

The LSU counts a cp.async tile by its shared destinations (:func:`ldgsts_sectors`: groups of 8
lanes, each the 32-byte sectors its destinations touch; the rule scripts/device/ldgsts_probe.sh
measured), so a tile copied into padded shared rows costs more LSU sectors than the global ones
the walker counts: :func:`predict_lsu_loads` gives a launch's LSU load bytes, which ``compare``
holds the measured loads against (the walker's count reported beside it).
"""

from __future__ import annotations

import functools
import subprocess

import numpy as np

from flashsim.algorithms import fast

from .ncu import EXTRA_METRICS, METRICS

#: The variants a configuration may name.
FAST_KERNELS = tuple(fast.VARIANTS)


#: variant -> the boolean knob of its default_config that a record names in a column of its own,
#: absent (False) in the records made before the knob became a default: bwd_fp16_v3's dQ by bulk
#: reductions (``bulkq``; a default at f49547c above d = 128, at e4caee9 from d = 96, d = 112 since,
#: d = 64 too since 2026-11-28; red.v2 without it), fwd_fp32_v2's O through shared memory
#: (``ostage``, 88f4ef8; scalar stores without it) and its Q split a fragment tile at a time
#: (``qfrag``, 2026-11-29; split_q's 16-byte chunks without it).
RECORD_KNOBS = {"bwd_fp16_v3": ("bulkq",), "fwd_fp32_v2": ("ostage", "qfrag")}

#: variant -> the knob of its causal block order, a column of causal records only (absent: grid
#: order, which every causal record made before the knob ran): bwd_fp16_v3's ``longest_first``
#: (key blocks), fwd_fp16_v5's and v7's ``lpt`` (query blocks longest first across heads; v7's
#: default since 2026-11-29).
CAUSAL_ORDER = {"bwd_fp16_v3": "longest_first", "fwd_fp16_v5": "lpt", "fwd_fp16_v7": "lpt"}

#: The SM count the sets are laid out for (the H100's and the H200's): where the launcher narrows a
#: forward's blocks for a small grid (``fast.fit_to_grid``), a configuration names the tiles it runs.
SET_SMS = 132


def _cfg(kernel: str, n: int, d: int, causal: bool = False, batch: int = 1, heads: int = 16,
         kv_heads: int | None = None, dtype: str | None = None) -> dict:
    pass_, dtype0 = fast.VARIANTS[kernel]
    dtype = dtype or dtype0
    assert fast.supports(kernel, dtype, d), (kernel, dtype, d)
    fitted = fast.fit_to_grid(kernel, fast.default_config(kernel, d), {}, n, batch * heads, SET_SMS, d=d)
    t = fast.tiles(kernel, d, fitted)
    t = t.get("fwd", t.get("dkdv"))
    cfg = {"kernel": kernel, "pass": pass_, "batch": batch, "heads": heads, "kv_heads": kv_heads or heads,
           "seq_len_q": n, "seq_len_k": n, "head_dim": d, "dtype": dtype, "causal": causal,
           "block_m": t.block_m, "block_n": t.block_n}
    if kernel in CAUSAL_ORDER and causal:  # the block order the kernel runs (a column of the record)
        cfg[CAUSAL_ORDER[kernel]] = fitted[CAUSAL_ORDER[kernel]]  # (lpt: off where B·H > the SMs)
    for knob in RECORD_KNOBS.get(kernel, ()):  # the knob's value the kernel runs with (a column of the record)
        cfg[knob] = fast.default_config(kernel, d)[knob]
    return cfg


def _best(pass_: str, dtype: str, d: int) -> str:
    name = fast.best(pass_, dtype, d)
    assert name is not None, (pass_, dtype, d)
    return name


def fast_set() -> list[dict]:
    """The fast kernels as ``impl="auto"`` picks them, B·H = 16 (batch 1, 16 heads): N 1,024 to
    16,384, d 64 and 128, fp16 and fp32, causal and not, forward and backward; bf16 forward and
    backward (d = 64, N = 4,096: the fp16 kernels compiled for bf16); grouped-query attention (16
    query heads on 2 kv heads) forward and backward; N = 1,000 (a ragged last block: the
    zero-filled rows of cp.async) forward and backward; the fp32 forward at d = 80 (fwd_fp32_v2, its
    head dim padded on chip to 96; fwd_fp32_v1 until 7fda245), bwd_fp16_v1 and
    fwd_fp16_v4 at d = 40, fwd_fp16_v7 (fwd_fp16_v5 until v7) and the fp32 backward at d = 96
    (bwd_fp32_v1 until bwd_fp32_v2 took it, its head dim padded on chip to 128) (head dims
    where BEST takes them,
    bwd_fp16_v1 at d = 40 until BEST took bwd_fp16_v3 at d = 32 and 40, where v1 now runs the
    deterministic backward;
    bwd_fp16_v1 was measured at d = 96 and 80 until BEST took bwd_fp16_v3 there, fwd_fp16_v4 at
    d = 96 until BEST took fwd_fp16_v5 there); bwd_fp16_v3 at d = 80 (its phases B and C end in an
    odd n-tile, its copy passes cross rows).  29 configurations, 66 launches."""
    out = []
    for d in (64, 128):  # the fp16 forward (N = 1,024 at d = 64: the fig2 record and N = 1,000 here)
        out += [_cfg(_best("fwd", "fp16", d), n, d) for n in ((4096, 16384) if d == 64 else (1024, 4096, 16384))]
        out.append(_cfg(_best("fwd", "fp16", d), 4096, d, causal=True))
    out += [_cfg(_best("fwd", "fp32", 64), 4096, 64), _cfg(_best("fwd", "fp32", 128), 4096, 128, causal=True),
            _cfg(_best("fwd", "fp32", 80), 1024, 80), _cfg(_best("fwd", "fp16", 96), 1024, 96),
            _cfg(_best("fwd", "fp16", 40), 1024, 40)]
    out.append(_cfg(_best("fwd", "bf16", 64), 4096, 64, dtype="bf16"))
    out += [_cfg(_best("bwd", "fp16", 64), 1024, 64), _cfg(_best("bwd", "fp16", 64), 4096, 64, causal=True)]
    out += [_cfg(_best("bwd", "fp16", 128), 4096, 128, causal=True)]
    out += [_cfg(_best("bwd", "fp16", 128), n, 128) for n in (4096, 16384)]
    out += [_cfg(_best("bwd", "fp32", 64), 1024, 64), _cfg(_best("bwd", "fp32", 64), 4096, 64, causal=True),
            _cfg(_best("bwd", "fp32", 128), 4096, 128), _cfg(_best("bwd", "fp32", 96), 1024, 96)]
    out += [_cfg("bwd_fp16_v1", 1024, 40), _cfg(_best("bwd", "fp16", 80), 1024, 80)]
    out.append(_cfg(_best("bwd", "bf16", 64), 4096, 64, dtype="bf16"))
    out += [_cfg(_best("fwd", "fp16", 128), 4096, 128, kv_heads=2),
            _cfg(_best("bwd", "fp16", 128), 4096, 128, kv_heads=2)]
    out += [_cfg(_best("fwd", "fp16", 64), 1000, 64), _cfg(_best("bwd", "fp16", 128), 1000, 128)]
    return out


def fast_smoke_set() -> list[dict]:
    """One small configuration per variant (B·H = 2, N = 256; GQA and causal in the backwards) and
    the bf16 path (fwd_fp16_v4, bwd_fp16_v1): the harness end to end in a minute."""
    return [_cfg("fwd_fp16_v4", 256, 64, heads=2), _cfg("fwd_fp16_v5", 256, 128, heads=2, causal=True),
            _cfg("fwd_fp32_v1", 256, 64, heads=2, causal=True),
            _cfg("fwd_fp32_v2", 256, 64, heads=2, causal=True),
            _cfg("bwd_fp16_v1", 256, 64, heads=2, kv_heads=1), _cfg("bwd_fp16_v3", 256, 128, heads=2, causal=True),
            _cfg("bwd_fp32_v1", 256, 96, heads=2), _cfg("bwd_fp32_v2", 256, 64, heads=2, kv_heads=1, causal=True),
            _cfg("fwd_fp16_v4", 256, 64, heads=2, dtype="bf16"),
            _cfg("bwd_fp16_v1", 256, 64, heads=2, causal=True, dtype="bf16")]


def _bf16(x):
    """A torch bfloat16 tensor of ``x``'s values (the worker's inputs of a bf16 configuration come
    as float32: numpy has no bfloat16), where ``x`` is: on the device (``__cuda_array_interface__``)
    or, under the CUDA simulator's tests, on the host.  The kernels take bf16 as torch tensors."""
    import torch

    t = torch.from_numpy(x) if isinstance(x, np.ndarray) else torch.as_tensor(x, device="cuda")
    return t.to(torch.bfloat16)


def make_call(cfg: dict, q, k, v, do):
    """The measured call of a fast configuration (inputs on the device): the variant's forward,
    or its backward after the shipped forward's O and L (made here, outside the measurement);
    bf16 inputs as torch tensors (:func:`_bf16`)."""
    from kernels.perf import variant

    vv = variant(cfg["kernel"])
    causal = bool(cfg.get("causal"))
    if cfg["dtype"] == "bf16":  # converted here, before the measurement
        q, k, v, do = (_bf16(x) for x in (q, k, v, do))
    if cfg["pass"] == "fwd":
        return lambda: vv.forward(q, k, v, causal=causal)
    o, lse = vv.saved_forward(q, k, v, causal=causal)
    return lambda: vv.backward(q, k, v, o, lse, do, causal=causal)


def metrics(query=None) -> tuple[str, ...]:
    """:data:`analysis.ncu.METRICS` and those of :data:`analysis.ncu.EXTRA_METRICS` the installed
    ncu lists (``ncu --query-metrics``; an unknown metric would fail the whole run).  ``query``:
    the text of that listing (tests), else ncu is asked."""
    if query is None:
        try:
            query = subprocess.run(["ncu", "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
        except (OSError, subprocess.SubprocessError):
            query = ""
    names = {line.split()[0] for line in query.splitlines() if line.strip()}
    return METRICS + tuple(m for m in EXTRA_METRICS if m.rsplit(".", 1)[0] in names)


def sim_options(cfg: dict) -> dict:
    """The ``fast`` schedule's options for a measured configuration: the variant, and the block
    shape the record names (``block_m``/``block_n``) where it is not the variant's default of
    today (a record measured before a default changed keeps its own tiles: fwd_fp16_v4 at d = 128
    ran Bc = 32 until the tuner's Bc = 16; fwd_fp16_v5 at d = 128 two warpgroups, 128 x 128, until
    532db74's record gave it one, 64 x 64; a small grid's narrowed block, :func:`fast.fit_to_grid`).
    ValueError where no block-shape override of the variant gives the record's tiles.  Causal
    bwd_fp16_v3, fwd_fp16_v5 and v7: the block order of the record's ``longest_first`` or ``lpt``
    column (:data:`CAUSAL_ORDER`), grid order without it.  bwd_fp16_v3's dQ by bulk reductions
    where the record's ``bulkq`` column says so, by ``red.v2`` without it.
    fwd_fp32_v2: O through shared memory where the record's ``ostage`` column says so, by scalar
    stores without it (every record made before that default); Q split a fragment tile at a time
    where its ``qfrag`` column says so, by split_q's chunks without it."""
    opts = _block_options(cfg)
    order = CAUSAL_ORDER.get(cfg["kernel"])
    if order and cfg.get("causal") and not cfg.get(order):
        # a causal record without the column (every record made before the variant's knob) ran
        # its blocks in grid order: the L2 model issues them so
        opts["config"] = {**opts.get("config", {}), order: False}
    for knob in RECORD_KNOBS.get(cfg["kernel"], ()):
        # a record without the column (every one made before the knob's default: see RECORD_KNOBS)
        # ran the kernel without it
        value = bool(cfg.get(knob))
        if value != fast.default_config(cfg["kernel"], cfg["head_dim"])[knob]:
            opts["config"] = {**opts.get("config", {}), knob: value}
    return opts


def _block_options(cfg: dict) -> dict:
    name, d = cfg["kernel"], cfg["head_dim"]
    want = (cfg.get("block_m"), cfg.get("block_n"))
    if None in want:
        return {"kernel": name}

    def tiles_of(config):
        t = fast.tiles(name, d, config)
        t = t.get("fwd", t.get("dkdv"))
        return t.block_m, t.block_n

    bm, bn = want
    base = fast.default_config(name, d)
    narrow = fast.fit_to_grid(name, base, {}, 1, 1, 1 << 30, d=d)  # the launcher's small-grid block
    narrowed = {key: val for key, val in narrow.items() if base[key] != val}
    for config in ({}, narrowed, {"bc": bn}, {"bc": bn, "br": bm}, {"bk": bn, "bq": bm}, {"bc": bn, "nw": bm // 16}):
        try:
            if tiles_of(config) == want:
                return {"kernel": name, "config": config} if config else {"kernel": name}
        except ValueError:  # a key this variant does not take
            continue
    raise ValueError(f"kernel={name!r}, head_dim={d}: block_m={bm}, block_n={bn} is no block shape of the "
                     f"variant's (its default: {tiles_of({})})")


__all__ = ["FAST_KERNELS", "fast_set", "fast_smoke_set", "ldgsts_patterns", "ldgsts_sectors", "make_call", "metrics",
           "predict_lsu_loads", "sim_options"]


# ---------------------------------------------------------------------------------------------
# What the LSU counts for a cp.async tile (LDGSTS): the rule the probe measured


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def ldgsts_patterns(kernel: str, d: int, config=None) -> dict:
    """{launch: {tensor: (tile rows, row bytes, shared row stride in bytes, threads)}} of the
    tiles a variant copies by cp.async, 16 bytes a thread, chunk e = tid + u·threads at row
    e // (row bytes / 16) (kernels/perf/_tiles.py's f16_copy, f16_chunks, f32_copier;
    bwd_fp16_v3's own loop, the same chunks), at the variant's block shape (its default, or
    ``config``); fwd_fp32_v2's Q only without ``qsplit`` (with it, plain loads)."""
    c = fast.parse_config(kernel, d, config)
    if kernel == "fwd_fp16_v4":
        s, nt = 2 * (_ceil(d, 16) + 8), 32 * c["nw"]
        return {kernel: {"Q": (16 * c["nw"] * c["mt"], 2 * d, s, nt), "K": (c["bc"], 2 * d, s, nt),
                         "V": (c["bc"], 2 * d, s, nt)}}
    if kernel == "fwd_fp16_v5":  # 128-byte swizzled rows, unpadded: 4 sectors a group
        nt = 32 * c["nw"]
        return {kernel: {"Q": (16 * c["nw"] * c["mt"], 2 * d, 2 * d, nt), "K": (c["bc"], 2 * d, 2 * d, nt),
                         "V": (c["bc"], 2 * d, 2 * d, nt)}}
    if kernel == "fwd_fp16_v7":  # Q as v5 copies it; K and V by the TMA unit (no cp.async)
        return {kernel: {"Q": (16 * c["nw"] * c["mt"], 2 * d, 2 * d, 32 * c["nw"])}}
    if kernel == "fwd_fp32_v1":
        d16, nt = _ceil(d, 16), 32 * c["nw"]
        qk, vs = 4 * (d16 + 4), 4 * _ceil(d16, 32)
        return {kernel: {"Q": (4 * c["rm"] * c["nw"], 4 * d, qk, nt), "K": (c["bc"], 4 * d, qk, nt),
                         "V": (c["bc"], 4 * d, vs, nt)}}
    if kernel == "fwd_fp32_v2":  # Q, K rows DP + 8 floats apart, V rows DP + 4 (DP: d rounded up to 32)
        dp, nt = fast.fwd_fp32_v2_dim(d), 32 * c["nw"]  # Q by plain loads with qsplit
        s = 4 * (dp + 8)
        out = {"K": (c["bc"], 4 * d, s, nt), "V": (c["bc"], 4 * d, 4 * (dp + 4), nt)}
        if not c["qsplit"]:
            out["Q"] = (16 * c["nw"] * c["mt"], 4 * d, s, nt)
        return {kernel: out}
    if kernel == "bwd_fp16_v1":
        s, nt, rows = 2 * (_ceil(d, 16) + 8), 32 * c["nw"], 16 * c["nw"] * c["mt"]
        kv, qq = (rows, 2 * d, s, nt), (c["bq"], 2 * d, s, nt)
        return {f"{kernel}_dkdv": {"K": kv, "V": kv, "Q": qq, "dO": qq},
                f"{kernel}_dq": {"Q": (rows, 2 * d, s, nt), "dO": (rows, 2 * d, s, nt),
                                 "K": (c["bk"], 2 * d, s, nt), "V": (c["bk"], 2 * d, s, nt)}}
    if kernel == "bwd_fp16_v3":  # rows of d rounded up to 16, plus 8
        s, nt = 2 * (_ceil(d, 16) + 8), 32 * c["nw"]
        kv, qq = (c["bk"], 2 * d, s, nt), (c["bq"], 2 * d, s, nt)
        return {kernel: {"K": kv, "V": kv, "Q": qq, "dO": qq}}
    s = 4 * (_ceil(d, 16) + 4) if kernel == "bwd_fp32_v1" else 4 * (fast.bwd_fp32_v2_dim(d) + 8)
    nt = 32 * c["nw"]
    kv, qq = (c["bc"], 4 * d, s, nt), (c["br"], 4 * d, s, nt)
    return {kernel: {"K": kv, "V": kv, "Q": qq, "dO": qq}}


#: Lanes of a cp.async that the LSU counts together: 8 lanes x 16 bytes, one 128-byte segment.
LDGSTS_GROUP = 8


@functools.cache
def ldgsts_sectors(rows: int, row_bytes: int, stride: int, threads: int, valid: int | None = None) -> int:
    """The LSU load sectors of one cp.async copy of a ``rows`` x ``row_bytes`` tile (rows
    contiguous in global memory) into shared rows ``stride`` bytes apart (the tile at a 32-byte
    aligned shared address) by ``threads`` threads, 16 bytes a lane, chunk e = tid + u·threads at
    row e // (row_bytes / 16), of which the first ``valid`` rows exist (default all; a row past
    them is copied with src-size 0: no request).  The rule the probe measured
    (scripts/device/ldgsts_probe.cu): each instruction's lanes count in groups of
    :data:`LDGSTS_GROUP` consecutive lanes, and a group costs the 32-byte sectors its lanes'
    shared DESTINATIONS touch (4 for a 32-byte aligned 128-byte span, 5 for one 16 bytes off),
    whatever the global sectors it reads."""
    ch = row_bytes // 16
    n = rows * ch
    valid = rows if valid is None else valid
    total = 0
    for g0 in range(0, _ceil(n, threads), LDGSTS_GROUP):  # groups of 8 lanes: never across warps
        es = [e for e in range(g0, min(g0 + LDGSTS_GROUP, n)) if e // ch < valid]
        total += len({((e // ch) * stride + (e % ch) * 16) // 32 for e in es})
    return total


def predict_lsu_loads(cfg: dict, sched, io, config=None) -> list[int]:
    """Per launch of ``sched`` (``io``: the walker's count of it), its LSU load bytes: the
    walker's global sectors for the plain loads, :func:`ldgsts_sectors` for every cp.async
    tile (:func:`ldgsts_patterns`; each tile copy by its rows that exist), x 32.  Raises
    ``AssertionError`` if the tiles, counted by their bytes, do not add up to the walker's
    count of them (the tiles read here are the schedule's).  Rows of a width that is not a
    multiple of 32 bytes (d = 40 in fp16: 80 bytes) share global sectors with their neighbours,
    which the walker counts; the LSU's count of a cp.async goes by the shared destinations."""
    import numpy as np

    pats = ldgsts_patterns(cfg["kernel"], cfg["head_dim"], config)
    out = []
    for launch in sched.launches:
        c = io.per_launch[launch.name]
        p = pats.get(launch.name, {})
        lsu = {t: 0 for t in p}
        glob = {t: 0 for t in p}
        for a in launch.counts():
            if a.tensor not in p or a.key != "read":
                continue
            assert a.ncols is None, (launch.name, a.tensor)  # cp.async tiles are whole rows
            rows, row_bytes, stride, threads = p[a.tensor]
            nrows, rep = np.broadcast_arrays(*np.broadcast_arrays(a.row0, a.nrows, a.col0, a.slice_offset,
                                                                  a.repeat)[1::3])
            for v in np.unique(nrows):
                if v > 0:
                    w = int(rep[nrows == v].sum()) * launch.programs
                    lsu[a.tensor] += w * ldgsts_sectors(rows, row_bytes, stride, threads, int(v))
                    glob[a.tensor] += w * int(v) * row_bytes
        total = c.read_sectors or 0
        for t in p:
            walked = c.breakdown.get((t, "read"))
            assert (walked.bytes if walked else 0) == glob[t], (launch.name, t, walked, glob[t])
            total += lsu[t] - (walked.sectors if walked else 0)
        out.append(total * 32)
    return out
