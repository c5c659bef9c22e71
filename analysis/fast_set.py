"""The ``fast`` measurement set: the kernels users get by default (``kernels.perf.BEST``), their
every launch, against the schedules of :mod:`flashsim.algorithms.fast`.

A configuration's ``kernel`` is the variant's name (``fwd_fp16_v4``, ``bwd_fp16_v3``, ...): the
worker runs exactly that variant with its default block shape (:func:`make_call`), the
simulator walks its schedule (algorithm ``fast``, option ``kernel``), and ``block_m`` /
``block_n`` record the tiles (the forward's, or the backward key-block kernel's query rows per
step and keys per block) for the reader.  A backward configuration measures the backward's
launches only: D = rowsum(dO ∘ O), the dQ accumulator's zero fill, the main kernel(s), the fp32
-> fp16 dQ conversion (O and L come from the shipped forward, made before the profiler starts).

Besides the LSU loads and stores, the set asks Nsight Compute for the bytes of global
reductions and atomics (``red.global`` / ``atom``: the backwards' dQ) and of cp.async's
global-to-shared loads (LDGSTS), each where the installed ncu knows the metric
(:func:`metrics`); ``compare`` sets the reductions beside the walker's reduction class.
"""

from __future__ import annotations

import subprocess

from flashsim.algorithms import fast

from .ncu import EXTRA_METRICS, METRICS

#: The variants a configuration may name.
FAST_KERNELS = tuple(fast.VARIANTS)


def _cfg(kernel: str, n: int, d: int, causal: bool = False, batch: int = 1, heads: int = 16,
         kv_heads: int | None = None) -> dict:
    pass_, dtype = fast.VARIANTS[kernel]
    t = fast.tiles(kernel, d)
    t = t.get("fwd", t.get("dkdv"))
    return {"kernel": kernel, "pass": pass_, "batch": batch, "heads": heads, "kv_heads": kv_heads or heads,
            "seq_len_q": n, "seq_len_k": n, "head_dim": d, "dtype": dtype, "causal": causal,
            "block_m": t.block_m, "block_n": t.block_n}


def _best(pass_: str, dtype: str, d: int) -> str:
    name = fast.best(pass_, dtype, d)
    assert name is not None, (pass_, dtype, d)
    return name


def fast_set() -> list[dict]:
    """The fast kernels as ``impl="auto"`` picks them, B·H = 16 (batch 1, 16 heads): N 1,024 to
    16,384, d 64 and 128, fp16 and fp32, causal and not, forward and backward; grouped-query
    attention (16 query heads on 2 kv heads) forward and backward; N = 1,000 (a ragged last
    block: the zero-filled rows of cp.async) forward and backward; bwd_fp32_v1 at d = 96 (where
    BEST takes it).  25 configurations, 55 launches."""
    out = []
    f16, f32 = _best("fwd", "fp16", 64), _best("fwd", "fp32", 64)
    for d in (64, 128):
        out += [_cfg(_best("fwd", "fp16", d), n, d) for n in (1024, 4096, 16384)]
        out.append(_cfg(_best("fwd", "fp16", d), 4096, d, causal=True))
    out += [_cfg(f32, 1024, 64), _cfg(f32, 4096, 64), _cfg(_best("fwd", "fp32", 128), 4096, 128, causal=True)]
    for d in (64, 128):
        b = _best("bwd", "fp16", d)
        out += [_cfg(b, 1024, d), _cfg(b, 4096, d, causal=True)]
    out += [_cfg(_best("bwd", "fp16", 128), n, 128) for n in (4096, 16384)]
    out += [_cfg(_best("bwd", "fp32", 64), 1024, 64), _cfg(_best("bwd", "fp32", 64), 4096, 64, causal=True),
            _cfg(_best("bwd", "fp32", 128), 4096, 128), _cfg(_best("bwd", "fp32", 96), 1024, 96)]
    out += [_cfg(_best("fwd", "fp16", 128), 4096, 128, kv_heads=2),
            _cfg(_best("bwd", "fp16", 128), 4096, 128, kv_heads=2)]
    out += [_cfg(f16, 1000, 64), _cfg(_best("bwd", "fp16", 128), 1000, 128)]
    return out


def fast_smoke_set() -> list[dict]:
    """One small configuration per variant (B·H = 2, N = 256; GQA and causal in the backwards):
    the harness end to end in a minute."""
    return [_cfg("fwd_fp16_v4", 256, 64, heads=2), _cfg("fwd_fp32_v1", 256, 64, heads=2, causal=True),
            _cfg("bwd_fp16_v1", 256, 64, heads=2, kv_heads=1), _cfg("bwd_fp16_v3", 256, 128, heads=2, causal=True),
            _cfg("bwd_fp32_v1", 256, 96, heads=2), _cfg("bwd_fp32_v2", 256, 64, heads=2, kv_heads=1, causal=True)]


