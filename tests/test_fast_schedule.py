"""The fast kernels' schedules (flashsim/algorithms/fast.py): their block shapes and selection
equal kernels.perf's, hand-derived counts for small cases, walker == closed form, and the
elements each launch touches equal what the kernels touch under the CUDA simulator."""

from __future__ import annotations

import numpy as np
import pytest
from _fast_trace import trace
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flashsim import Workload
from flashsim.algorithms import fast
from flashsim.api import build_schedule, simulate
from flashsim.traffic import walk

FP = {"fp16": np.float16, "fp32": np.float32, "bf16": "bfloat16"}


def W(b, h, n, d, **kw):
    return Workload(batch=b, heads=h, seq_len_q=n, head_dim=d, **kw)


# ---------------------------------------------------------------------------------------------
# The restated block shapes and selection equal kernels.perf's


def _perf_supports(v, dtype: str, d: int) -> bool:
    try:
        return bool(v.supports(FP[dtype], d))
    except TypeError:  # the fp32 kernels' np.dtype("bfloat16"): not theirs
        return False


def test_default_configs_and_selection_equal_kernels_perf():
    from kernels import perf

    assert set(fast.VARIANTS) == set(perf.VARIANTS) - {"fwd_fp16_v3"}  # every variant but one BEST left
    for name in fast.VARIANTS:
        v = perf.variant(name)
        for dtype in FP:
            for d in range(1, 261):
                assert fast.supports(name, dtype, d) == _perf_supports(v, dtype, d), (name, dtype, d)
                if _perf_supports(v, dtype, d):
                    assert fast.default_config(name, d) == v.default_config(d), (name, d)
    from kernels.perf.bwd_fp32 import padded_dim_v2
    from kernels.perf.fwd_fp32 import compute_dim_v2
    for d in range(8, 129, 8):  # the head dims the fp32 v2 kernels compute with, restated here
        assert fast.fwd_fp32_v2_dim(d) == compute_dim_v2(d) and fast.bwd_fp32_v2_dim(d) == padded_dim_v2(d), d
    names = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16"}
    assert {k: tuple(x) for k, x in fast.BEST.items()} == {(p, names[t]): tuple(x) for (p, t), x in perf.BEST.items()}
    for (pass_, dtype) in fast.BEST:
        for d in range(1, 261):
            b = perf.best(pass_, FP[dtype], d)
            assert fast.best(pass_, dtype, d) == (None if b is None else b.name), (pass_, dtype, d)
    assert fast.best("fwd", "bf16", 64) == "fwd_fp16_v7" and fast.best("fwd", "fp32", 96) == "fwd_fp32_v2"
    assert fast.best("fwd", "fp16", 96) == "fwd_fp16_v7" and fast.best("fwd", "bf16", 256) == "fwd_fp16_v7"
    assert fast.best("fwd", "fp16", 40) == "fwd_fp16_v4" and fast.best("fwd", "bf16", 56) == "fwd_fp16_v4"
    assert fast.best("fwd", "fp32", 80) == "fwd_fp32_v2" and fast.best("fwd", "fp32", 36) == "fwd_fp32_v1"


def test_longest_first_rule_equals_the_kernels():
    from kernels.perf import bwd_fp16

    for bk in (32, 64, 128):
        for kv_blocks in range(1, 300):
            assert fast.longest_first_runs(bk, kv_blocks) == bwd_fp16.longest_first_runs(bk, kv_blocks)
    assert fast.longest_first_runs(64, 32) and not fast.longest_first_runs(64, 33) and fast.longest_first_runs(128, 256)


def test_key_warps_equal_the_kernels_warp_grids():
    """flashsim restates bwd_fp32's warp grid (which warps read L and D): equal for every block
    shape the kernels accept over a grid of them."""
    from kernels.perf import bwd_fp32 as m

    n = 0
    for name, tiling, dims, key in (("bwd_fp32_v1", m.tiling_v1, (8, 12, 64, 96, 128), "wk1"),
                                    ("bwd_fp32_v2", m.tiling_v2, (32, 64, 128), "wa")):
        for d in dims:
            for nw in (1, 2, 4, 8):
                for bc in (16, 32, 64, 128):
                    for br in (16, 32, 64):
                        try:
                            want = tiling(d, bc, br, nw)[key]
                        except ValueError:
                            continue
                        assert fast.key_warps(name, d, dict(bc=bc, br=br, nw=nw)) == want, (name, d, nw, bc, br)
                        n += 1
    assert n > 100


def test_selection_and_bad_input():
    w = W(1, 1, 128, 128, dtype="fp16")
    assert fast.variant_for(w, "bwd") == "bwd_fp16_v3"
    assert fast.variant_for(W(1, 1, 128, 64), "bwd") == "bwd_fp16_v3"
    assert fast.variant_for(W(1, 1, 128, 48), "bwd") == "bwd_fp16_v3"
    assert fast.variant_for(W(1, 1, 128, 40), "bwd") == "bwd_fp16_v3"
    assert fast.variant_for(W(1, 1, 128, 24), "bwd") == "bwd_fp16_v1"
    assert fast.variant_for(W(1, 1, 128, 64, dtype="fp32"), "bwd") == "bwd_fp32_v2"
    assert fast.variant_for(W(1, 1, 128, 48, dtype="fp32"), "bwd") == "bwd_fp32_v2"  # padded to 64
    assert fast.variant_for(W(1, 1, 128, 40, dtype="fp32"), "bwd") == "bwd_fp32_v2"  # since d2f3ac7 (H200)
    assert fast.variant_for(W(1, 1, 128, 8, dtype="fp32"), "bwd") == "bwd_fp32_v1"  # faster there (H200)
    assert fast.variant_for(W(1, 1, 128, 36, dtype="fp32"), "bwd") == "bwd_fp32_v2"  # since f840550: d % 4 == 0
    assert fast.variant_for(W(1, 1, 128, 12, dtype="fp32"), "bwd") == "bwd_fp32_v1"
    assert fast.variant_for(W(1, 1, 128, 128, dtype="bf16"), "bwd") == "bwd_fp16_v3"
    for kernel, msg in (("fwd_fp16_v9", "one of"), ("bwd_fp16_v3", "a bwd kernel"), ("fwd_fp32_v1", "does not take"),
                        ("fwd_fp32_v2", "does not take")):
        with pytest.raises(ValueError, match=f"kernel=.*{msg}"):
            simulate(w, "fast", "fwd", kernel=kernel)
    with pytest.raises(ValueError, match="kernel=.*does not take"):
        simulate(W(1, 1, 128, 36, dtype="fp32"), "fast", "fwd", kernel="fwd_fp32_v2")
    with pytest.raises(ValueError, match="no fast fwd kernel"):
        simulate(W(1, 1, 128, 12, dtype="bf16"), "fast")
    for config, msg in (("nw=x", "not an integer"), ({"bk": 16}, "takes"), ({"qreg": 1}, "true or false"),
                        ("nw", "key=value"), ({"nw": 0}, "positive")):
        with pytest.raises(ValueError, match=f"config=.*{msg}"):
            simulate(w, "fast", "fwd", config=config)
    with pytest.raises(ValueError, match="options="):
        simulate(w, "fast", "fwd", window=(1, 1))
    with pytest.raises(ValueError, match="tiling"):
        fast.plan(w, None, fast.Tiling(64, 64))


# ---------------------------------------------------------------------------------------------
# Hand-derived counts


def _by(r, launch=None):
    io = r.io if launch is None else r.io.per_launch[launch]
    return {k: (t.elements, t.bytes, t.sectors) for k, t in sorted(io.breakdown.items())}


def test_fwd_fp16_v4_counts_by_hand():
    # d = 64: Br = 16·nw·mt = 16·4·2 = 128, Bc = 64.  B = H = 1, N = 256: Tr = 2.
    r = simulate(W(1, 1, 256, 64), "fast", "fwd", kernel="fwd_fp16_v4")
    assert list(r.io.per_launch) == ["fwd_fp16_v4"] and r.agrees
    # Q once: 256·64 = 16,384 halves = 32,768 B = 1,024 sectors; K, V once per query block: 2·16,384;
    # O once; L (fp32) in requests of 8 rows = 32 B: 32 requests, 32 sectors.
    assert _by(r) == {("K", "read"): (32768, 65536, 2048), ("L", "write"): (256, 1024, 32),
                      ("O", "write"): (16384, 32768, 1024), ("Q", "read"): (16384, 32768, 1024),
                      ("V", "read"): (32768, 65536, 2048)}
    # Causal: query block 0 (rows 0..127) sees key blocks j·64 <= 127, j = 0, 1 (128 rows); block 1
    # sees all 4 (256 rows): K = (128 + 256)·64 = 24,576.
    rc = simulate(W(1, 1, 256, 64, causal=True), "fast", "fwd", kernel="fwd_fp16_v4")
    assert rc.io.breakdown[("K", "read")].elements == 24576 == rc.io.breakdown[("V", "read")].elements


def test_fwd_fp16_v5_counts_by_hand():
    # d = 128: one warpgroup, Br = 16·nw = 64, Bc = 48 (the warpgroup forward's default).  B = H = 1,
    # N = 384: Tr = 6, Tc = 8.  Its loads and stores are v4's: the swizzled shared layout moves the
    # same rows.
    r = simulate(W(1, 1, 384, 128), "fast", "fwd", kernel="fwd_fp16_v5")
    assert list(r.io.per_launch) == ["fwd_fp16_v5"] and r.agrees
    # Q once: 384·128 = 49,152 halves = 98,304 B = 3,072 sectors; K, V once per query block:
    # 6·49,152; O once; L in requests of 8 rows = 32 B: 48 requests, 48 sectors.
    assert _by(r) == {("K", "read"): (294912, 589824, 18432), ("L", "write"): (384, 1536, 48),
                      ("O", "write"): (49152, 98304, 3072), ("Q", "read"): (49152, 98304, 3072),
                      ("V", "read"): (294912, 589824, 18432)}
    # Causal: query block i (rows 64i..64i + 63) sees key blocks j with 48j <= 64i + 63:
    # 2 + 3 + 4 + 6 + 7 + 8 = 30 blocks of 48 rows.
    rc = simulate(W(1, 1, 384, 128, causal=True), "fast", "fwd", kernel="fwd_fp16_v5")
    assert rc.io.breakdown[("K", "read")].elements == 30 * 48 * 128 == rc.io.breakdown[("V", "read")].elements
    # the first default (two warpgroups, Bc = 128: v6's) as a config: Tr = 3, K and V 3·49,152
    r2 = simulate(W(1, 1, 384, 128), "fast", "fwd", kernel="fwd_fp16_v5", config={"nw": 8, "bc": 128})
    assert r2.io.breakdown[("K", "read")].elements == 3 * 49152 and r2.agrees