def make_call(cfg: dict, q, k, v, do):
    """The measured call of a fast configuration (inputs on the device): the variant's forward,
    or its backward after the shipped forward's O and L (made here, outside the measurement)."""
    from kernels.perf import variant

    vv = variant(cfg["kernel"])
    causal = bool(cfg.get("causal"))
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
    return {"kernel": cfg["kernel"]}


__all__ = ["FAST_KERNELS", "fast_set", "fast_smoke_set", "make_call", "metrics", "sim_options"]


# ---------------------------------------------------------------------------------------------
# The LDGSTS question: what the LSU counts if it counts cp.async by its shared destination


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def ldgsts_patterns(kernel: str, d: int, config=None) -> dict:
    """{launch: {tensor: (tile rows, row bytes, shared row stride in bytes, threads)}} of the
    tiles a variant copies by cp.async, 16 bytes a thread, chunk e = tid + u·threads at row
    e // (row bytes / 16) (kernels/perf/_tiles.py's f16_copy, f16_chunks, f32_copier;
    bwd_fp16_v3's own loop), at the variant's block shape (its default, or ``config``)."""
    c = fast.parse_config(kernel, d, config)
    if kernel == "fwd_fp16_v4":
        s, nt = 2 * (_ceil(d, 16) + 8), 32 * c["nw"]
        return {kernel: {"Q": (16 * c["nw"] * c["mt"], 2 * d, s, nt), "K": (c["bc"], 2 * d, s, nt),
                         "V": (c["bc"], 2 * d, s, nt)}}
    if kernel == "fwd_fp32_v1":
        d16, nt = _ceil(d, 16), 32 * c["nw"]
        qk, vs = 4 * (d16 + 4), 4 * _ceil(d16, 32)
        return {kernel: {"Q": (4 * c["rm"] * c["nw"], 4 * d, qk, nt), "K": (c["bc"], 4 * d, qk, nt),
                         "V": (c["bc"], 4 * d, vs, nt)}}
    if kernel == "bwd_fp16_v1":
        s, nt, rows = 2 * (_ceil(d, 16) + 8), 32 * c["nw"], 16 * c["nw"] * c["mt"]
        kv, qq = (rows, 2 * d, s, nt), (c["bq"], 2 * d, s, nt)
        return {f"{kernel}_dkdv": {"K": kv, "V": kv, "Q": qq, "dO": qq},
                f"{kernel}_dq": {"Q": (rows, 2 * d, s, nt), "dO": (rows, 2 * d, s, nt),
                                 "K": (c["bk"], 2 * d, s, nt), "V": (c["bk"], 2 * d, s, nt)}}
    if kernel == "bwd_fp16_v3":
        s, nt = 2 * (d + 8), 32 * c["nw"]
        kv, qq = (c["bk"], 2 * d, s, nt), (c["bq"], 2 * d, s, nt)
        return {kernel: {"K": kv, "V": kv, "Q": qq, "dO": qq}}
    s = 4 * (_ceil(d, 16) + 4) if kernel == "bwd_fp32_v1" else 4 * (d + 8)
    nt = 32 * c["nw"]
    kv, qq = (c["bc"], 4 * d, s, nt), (c["br"], 4 * d, s, nt)
    return {kernel: {"K": kv, "V": kv, "Q": qq, "dO": qq}}


def destination_ratio(rows: int, row_bytes: int, stride: int, threads: int):
    """Over a whole tile's cp.async instructions (a warp's 32 chunks each), the 32-byte sectors of
    the shared destinations over those of the global sources (rows contiguous in global memory,
    the tile 32-byte aligned in both): a Fraction."""
    from fractions import Fraction

    ch = row_bytes // 16
    n = rows * ch
    dst = src = 0
    for u in range(-(-n // threads)):
        for w in range(threads // 32):
            es = range(u * threads + 32 * w, min(u * threads + 32 * w + 32, n))
            if len(es):
                dst += len({((e // ch) * stride + (e % ch) * 16) // 32 for e in es})
                src += len({(16 * e) // 32 for e in es})
    return Fraction(dst, src)


def predict_ldgsts_destination(cfg: dict, io, config=None) -> list[int | None]:
    """Per launch of ``io`` (the walker's count of the configuration's schedule), its LSU load
    bytes if the LSU counts each cp.async tile by its shared destination's sectors
    (:func:`destination_ratio` times the tile's global sectors; plain loads as they are); None
    where that is not a whole number of sectors (a ragged tile)."""
    pats = ldgsts_patterns(cfg["kernel"], cfg["head_dim"], config)
    out = []
    for name, c in io.per_launch.items():
        total = 0
        for (tensor, key), t in c.breakdown.items():
            if key != "read":
                continue
            p = pats.get(name, {}).get(tensor)
            total += t.sectors * (1 if p is None else destination_ratio(*p))
        out.append(int(total) * 32 if total == int(total) else None)
    return out