def test_fwd_fp16_v7_counts_by_hand():
    # BEST's forward at d = 64 to 256.  d = 128: v5's block (one warpgroup, Br = 64, Bc = 48); K and
    # V come by the TMA unit: the same rows as v5's, class "bulk", none of it an LSU load.
    r = simulate(W(1, 1, 384, 128), "fast", "fwd")
    assert list(r.io.per_launch) == ["fwd_fp16_v7"] and r.agrees
    assert _by(r) == {("K", "bulk_read"): (294912, 589824, 18432), ("L", "write"): (384, 1536, 48),
                      ("O", "write"): (49152, 98304, 3072), ("Q", "read"): (49152, 98304, 3072),
                      ("V", "bulk_read"): (294912, 589824, 18432)}
    lsu = r.io.by_class()
    print(lsu)
    assert lsu["load"].bytes == 98304 and lsu["bulk"].bytes == 2 * 589824
    # d = 64: two warpgroups, Br = 128, Bc = 64; N = 256: Tr = 2, K and V twice each
    r64 = simulate(W(1, 1, 256, 64), "fast", "fwd")
    assert r64.io.breakdown[("K", "bulk_read")].elements == 2 * 256 * 64 and r64.agrees


def test_fwd_fp32_v1_counts_by_hand():
    # d = 64: Br = 4·rm·nw = 4·4·4 = 64, Bc = 64.  N = 128: Tr = 2.
    r = simulate(W(1, 1, 128, 64, dtype="fp32"), "fast", "fwd", kernel="fwd_fp32_v1")
    # Q: 128·64 = 8,192 floats = 32,768 B = 1,024 sectors; K, V: 2·8,192.  O by scalar stores: each
    # of the 4 stores of a row's 32 columns touches its 4 sectors: 128 rows · 8 sectors · 4 = 4,096
    # sectors for 32,768 B.  L in requests of 4 rows (16 B, one sector each): 32.
    assert _by(r) == {("K", "read"): (16384, 65536, 2048), ("L", "write"): (128, 512, 32),
                      ("O", "write"): (8192, 32768, 4096), ("Q", "read"): (8192, 32768, 1024),
                      ("V", "read"): (16384, 65536, 2048)}


def test_fwd_fp32_v2_counts_by_hand():
    # d = 64: Br = 16·nw·mt = 16·4·2 = 128, Bc = 32.  N = 200: query blocks of 128 and 72 rows,
    # key blocks 6 of 32 and one of 8.
    r = simulate(W(1, 1, 200, 64, dtype="fp32"), "fast", "fwd")
    assert list(r.io.per_launch) == ["fwd_fp32_v2"] and r.agrees
    # Q: 200·64 = 12,800 floats = 51,200 B = 1,600 sectors of data; qsplit with qfrag reads a
    # fragment tile (16 rows, 8 dims) by 4 scalar loads a lane, rows g and g + 8, dims 2t and 2t + 1:
    # each load of a warp touches one sector of 8 rows, 4 floats each: 2·1,600 = 3,200 sectors.
    # K, V by cp.async once per query block: 2·200 rows
    # ·64 = 25,600 floats, 3,200 sectors.  O through shared memory (ostage), 16 bytes a thread a
    # store: whole rows, 1,600 sectors.  L by lanes t = 0, rows g = 0..7 (32 B, one sector a
    # request): block 0 128 / 8 = 16 requests, block 1 72 / 8 = 9: 25 sectors for 200 floats.
    assert _by(r) == {("K", "read"): (25600, 102400, 3200), ("L", "write"): (200, 800, 25),
                      ("O", "write"): (12800, 51200, 1600), ("Q", "read"): (12800, 51200, 3200),
                      ("V", "read"): (25600, 102400, 3200)}
    # without qfrag (every record before it became the default): split_q reads a lane's 16-byte
    # chunk by 4 scalar loads, each load of a warp touching the 16 sectors of its 32 chunks with 2
    # floats each: 4·1,600 = 6,400 sectors; the same bytes
    r = simulate(W(1, 1, 200, 64, dtype="fp32"), "fast", "fwd", config="qfrag=false")
    assert r.io.breakdown[("Q", "read")].sectors == 6400 and r.io.breakdown[("Q", "read")].bytes == 51200
    # without ostage (every record before it became the default): the store (u, jj, f) of lane
    # (g, t) writes row g (or g + 8) at column 32u + 8t + 4f + jj: 8 rows x 4 sectors a request,
    # one float each, so one sector per float: 12,800; the same bytes
    r = simulate(W(1, 1, 200, 64, dtype="fp32"), "fast", "fwd", config="ostage=false")
    assert r.io.breakdown[("O", "write")].sectors == 12800 and r.io.breakdown[("O", "write")].bytes == 51200
    # without qsplit Q is copied by cp.async as K and V are: 1,600 sectors
    r = simulate(W(1, 1, 200, 64, dtype="fp32"), "fast", "fwd", config="qsplit=false")
    assert r.io.breakdown[("Q", "read")].sectors == 1600
    # Causal: query block 0 (rows 0..127) sees key blocks 32j <= 127, j = 0..3 (128 keys); block 1
    # (rows 128..199) all 7 (200 keys): K = (128 + 200)·64 = 20,992.
    rc = simulate(W(1, 1, 200, 64, dtype="fp32", causal=True), "fast", "fwd")
    assert rc.io.breakdown[("K", "read")].elements == 20992 == rc.io.breakdown[("V", "read")].elements
    # d = 128: Br = 16·4·1 = 64, Bc = 32; N = 128: Q 16,384 floats, 2,048 sectors of data, 4,096
    # read (8,192 without qfrag); O 2,048 sectors (16,384 without ostage); L 128 / 8 = 16 requests.
    r = simulate(W(1, 1, 128, 128, dtype="fp32"), "fast", "fwd")
    assert r.options == {} and r.io.per_launch["fwd_fp32_v2"].breakdown[("Q", "read")].sectors == 4096
    assert {k: t.sectors for k, t in r.io.breakdown.items() if k[0] in "OL"} == {("O", "write"): 2048,
                                                                                ("L", "write"): 16}
    r = simulate(W(1, 1, 128, 128, dtype="fp32"), "fast", "fwd", config={"ostage": False})
    assert r.io.breakdown[("O", "write")].sectors == 16384


def test_bf16_runs_the_fp16_schedules():
    """bf16 selects the fp16 kernels (kernels.perf.BEST) and moves the same bytes: 2-byte elements."""
    for pass_, d in (("fwd", 64), ("bwd", 64), ("bwd", 128)):
        for causal in (False, True):
            wa = W(1, 2, 200, d, kv_heads=1, causal=causal)
            wb = W(1, 2, 200, d, kv_heads=1, causal=causal, dtype="bf16")
            a, b = simulate(wa, "fast", pass_), simulate(wb, "fast", pass_)
            assert b.agrees and a.io.to_dict() == b.io.to_dict(), (pass_, d, causal)
            assert fast.variant_for(wb, pass_) == fast.variant_for(wa, pass_) == fast.best(pass_, "fp16", d)


def test_bwd_fp16_v3_counts_by_hand():
    # d = 128: bq = 64 query rows a step, bk = 128 keys a block.  B = 1, H = 2, Hkv = 1, N = 128:
    # one key block, two query blocks per head, two heads: 4 steps.  dQ by red.v2 (the default
    # from d = 112 is bulkq's bulk reductions: the next test)
    red = {"bulkq": False}
    r = simulate(W(1, 2, 128, 128, kv_heads=1), "fast", "bwd", config=red)
    assert list(r.io.per_launch) == ["flash2_bwd_preprocess", "zero_fill", "bwd_fp16_v3", "dq_to_f16"]
    assert r.agrees
    n = 2 * 128 * 128  # Q-shaped elements of both heads: 32,768
    assert _by(r, "flash2_bwd_preprocess") == {("D", "write"): (256, 1024, 32), ("O", "read"): (n, 2 * n, n // 16),
                                               ("dO", "read"): (n, 2 * n, n // 16)}
    # the float32 accumulator zeroed: 32,768 floats = 131,072 B = 4,096 sectors
    assert _by(r, "zero_fill") == {("dQacc", "write"): (n, 4 * n, n // 8)}
    # K, V once (16,384 halves); per step Q_i, dO_i (4 steps · 64 rows · 128 = n), L_i, D_i (256
    # floats, requests of 32 rows = 128 B: 8 requests, 4 sectors each); dQ_i reduced into dQacc
    # (n floats, 4,096 sectors); dK, dV once.
    kv = 128 * 128
    assert _by(r, "bwd_fp16_v3") == {
        ("D", "read"): (256, 1024, 32), ("K", "read"): (kv, 2 * kv, kv // 16), ("L", "read"): (256, 1024, 32),
        ("Q", "read"): (n, 2 * n, n // 16), ("V", "read"): (kv, 2 * kv, kv // 16),
        ("dK", "write"): (kv, 2 * kv, kv // 16), ("dO", "read"): (n, 2 * n, n // 16),
        ("dQacc", "reduction"): (n, 4 * n, n // 8), ("dV", "write"): (kv, 2 * kv, kv // 16)}
    assert _by(r, "dq_to_f16") == {("dQ", "write"): (n, 2 * n, n // 16), ("dQacc", "read"): (n, 4 * n, n // 8)}
    # reductions are their own class: not in the LSU totals
    assert r.io.by_class()["reduction"].bytes == 4 * n
    assert r.io.read_bytes == sum(t.bytes for (_, k), t in r.io.breakdown.items() if k == "read")
    # Causal, H = Hkv = 1, N = 256: key block 0 is seen by the 4 query blocks (256 rows), key block
    # 1 (keys 128..255) by the blocks from row 128 on, i0 = 128 // 64 = 2 (128 rows): 384·128.
    rc = simulate(W(1, 1, 256, 128, causal=True), "fast", "bwd", config=red)
    assert rc.io.breakdown[("Q", "read")].elements == 384 * 128 == rc.io.breakdown[("dQacc", "reduction")].elements
    # d = 64 (the 128 x 128 block), dQ by red.v2 (bulk reductions are its default since 2026-11-28).
    # B = H = 1, N = 256: two key blocks, each reading all 256 query rows of Q, dO, L, D and reducing
    # into all of dQacc; K, V, dK, dV once.
    r64 = simulate(W(1, 1, 256, 64), "fast", "bwd", config=red)
    assert list(r64.io.per_launch) == ["flash2_bwd_preprocess", "zero_fill", "bwd_fp16_v3", "dq_to_f16"]
    m = 256 * 64
    assert _by(r64, "bwd_fp16_v3") == {
        ("D", "read"): (512, 2048, 64), ("K", "read"): (m, 2 * m, m // 16), ("L", "read"): (512, 2048, 64),
        ("Q", "read"): (2 * m, 4 * m, m // 8), ("V", "read"): (m, 2 * m, m // 16),
        ("dK", "write"): (m, 2 * m, m // 16), ("dO", "read"): (2 * m, 4 * m, m // 8),
        ("dQacc", "reduction"): (2 * m, 8 * m, m // 4), ("dV", "write"): (m, 2 * m, m // 16)}


def test_bwd_fp16_v3_bulkq_moves_dq_to_the_bulk_class():
    # bulkq: the same rows of dQacc, reduced by the TMA unit (class "bulk", a write): B = 1, H = 2,
    # Hkv = 1, N = 128, d = 128 as above, 32,768 floats; nothing else changes
    w = W(1, 2, 128, 128, kv_heads=1)
    r, rb = simulate(w, "fast", "bwd", config={"bulkq": False}), simulate(w, "fast", "bwd", config={"bulkq": True})
    assert rb.agrees and fast.parse_config("bwd_fp16_v3", 128, {})["bulkq"]  # the default from d = 112
    n = 2 * 128 * 128
    assert _by(rb, "bwd_fp16_v3")[("dQacc", "bulk_write")] == (n, 4 * n, n // 8)
    assert ("dQacc", "reduction") not in _by(rb, "bwd_fp16_v3")
    assert rb.io.by_class()["bulk"].bytes == 4 * n and rb.io.by_class()["reduction"].bytes == 0
    others = {k: v for k, v in _by(r, "bwd_fp16_v3").items() if k != ("dQacc", "reduction")}
    assert {k: v for k, v in _by(rb, "bwd_fp16_v3").items() if k != ("dQacc", "bulk_write")} == others
    from kernels.perf import bwd_fp16  # the launcher's shared memory, restated by flashsim

    with_tile = fast.block_resources("bwd_fp16_v3", 128, {"bulkq": True})["dkdv"][1]
    assert with_tile == fast.block_resources("bwd_fp16_v3", 128, {"bulkq": False})["dkdv"][1] + 4 * 64 * 136
    assert with_tile == bwd_fp16.smem_bytes_v3(128, 64, 128, True)


def test_bwd_fp16_v1_counts_by_hand():
    # d = 64: dK/dV kernel 16·nw·mt = 64 keys a block, bq = 64 query rows a step; dQ kernel 64 query
    # rows a block, bk = 64 keys a step.  B = H = 1, N = 128: 2 blocks each way.
    r = simulate(W(1, 1, 128, 64), "fast", "bwd", kernel="bwd_fp16_v1")
    assert list(r.io.per_launch) == ["flash2_bwd_preprocess", "bwd_fp16_v1_dkdv", "bwd_fp16_v1_dq"]
    n = 128 * 64
    # dK/dV: Q, dO once per key block (2·n); L, D 2·128 floats in requests of 32 rows (4 sectors).
    assert _by(r, "bwd_fp16_v1_dkdv") == {
        ("D", "read"): (256, 1024, 32), ("K", "read"): (n, 2 * n, n // 16), ("L", "read"): (256, 1024, 32),
        ("Q", "read"): (2 * n, 4 * n, n // 8), ("V", "read"): (n, 2 * n, n // 16),
        ("dK", "write"): (n, 2 * n, n // 16), ("dO", "read"): (2 * n, 4 * n, n // 8),
        ("dV", "write"): (n, 2 * n, n // 16)}
    # dQ: Q, dO once; L, D 128 floats in requests of 8 rows (one sector each: 16); K, V per query block.
    assert _by(r, "bwd_fp16_v1_dq") == {
        ("D", "read"): (128, 512, 16), ("K", "read"): (2 * n, 4 * n, n // 8), ("L", "read"): (128, 512, 16),
        ("Q", "read"): (n, 2 * n, n // 16), ("V", "read"): (2 * n, 4 * n, n // 8),
        ("dO", "read"): (n, 2 * n, n // 16), ("dQ", "write"): (n, 2 * n, n // 16)}


def test_bwd_fp32_counts_by_hand():
    # bwd_fp32_v2 at d = 64: 64 keys a block, 64 query rows a step; N = 128: 2 x 2 steps.  The
    # atomics add into dQ itself, zeroed first; no conversion launch.
    r = simulate(W(1, 1, 128, 64, dtype="fp32"), "fast", "bwd")
    assert list(r.io.per_launch) == ["flash2_bwd_preprocess", "zero_fill", "bwd_fp32_v2"]
    assert r.io.per_launch["zero_fill"].elements_by_key() == {("dQ", "write"): 8192}
    # L, D: every step's 64 rows by each of the 2 warps along the keys (WA = 2), 4 rows 2 apart a
    # request, in one sector: 2 key blocks · 2 steps · 2 warps · 64 = 512 floats in 128 requests.
    # dQ: red.v4 of 16 bytes, each in its own sector: 2·2·64·64 floats = 65,536 B = 4,096 sectors.
    # dK, dV: one element a sector: 8,192 each.
    assert _by(r, "bwd_fp32_v2") == {
        ("D", "read"): (512, 2048, 128), ("K", "read"): (8192, 32768, 1024), ("L", "read"): (512, 2048, 128),
        ("Q", "read"): (16384, 65536, 2048), ("V", "read"): (8192, 32768, 1024), ("dK", "write"): (8192, 32768, 8192),
        ("dO", "read"): (16384, 65536, 2048), ("dQ", "reduction"): (16384, 65536, 4096),
        ("dV", "write"): (8192, 32768, 8192)}
    # bwd_fp32_v1 at d = 64 (one warp along the keys): L, D 4 rows a request (256 floats, 64
    # sectors); dQ by red.v4 over a row's 32 columns (128 B, 4 sectors); dK, dV by scalar stores,
    # each sector 4 times: 8,192 floats = 1,024 sectors of data, 4,096 counted.
    r1 = simulate(W(1, 1, 128, 64, dtype="fp32"), "fast", "bwd", kernel="bwd_fp32_v1")
    assert _by(r1, "bwd_fp32_v1") == {
        ("D", "read"): (256, 1024, 64), ("K", "read"): (8192, 32768, 1024), ("L", "read"): (256, 1024, 64),
        ("Q", "read"): (16384, 65536, 2048), ("V", "read"): (8192, 32768, 1024), ("dK", "write"): (8192, 32768, 4096),
        ("dO", "read"): (16384, 65536, 2048), ("dQ", "reduction"): (16384, 65536, 2048),
        ("dV", "write"): (8192, 32768, 4096)}
    assert simulate(W(1, 1, 128, 64, dtype="fp32"), "fast", "bwd").options == {}


# ---------------------------------------------------------------------------------------------
# Walker == closed form


@st.composite
def _workloads(draw):
    name = draw(st.sampled_from(sorted(fast.VARIANTS)))
    pass_ = fast.VARIANTS[name][0]
    dtype = draw(st.sampled_from(fast.DTYPES[name]))
    d = draw(st.sampled_from([d for d in (16, 32, 40, 64, 72, 96, 128, 200) if fast.supports(name, dtype, d)]))
    hkv = draw(st.sampled_from([1, 2]))
    w = W(draw(st.integers(1, 2)), hkv * draw(st.sampled_from([1, 2])), draw(st.integers(1, 700)), d,
                 seq_len_k=draw(st.integers(1, 700)), kv_heads=hkv, dtype=dtype, causal=draw(st.booleans()))
    return w, pass_, name


@settings(max_examples=40, deadline=None)
@given(_workloads())
# dQ by bulk reductions, bwd_fp16_v3's default from d = 112 (the closed form had kept them reductions)
@example((W(1, 2, 300, 200, seq_len_k=200, kv_heads=1, causal=True), "bwd", "bwd_fp16_v3"))
@example((W(1, 1, 130, 112), "bwd", "bwd_fp16_v3"))
def test_walker_equals_closed_form(c):
    w, pass_, name = c
    r = simulate(w, "fast", pass_, kernel=name)
    print(name, w, r.io.elements_by_key(), r.closed_form.elements_by_key())
    assert r.agrees
    assert walk(build_schedule(w, "fast", pass_, kernel=name), ordered=True).to_dict() == r.io.to_dict()


# ---------------------------------------------------------------------------------------------
# Cross-check against the kernels under the CUDA simulator


#: small block shapes, so that the simulator runs each variant in about a second
SMALL = {"fwd_fp16_v4": dict(nw=1, mt=1, bc=16), "fwd_fp16_v5": dict(nw=4, bc=16),
         "fwd_fp16_v7": dict(nw=4, bc=16),
         "fwd_fp32_v1": dict(nw=1, rm=1, bc=16), "fwd_fp32_v2": dict(nw=1, mt=1, bc=16),
         "bwd_fp16_v1": dict(bq=16, bk=16, nw=1, mt=1), "bwd_fp16_v3": dict(bq=16, bk=16, nw=1, ma=1, mb=1, mc=1),
         "bwd_fp32_v1": dict(bc=128, br=32, nw=2), "bwd_fp32_v2": dict(bc=32, br=16, nw=2)}
#: kernel parameter -> schedule tensor
PARAM = {"q": "Q", "k": "K", "v": "V", "o": "O", "lse": "L", "do": "dO", "dvec": "D", "dq": "dQ", "dk": "dK",
         "dv": "dV", "dqa": "dQacc", "src": "dQacc", "dst": "dQ"}


@pytest.mark.parametrize("name,d,h,config", [
    ("fwd_fp16_v4", 24, 2, None), ("fwd_fp16_v5", 64, 2, None), ("fwd_fp16_v7", 72, 2, None),
    ("fwd_fp32_v1", 12, 2, None),
    ("fwd_fp32_v2", 32, 2, None), ("fwd_fp32_v2", 32, 1, dict(nw=1, mt=2, bc=16, qsplit=False, ostage=False)),
    ("fwd_fp32_v2", 40, 2, dict(nw=1, mt=1, bc=16, qfrag=False)),
    ("bwd_fp16_v1", 16, 2, None), ("bwd_fp16_v3", 32, 2, None), ("bwd_fp32_v1", 8, 2, None),
    ("bwd_fp32_v2", 64, 1, None), ("bwd_fp32_v2", 12, 2, dict(bc=16, br=16, nw=1))])
def test_elements_equal_the_kernels_under_the_simulator(name, d, h, config):
    """Every launch touches, per tensor, the elements its schedule counts (ragged blocks: N = 21
    and 19 with blocks of 16 or 32; causal; two query heads on one kv head, but for bwd_fp32_v2
    at d = 64, the simulator's slowest; bwd_fp32_v2 at d = 12 too, padded to 32, where dQ's
    second red.v4 of a lane falls past d).  Threads that read
    one address together (a broadcast of L or D to a quad or a lane group) count once; every
    other element is touched by one thread once, so no tile is loaded twice by a block.
    fwd_fp32_v2's scalar loads of Q (qsplit; a fragment tile at a time with ``qfrag``, 16-byte
    chunks without) and stores of L, and of O without ``ostage``: the
    sectors of each warp request, from the lanes' addresses (tests/_fast_trace.py), equal the
    schedule's (with ``ostage`` O goes by 16-byte stores of whole sectors, which the simulator's
    twin writes a float at a time: its elements are checked, as the fp16 forwards' are).  fwd_fp16_v7's K
    and V come by the TMA unit (the schedule's class "bulk"), which the trace of the kernel's own
    array accesses does not see: none of K or V is touched by a thread."""
    from kernels.perf import variant

    pass_, dtype = fast.VARIANTS[name]
    dt = FP[dtype]
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, h, 21, d)).astype(dt)
    k, v = (rng.standard_normal((1, 1, 19, d)).astype(dt) for _ in range(2))
    vv = variant(name)
    config = SMALL[name] if config is None else config
    if pass_ == "fwd":
        with trace() as got:
            vv.forward(q, k, v, causal=True, **config)
    else:
        from kernels.reference import attention_forward  # O and L in float64: no simulated forward

        o, lse = attention_forward(q, k, v, causal=True)
        o, lse = o.astype(dt), lse.astype(np.float32)
        do = rng.standard_normal(q.shape).astype(dt)
        with trace() as got:
            vv.backward(q, k, v, o, lse, do, causal=True, **config)
    w = W(1, h, 21, d, seq_len_k=19, kv_heads=1, dtype=dtype, causal=True)
    io = simulate(w, "fast", pass_, kernel=name, config=config).io
    assert len(got) == len(io.per_launch)
    for (kname, total, distinct, requests), (lname, c) in zip(got, io.per_launch.items(), strict=True):
        if name == "fwd_fp32_v2":  # scalar ld/st by every lane alike: each request's sectors
            scalar = {"L": ("lse", "write")}
            if config.get("qsplit", True):
                scalar["Q"] = ("q", "read")
            if not config.get("ostage", True):
                scalar["O"] = ("o", "write")
            got_sec = {t: requests[key] for t, key in scalar.items()}
            want_sec = {t: c.breakdown[(t, key[1])].sectors for t, key in scalar.items()}
            print(lname, "sectors of the requests", got_sec, "schedule", want_sec)
            assert got_sec == want_sec
        acc = "dQacc" if name == "bwd_fp16_v3" else "dQ"
        seen = {}
        for (param, what), n in distinct.items():
            tensor = acc if param == "a" else PARAM[param]
            seen[(tensor, what)] = n
        want = {}
        for (tensor, key), n in c.elements_by_key().items():
            if key == "bulk_read":  # the TMA unit's copies, not the threads'
                continue
            if key == "reduction":  # the twin reads and writes each element reduced once
                want[(tensor, "read")] = want.get((tensor, "read"), 0) + n
                want[(tensor, "write")] = want.get((tensor, "write"), 0) + n
            else:
                want[(tensor, key)] = want.get((tensor, key), 0) + n
        # L and D: the schedule counts what each request asks for (every warp along the keys of
        # the fp32 backwards' first product reads them: fast.key_warps); the lanes of a request
        # that read one address (a quad, a lane group of 8) are one read.
        lanes = {"bwd_fp16_v1_dq": 4, "bwd_fp32_v1": 8, "bwd_fp32_v2": 8}.get(lname, 1)
        for tensor, param in (("L", "lse"), ("D", "dvec")):
            if (tensor, "read") in want:
                print(lname, tensor, total[(param, "read")], lanes, want[(tensor, "read")])
                assert total[(param, "read")] == lanes * want[(tensor, "read")], (lname, tensor)
                assert seen.pop((tensor, "read")) * fast.key_warps(name, d, config) == want.pop((tensor, "read"))
        print(name, lname, kname, seen, want)
        assert seen == want, (lname, kname)
        for (param, what), n in total.items():
            if param not in ("lse", "dvec"):
                assert n == distinct[(param, what)], (lname, param, what)


def test_split_kv_counts_by_hand():
    """fwd_fp16_v7 with splits = 3 (B = 1, 2 query heads on 1 kv head, Nq = 70, Nk = 50, d = 40,
    causal, Br = 64, Bc = 16).  Main launch: Q read by all 3 splits, 3·2·70·40 = 16,800; K, V by the
    TMA unit, each visible (query block, key block) pair once as unsplit: query block 0 sees 3 key
    blocks (48 rows), block 1 all 4 (50): 98·40·2 = 7,840; Op written 3·2·70·40 = 16,800 floats
    (rows of 160 bytes: 2,100 sectors), Lp 3·2·70 = 420.  Combine: 2,800 outputs a head in 88 warps;
    a warp reads the Lp of the rows its 32 elements span: 88 + 52 warps that cross a row (69 row
    starts, 17 of them at a warp's first element, r = 4, 8, .., 68) = 140 a head and split, 840;
    Op 16,800; O 5,600, L 140."""
    w = W(1, 2, 70, 40, seq_len_k=50, kv_heads=1, causal=True)
    r = simulate(w, "fast", "fwd", kernel="fwd_fp16_v7", config="splits=3,nw=4,bc=16")
    assert list(r.io.per_launch) == ["fwd_fp16_v7", "fwd_combine"] and r.agrees
    el = {k: v.elements for k, v in r.io.breakdown.items()}
    print(el)
    assert el == {("Q", "read"): 16800, ("K", "bulk_read"): 7840, ("V", "bulk_read"): 7840, ("Op", "write"): 16800,
                  ("Lp", "write"): 420, ("Lp", "read"): 840, ("Op", "read"): 16800, ("O", "write"): 5600,
                  ("L", "write"): 140}
    assert r.io.breakdown[("Op", "write")].sectors == 2100
    # unsplit, the same K and V; Q once; O and L from the one launch
    one = simulate(w, "fast", "fwd", kernel="fwd_fp16_v7", config="nw=4,bc=16").io.breakdown
    assert one[("K", "bulk_read")].elements == 7840 and one[("Q", "read")].elements == 16800 // 3


@pytest.mark.parametrize("kernel,nq,nk,d", [("fwd_fp16_v7", 32, 40, 64), ("fwd_fp16_v5", 70, 50, 40)])
def test_split_kv_elements_equal_the_kernels_under_the_simulator(kernel, nq, nk, d):
    """The split-KV kernels under the CUDA simulator touch the schedule's elements: the main launch
    (its o and lse are Op and Lp) reads Q and writes Op, Lp; the combine reads Op and writes O, L;
    its Lp reads, every lane of a warp instruction one per split, make the schedule's sectors: at
    d = 64 an instruction holds half a row, at d = 40 (Nq·d = 2,800: a partial last block and
    instruction) 32 elements that cross a row in 52 of a head's 88 instructions, so a request
    spans two rows there.  The combine's instructions are told apart by the element each lane's Op
    load names (thread t of block x loads elements 1,024x + 256k + t, its Lp load beside each):
    the trace's pairing of each lane's k-th access would misalign where lanes past Nq·d skip an
    output."""
    from kernels.perf import variant

    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 2, nq, d)).astype(np.float16)
    k, v = (rng.standard_normal((1, 1, nk, d)).astype(np.float16) for _ in range(2))
    config = dict(splits=3, nw=4, bc=16)
    with trace() as got:
        variant(kernel).forward(q, k, v, causal=True, **config)
    w = W(1, 2, nq, d, seq_len_k=nk, kv_heads=1, causal=True)
    io = simulate(w, "fast", "fwd", kernel=kernel, config=config).io
    (_, _, main, _), (_, _, comb, req) = got
    lm, lc = (c.breakdown for c in io.per_launch.values())
    print(main, comb, req)
    assert main[("q", "read")] == lm[("Q", "read")].elements
    assert main[("o", "write")] == lm[("Op", "write")].elements
    assert main[("lse", "write")] == lm[("Lp", "write")].elements
    assert comb[("op", "read")] == lc[("Op", "read")].elements
    assert comb[("o", "write")] == lc[("O", "write")].elements and comb[("lse", "write")] == lc[("L", "write")].elements
    # a combine instruction: (block, warp, slice z·B·H + p, k), from the element its Op load names
    n, span = nq * d, fast.COMBINE_THREADS * fast.COMBINE_ELEMS
    seq, lp_sec, op_sec = got.sequences[1], {}, {}
    for (block, tid, nm, what), offs in seq.items():
        if (nm, what) != ("op", "read"):
            continue
        lps = seq[(block, tid, "lp", "read")]
        assert len(lps) == len(offs)  # an Lp load beside each Op load
        for op_off, lp_off in zip(offs, lps):
            zp, e = divmod(op_off // 4, n)
            key = (block, tid // 32, zp, e % span // fast.COMBINE_THREADS)
            lp_sec.setdefault(key, set()).add(lp_off // 32)
            op_sec.setdefault(key, set()).add(op_off // 32)
    print("instructions", len(lp_sec), "Lp sectors", sum(map(len, lp_sec.values())))
    assert sum(map(len, lp_sec.values())) == lc[("Lp", "read")].sectors
    assert sum(map(len, op_sec.values())) == lc[("Op", "read")].sectors
