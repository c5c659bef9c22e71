"""Schedules of PyTorch's attention kernels (issue 15): hand-derived counts for small cases, the
walker against the closed form, the grouped counts against the loop-order stream."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashsim import Workload
from flashsim.algorithms.torch_naive import received_read_sectors
from flashsim.api import build_schedule, closed_form_elements, simulate
from flashsim.traffic import Traffic, walk


def wl(n, d, heads=1, kv=None, causal=False, dtype="fp16", nk=None, batch=1):
    return Workload(batch=batch, heads=heads, kv_heads=kv, seq_len_q=n, seq_len_k=nk, head_dim=d, dtype=dtype,
                    causal=causal)


def key(io, launch=None):
    c = io if launch is None else io.per_launch[launch]
    return {k: (t.elements, t.sectors) for k, t in sorted(c.breakdown.items())}


# --------------------------------------------------------------------------------------------
# torch_flash: forward


def test_flash_fwd_dense_by_hand():
    # d = 64 on sm_90: Bm = Bn = 128.  N = 256, 2 heads: Tm = Tn = 2.  Per head: Q 256 rows x 64
    # fp16 (128-byte rows, 4 sectors each) once: 16,384 elements, 1,024 sectors; K and V: both
    # query blocks load both key blocks, 2 x 256 rows: 32,768 elements, 2,048 sectors; O as Q;
    # LSE: 256 floats in 8-row groups of 32 bytes, 1 sector each: 32 sectors.
    io = simulate(wl(256, 64, heads=2), "torch_flash", "fwd").io
    assert key(io) == {("K", "read"): (2 * 32768, 2 * 2048), ("L", "write"): (2 * 256, 2 * 32),
                       ("O", "write"): (2 * 16384, 2 * 1024), ("Q", "read"): (2 * 16384, 2 * 1024),
                       ("V", "read"): (2 * 32768, 2 * 2048)}


def test_flash_fwd_causal_by_hand():
    # causal, N = 256: query block 0 loads key blocks 0 .. ⌈(128 + 0)/128⌉ - 1 = 0, block 1 loads
    # ⌈256/128⌉ = 2 blocks: 128 + 256 = 384 key rows = 24,576 elements per head.
    res = simulate(wl(256, 64, causal=True), "torch_flash", "fwd")
    assert res.io.breakdown[("K", "read")] == Traffic(24576, 49152, 1536)
    assert res.agrees


def test_flash_fwd_lse_groups_unaligned():
    # d = 128: Bm = 128, Bn = 64.  N = 196, 2 heads: LSE rows are 784 bytes, so head 1's start at
    # byte 784 = 16 mod 32.  Each warp's store writes 8 rows (32 bytes): head 0's 25 groups (16 of
    # block 0; block 1 holds 68 rows: 8 full groups and one of 4) are 1 sector each; head 1's 24
    # full groups straddle 2 sectors each (48) and its 4-row group (16 bytes at offset 16) 1: 74 in
    # all, where the coalesced rows would be 25 + 25 = 50.  (sms=1: with 132 SMs mha_fwd would
    # split the keys of so small a workload.)
    io = simulate(wl(196, 128, heads=2), "torch_flash", "fwd", sms=1).io
    assert io.breakdown[("L", "write")] == Traffic(392, 1568, 74)


# --------------------------------------------------------------------------------------------
# torch_flash: backward


def test_flash_bwd_dense_by_hand():
    # d = 64: backward Bm = Bn = 128, 8 warps, AtomLayoutMSdP 4 (so 2 warps request each LSE/D
    # row).  N = 256, one head: Tm = Tn = 2, dq_accum rows 256 (rounded to 128) of 64 fp32.
    io = walk(build_schedule(wl(256, 64), "torch_flash", "bwd"))
    assert list(io.per_launch) == ["contiguous_dO", "contiguous_O", "flash_bwd_dot_do_o", "flash_bwd_dq_dk_dv",
                                   "flash_bwd_convert_dq"]
    # the copies: 16,384 elements (1,024 sectors) in and out
    assert key(io, "contiguous_dO") == {("dO", "read"): (16384, 1024), ("dO_t", "write"): (16384, 1024)}
    # dot(dO, O): both tiles in; D stored by 4-row groups (16 bytes, 1 sector each): 64 requests
    # of 4 rows for 256 rows; dq_accum zeroed: 256 x 64 fp32 = 65,536 bytes = 2,048 sectors
    assert key(io, "flash_bwd_dot_do_o") == {("D", "write"): (256, 64), ("O_t", "read"): (16384, 1024),
                                             ("dO_t", "read"): (16384, 1024), ("dQaccum", "write"): (16384, 2048)}
    # main: K, V once per key block (256 rows); each of the 2 key blocks visits both query blocks:
    # Q and dO_t 512 rows (32,768 elements, 2,048 sectors); LSE and D: 4 block visits x 16 groups
    # of 8 rows x 2 warps = 128 requests of 1 sector, 4 x 128 x 2 = 1,024 elements; dQ atomics:
    # 4 x 128 rows x 64 fp32 = 32,768 elements = 131,072 bytes = 4,096 sectors
    assert key(io, "flash_bwd_dq_dk_dv") == {
        ("D", "read"): (1024, 128), ("K", "read"): (16384, 1024), ("L", "read"): (1024, 128),
        ("Q", "read"): (32768, 2048), ("V", "read"): (16384, 1024), ("dK", "write"): (16384, 1024),
        ("dO_t", "read"): (32768, 2048), ("dQaccum", "reduction"): (32768, 4096), ("dV", "write"): (16384, 1024)}
    assert key(io, "flash_bwd_convert_dq") == {("dQ", "write"): (16384, 1024), ("dQaccum", "read"): (16384, 2048)}
    cls = io.per_launch["flash_bwd_dq_dk_dv"].by_class()
    assert cls["reduction"] == Traffic(32768, 131072, 4096) and cls["bulk"] == Traffic(0, 0, 0)


def test_flash_bwd_causal_and_gqa_by_hand():
    # causal, N = 256, d = 64: key block 0 visits query blocks from ⌊(0 + 0)/128⌋ = 0, key block 1
    # from ⌊128/128⌋ = 1: query block 0 is visited once, block 1 twice: 384 Q rows, 3 x 128 x 64
    # dQ reductions.
    io = walk(build_schedule(wl(256, 64, causal=True), "torch_flash", "bwd"))
    assert io.breakdown[("Q", "read")].elements == 384 * 64
    assert io.breakdown[("dQaccum", "reduction")].elements == 3 * 128 * 64
    # GQA 4 query heads on 2 kv heads, N = 128, d = 128 (Bm = 64, Bn = 128, 4 warps per LSE row):
    # every query head's program loads its kv head's K (4 x 128 x 128); dK_exp per query head,
    # then sum_out reads it (65,536) and writes dK (2 x 128 x 128 = 32,768) one element per store
    io = walk(build_schedule(wl(128, 128, heads=4, kv=2), "torch_flash", "bwd"))
    assert list(io.per_launch)[-2:] == ["sum_dK", "sum_dV"]
    # (its stores one element at a time, 4 outputs a thread: 4 x the 2,048 sectors of dK)
    assert key(io, "sum_dK") == {("dK_vec", "write"): (32768, 8192), ("dK_exp", "read"): (65536, 4096)}
    assert io.per_launch["flash_bwd_dq_dk_dv"].breakdown[("K", "read")].elements == 65536
    # LSE: 2 query blocks x 8 groups x 4 warps, each 8 rows: 512 elements, 64 requests of 1 sector
    assert io.per_launch["flash_bwd_dq_dk_dv"].breakdown[("L", "read")] == Traffic(4 * 512, 4 * 2048, 4 * 64)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), nk=st.integers(1, 300), d=st.sampled_from([32, 64, 96, 128]),
       group=st.sampled_from([1, 2]), causal=st.booleans(), dtype=st.sampled_from(["fp16", "bf16"]),
       pass_=st.sampled_from(["fwd", "bwd"]))
def test_flash_walker_equals_closed_form(n, nk, d, group, causal, dtype, pass_):
    if causal and n > nk:
        n, nk = nk, n
    w = wl(n, d, heads=2 * group, kv=2, causal=causal, dtype=dtype, nk=nk)
    sched = build_schedule(w, "torch_flash", pass_, sms=1)  # one SM: never the split-KV kernels
    io = walk(sched)
    print(n, nk, d, group, causal, pass_, io.elements_by_key())
    want = closed_form_elements(w, "torch_flash", pass_, sms=1)
    assert io.elements_by_key() == {k: v for k, v in want.items() if v}
    assert walk(sched, ordered=True).breakdown == io.breakdown


def test_flash_refusals():
    with pytest.raises(ValueError, match="dtype"):
        build_schedule(wl(256, 64, dtype="fp32"), "torch_flash", "fwd")
    with pytest.raises(ValueError, match="head_dim"):
        build_schedule(wl(256, 80), "torch_flash", "fwd")
    with pytest.raises(ValueError, match="split-KV"):  # 1 x 1 x 1 query block of 64 rows, N = 4,096
        build_schedule(wl(64, 64, nk=4096), "torch_flash", "fwd")
    with pytest.raises(ValueError, match="causal"):
        build_schedule(wl(256, 64, nk=128, causal=True), "torch_flash", "fwd")
    with pytest.raises(ValueError, match="sms"):
        build_schedule(wl(256, 64), "torch_flash", "fwd", sms=0)


# --------------------------------------------------------------------------------------------
# torch_naive


def test_naive_fwd_by_hand():
    # N = 256, d = 64, fp16, one head; cuBLAS tile "128x256" = 128 columns x 256 rows of C.
    io = walk(build_schedule(wl(256, 64), "torch_naive", "fwd", gemm_tiles="128x256"))
    assert list(io.per_launch) == ["scale", "gemm_qk", "softmax", "gemm_pv"]
    # scale: Q in, Qs out, 16,384 elements (128-byte rows: 1,024 sectors) each
    assert key(io, "scale") == {("Q", "read"): (16384, 1024), ("Qs", "write"): (16384, 1024)}
    # S = Qs Kᵀ (256 x 256): one band of 256 rows, two of 128 columns: Qs read twice (TMA: bulk),
    # K once, S written once (256 rows x 2 tiles x 256 bytes = 8 sectors each: 4,096)
    assert key(io, "gemm_qk") == {("K", "bulk_read"): (16384, 1024), ("Qs", "bulk_read"): (32768, 2048),
                                  ("S", "bulk_write"): (65536, 4096)}
    assert io.per_launch["gemm_qk"].sectors == 0  # nothing at the LSU level
    assert key(io, "softmax") == {("P", "write"): (65536, 4096), ("S", "read"): (65536, 4096)}
    # O = P V (256 x 64): one tile; P and V read once
    assert key(io, "gemm_pv") == {("O", "bulk_write"): (16384, 1024), ("P", "bulk_read"): (65536, 4096),
                                  ("V", "bulk_read"): (16384, 1024)}


def test_naive_causal_mask_by_hand():
    # 2 heads, N = 512, fp16.  ones: 512 x 512 booleans once (8,192 sectors).  tril(0): a row is 64
    # chunks of 8 bytes, two warps; thread t loads its chunk, one byte per step for 8 steps, when
    # 8t <= r: a_r = ⌊r/8⌋ + 1 threads (each a = 1 .. 64 for 8 rows), 8·a_r bytes, Σ_r =
    # 8·8·(1 + ... + 64) = 133,120; a step of a warp piece of n threads spans 8n bytes from an
    # aligned start: ⌈n/4⌉ sectors, 8 steps, pieces min(a, 32) and a - 32: Σ_a (⌈min(a,32)/4⌉ +
    # ⌈max(a-32,0)/4⌉) = 144 + (32·8 + 144) = 544, x 8 rows x 8 steps = 34,816 sectors.  Its stores:
    # every thread, 8 steps of 8 sectors a warp, 128 a row: 65,536 sectors for 262,144 bytes (8x).
    # masked_fill_ of the clone Sm (the clone a memcpy, no launch), elementwise_kernel<128, 4>: a
    # block of 512 elements is one row here; its iterations 0-2 (columns 0-383) load Sm whatever
    # the mask, 24 sectors a row: 196,608 elements, 12,288 sectors a head; iteration 3 (columns
    # 384-511) only where kept (col <= r): rows 384 .. 511 load 1 .. 128 elements from an aligned
    # start, Σ = 8,256 elements, Σ ⌈n/16⌉ = 16·(1 + ... + 8) = 576 sectors.  The mask is read per
    # head; Sm written whole.
    io = walk(build_schedule(wl(512, 64, heads=2, causal=True), "torch_naive", "fwd"))
    names = list(io.per_launch)
    assert names == ["scale", "gemm_qk", "mask_ones", "mask_tril", "mask_not", "masked_fill", "softmax", "gemm_pv"]
    assert key(io, "mask_ones") == {("Mask1", "write"): (262144, 8192)}
    assert key(io, "mask_tril") == {("Mask", "write"): (262144, 65536), ("Mask1", "read"): (133120, 34816)}
    assert key(io, "masked_fill") == {("NotMask", "read"): (2 * 262144, 2 * 8192),
                                      ("Sm", "read"): (2 * (196608 + 8256), 2 * (12288 + 576)),
                                      ("Sm", "write"): (2 * 262144, 2 * 16384)}
    with pytest.raises(ValueError, match="seq_len_k=256.*multiple of 512"):
        build_schedule(wl(256, 64, causal=True), "torch_naive", "fwd")
    build_schedule(wl(256, 64, causal=True, dtype="fp32", nk=256), "torch_naive", "fwd")  # fp32: 2 a thread


def test_naive_bwd_by_hand():
    # N = 256, d = 64, fp32 (LSU GEMMs), default tiles 128 x 128.
    io = walk(build_schedule(wl(256, 64, dtype="fp32"), "torch_naive", "bwd"))
    # autograd's order (the H100 record's): each matmul's second operand's gradient first
    assert list(io.per_launch) == ["gemm_dv", "gemm_dp", "softmax_mul", "softmax_bwd", "gemm_dk", "gemm_dq",
                                   "scale_bwd"]
    el = {n: {k: v[0] for k, v in key(io, n).items()} for n in io.per_launch}
    # dP = dO Vᵀ: 2 x 2 tiles, dO and V read twice each
    assert el["gemm_dp"] == {("dO", "read"): 32768, ("V", "read"): 32768, ("dP", "write"): 65536}
    # dV = Pᵀ dO (256 x 64): two row bands of 128 columns of P, one column band: P once, dO twice
    assert el["gemm_dv"] == {("P", "read"): 65536, ("dO", "read"): 32768, ("dV", "write"): 16384}
    # the softmax backward: T = dP ∘ P, then dS from T and P
    assert el["softmax_mul"] == {("P", "read"): 65536, ("dP", "read"): 65536, ("T", "write"): 65536}
    assert el["softmax_bwd"] == {("P", "read"): 65536, ("T", "read"): 65536, ("dS", "write"): 65536}
    # dKᵀ = Qsᵀ dS (64 x 256): one row band, two column bands: Qs twice, dS once
    assert el["gemm_dk"] == {("Qs", "read"): 32768, ("dS", "read"): 65536, ("dKT", "write"): 16384}
    assert el["scale_bwd"] == {("dQs", "read"): 16384, ("dQ", "write"): 16384}
    # fp32 rows of 256 bytes: 8 sectors each, dP's tiles of 128 columns 16 sectors a row
    assert io.per_launch["gemm_dp"].breakdown[("dP", "write")].sectors == 256 * 2 * 16


def test_naive_gemm_clusters_by_hand():
    # N = 1,024, d = 64, fp16, one head, as the H100 record runs it: O = P V with nvjet's tile
    # 64x128 (64 columns = d, 128 rows: 8 row tiles) in clusters of 1x2 (2 tiles along the rows):
    # V's band (its 64 columns, all 1,024 rows: 65,536 elements) is shared by the 8 row tiles and
    # multicast to each cluster's 2, so read 8/2 = 4 times; P's row bands once each.  S = Qs Kᵀ
    # with 128x256 in 2x1 clusters: 8 column tiles x 4 row tiles; Qs's 256-row bands shared by
    # the 2 column tiles of a cluster (read 8/2 = 4 times), K's 128-row bands by none (4 times).
    io = walk(build_schedule(wl(1024, 64), "torch_naive", "fwd", gemm_tiles="128x256,64x128",
                             gemm_clusters="2x1,1x2"))
    el = {k: v[0] for k, v in key(io, "gemm_pv").items()}
    assert el == {("P", "bulk_read"): 1024 * 1024, ("V", "bulk_read"): 4 * 65536, ("O", "bulk_write"): 65536}
    el = {k: v[0] for k, v in key(io, "gemm_qk").items()}
    assert el == {("Qs", "bulk_read"): 4 * 65536, ("K", "bulk_read"): 4 * 65536, ("S", "bulk_write"): 1024 * 1024}
    # a partial cluster at the edge still reads once: 3 column tiles in clusters of 2 -> 2 reads
    io = walk(build_schedule(wl(64, 64, nk=384), "torch_naive", "fwd", gemm_tiles="128x64", gemm_clusters="2x1"))
    assert io.per_launch["gemm_qk"].breakdown[("Qs", "bulk_read")].elements == 2 * 64 * 64
    with pytest.raises(ValueError, match="gemm_clusters"):
        build_schedule(wl(256, 64), "torch_naive", "fwd", gemm_clusters="2")


def test_naive_received_boxes_by_hand():
    # O = P V at N = 1,024, d = 64, fp16, B·H = 2, nvjet 64x24 in 1x4 clusters (H200 torch_tma):
    # 43 row tiles of 24 (the last 16 rows), padded to 44 CTAs a head (11 clusters of 4); each
    # receives a whole box of P (24 rows x 2,048 bytes: 1,536 sectors) and V's band (1,024 rows x
    # 128 bytes: 4,096): 2 x 44 x 5,632 = 495,616, the measured count; the multicast model reads
    # V once a cluster, the per-CTA walker counts the edge tile's 16 rows and no padding CTA
    w = wl(1024, 64, heads=2)
    got = received_read_sectors(w, "fwd", gemm_tiles="128x128,64x24", gemm_clusters="2x1,1x4")
    assert got[0] is None and got[2] is None and got[3] == 2 * 44 * (24 * 64 + 1024 * 4) == 495_616
    per_cta = walk(build_schedule(w, "torch_naive", "fwd", gemm_tiles="128x128,64x24")).per_launch["gemm_pv"]
    reads = sum(t.sectors for (_, k), t in per_cta.breakdown.items() if k == "bulk_read")
    assert reads == 495_616 - 2 * (8 * 64 + 24 * 64 + 1024 * 4) == 483_328
    assert received_read_sectors(wl(1024, 64, dtype="fp32"), "fwd")[1] is None  # fp32: LSU, no boxes
    # N = 1,000 (H200 torch_edge), nvjet 64x8, K step 64, 1x2 clusters: 125 row tiles of 8 padded
    # to 126 CTAs.  P (A, read by each CTA itself): rows of 2,000 bytes, so a box row of 128 bytes
    # spans 4 sectors on even rows and 5 on odd ones (16 bytes in), 15 such boxes; the 16th holds
    # columns 960..999 (80 bytes: 3 sectors either way) and 48 bytes of zeros (2 sectors): 4 x 15
    # x 4 + 4 x 15 x 5 + 8 x 5 = 580 a CTA; the padding CTA's 8 rows lie past N, all zeros: 16 x 8
    # x 4 = 512.  V (B, multicast by the 1 x 2 clusters, flashsim.tma.multicast_row_sectors): 1,000
    # rows of 128 bytes from a 64-byte boundary, 4 sectors each, and 24 past K, zeros: max(3, 4);
    # 4,096.  125 x (580 + 4,096) + 512 + 4,096 = 589,108, the measured count to the sector (whole
    # boxes as if the tensor went on, the rule before the TMA probes, gave 588,672)
    got = received_read_sectors(wl(1000, 64), "fwd", gemm_tiles="256x40,64x8", gemm_clusters="4x2,1x2")
    assert got[3] == 125 * (4 * 15 * 4 + 4 * 15 * 5 + 8 * 5 + 1024 * 4) + 16 * 8 * 4 + 1024 * 4 == 589_108
    # K step 128: a box row of 256 bytes comes as two pieces of 128 bytes (one swizzle row each),
    # so the same count as K step 64 (K padded to 1,024 either way)
    assert received_read_sectors(wl(1000, 64), "fwd", ksteps="32,128", gemm_tiles="256x40,64x8",
                                 gemm_clusters="4x2,1x2")[3] == 589_108
    for bad in ("64,64,64", None, "0", "1000000000", "x"):
        with pytest.raises(ValueError, match="ksteps"):
            received_read_sectors(wl(1000, 64), "fwd", ksteps=bad)
    assert received_read_sectors(wl(1000, 64), "fwd", ksteps=np.int64(64), gemm_tiles="256x40,64x8",
                                 gemm_clusters="4x2,1x2")[3] == 589_108


def test_naive_warp_softmax_pieces_by_hand():
    # the warp softmax (Nk <= 2,048 forward, <= 1,024 backward) loads and stores one element a
    # lane, 32 consecutive columns a warp instruction: at N = 1,000, fp16, rows of 2,000 bytes,
    # even rows start on a sector (31 pieces of 64 bytes, 2 sectors each, and 16 bytes: 63),
    # odd rows 16 bytes in (3 sectors each, and 1: 94), 78.5 a row where the rows span 62.5
    # (measured on the H200, torch_edge: 78.5); at N = 1,024 the pieces tile the rows (64)
    for n, per_row in ((1000, 78.5), (1024, 64.0)):
        io = walk(build_schedule(wl(n, 64, heads=2), "torch_naive", "fwd"))
        assert io.per_launch["softmax"].breakdown[("S", "read")].sectors == 2 * n * per_row
        assert io.per_launch["softmax"].breakdown[("P", "write")].sectors == 2 * n * per_row
    io = walk(build_schedule(wl(1000, 64), "torch_naive", "bwd"))
    assert io.per_launch["softmax_bwd"].breakdown[("T", "read")].sectors == 78_500
    # past the warp softmax's limits, a block a row: whole rows (N = 1,536 backward, 3,000 forward)
    io = walk(build_schedule(wl(1520, 64), "torch_naive", "bwd"))
    assert io.per_launch["softmax_bwd"].breakdown[("T", "read")].sectors == 1520 * 1520 * 2 // 32


@pytest.mark.parametrize("n", [256, 512])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
@pytest.mark.parametrize("clusters", ["1x1", "2x1", "1x2", "2x2"])
def test_naive_received_boxes_equal_the_per_cta_walker_where_tiles_divide(n, pass_, clusters):
    # 64 x 64 tiles on matrices of 128 and n rows and columns, clusters of 1 or 2 tiles a side:
    # no edge rows, no padding CTAs, so the boxes are the tiles every CTA reads (the walker
    # without multicast)
    w = wl(n, 128, heads=2)
    got = received_read_sectors(w, pass_, gemm_tiles="64x64", gemm_clusters=clusters)
    io = walk(build_schedule(w, "torch_naive", pass_, gemm_tiles="64x64"))
    print(n, pass_, clusters, got)
    assert sum(x is not None for x in got) == (2 if pass_ == "fwd" else 4)
    for x, c in zip(got, io.per_launch.values()):
        if x is not None:
            assert x == sum(t.sectors for (_, k), t in c.breakdown.items() if k == "bulk_read")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 200), nk=st.integers(1, 200), d=st.sampled_from([8, 64, 72]), causal=st.booleans(),
       dtype=st.sampled_from(["fp16", "fp32"]), pass_=st.sampled_from(["fwd", "bwd"]),
       tiles=st.sampled_from(["128x128", "64x256", "128x64,256x128", "32x32,64x64,128x128,16x16"]),
       clusters=st.sampled_from(["1x1", "2x1", "1x2", "2x1,1x2", "1x2,2x1,2x2,1x1"]))
def test_naive_walker_equals_closed_form(n, nk, d, causal, dtype, pass_, tiles, clusters):
    count = 2 if pass_ == "fwd" else 4
    if len(tiles.split(",")) not in (1, count):
        tiles = tiles.split(",")[0]
    if len(clusters.split(",")) not in (1, count):
        clusters = clusters.split(",")[0]
    if causal:
        nk = -(-nk // 512) * 512  # masked_fill_'s blocks whole in a row (and tril's 8-byte chunks)
    w = wl(n, d, heads=2, causal=causal, dtype=dtype, nk=nk)
    sched = build_schedule(w, "torch_naive", pass_, gemm_tiles=tiles, gemm_clusters=clusters)
    io = walk(sched)
    want = closed_form_elements(w, "torch_naive", pass_, gemm_tiles=tiles, gemm_clusters=clusters)
    print(n, nk, d, causal, dtype, pass_, tiles, clusters)
    assert io.elements_by_key() == {k: v for k, v in want.items() if v}
    assert walk(sched, ordered=True).breakdown == io.breakdown


def test_naive_refusals():
    with pytest.raises(ValueError, match="gemm_tiles"):
        build_schedule(wl(256, 64), "torch_naive", "fwd", gemm_tiles="128")
    with pytest.raises(ValueError, match="gemm_tiles"):
        build_schedule(wl(256, 64), "torch_naive", "bwd", gemm_tiles="128x128,64x64")
    with pytest.raises(ValueError, match="kv_heads"):
        build_schedule(wl(256, 64, heads=4, kv=2), "torch_naive", "fwd")


# --------------------------------------------------------------------------------------------
# torch_memeff (forward)


def test_memeff_fwd_by_hand():
    # d = 128: Bq = 64, Bk = 128.  N = 256, one head: 4 query blocks x 2 key blocks; Q_i is
    # re-read for each key block: 2 x 256 rows = 65,536 elements; K and V once per query block:
    # 4 x 256 rows = 131,072 each.
    io = walk(build_schedule(wl(256, 128), "torch_memeff", "fwd"))
    el = {k: v[0] for k, v in key(io).items()}
    assert el == {("K", "read"): 131072, ("O", "write"): 32768, ("Q", "read"): 65536, ("V", "read"): 131072}
    # causal: query block i's loop covers min(256, 64 (i + 1)) keys: 64 + 128 + 192 + 256 = 640 key
    # rows; blocks of 128 keys: 1, 1, 2, 2 of them, so Q is read 6 x 64 rows.  With lse=True: 4
    # blocks x 64 floats (⌈256/32⌉·32 = 256 rows).
    io = walk(build_schedule(wl(256, 128, causal=True), "torch_memeff", "fwd", lse=True))
    el = {k: v[0] for k, v in key(io).items()}
    assert el == {("K", "read"): 640 * 128, ("L", "write"): 256, ("O", "write"): 32768, ("Q", "read"): 6 * 64 * 128,
                  ("V", "read"): 640 * 128}


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 400), nk=st.integers(1, 400), d=st.sampled_from([8, 64, 96, 128]), causal=st.booleans(),
       dtype=st.sampled_from(["fp16", "fp32"]), lse=st.booleans())
def test_memeff_walker_equals_closed_form(n, nk, d, causal, dtype, lse):
    if causal:
        nk = n
    w = wl(n, d, heads=2, causal=causal, dtype=dtype, nk=nk)
    sched = build_schedule(w, "torch_memeff", "fwd", lse=lse)
    io = walk(sched)
    print(n, nk, d, causal, dtype, lse, io.elements_by_key())
    want = closed_form_elements(w, "torch_memeff", "fwd", lse=lse)
    assert io.elements_by_key() == {k: v for k, v in want.items() if v}
    assert walk(sched, ordered=True).breakdown == io.breakdown


# --------------------------------------------------------------------------------------------
# torch_cudnn (forward, bulk estimate)


def test_cudnn_fwd_by_hand():
    # assumed 128 x 128 tiles, N = 256, d = 64, 2 heads: Q once, K and V once per query block
    # (2 x 256 rows), all of it bulk (TMA): nothing at the LSU level.
    io = walk(build_schedule(wl(256, 64, heads=2), "torch_cudnn", "fwd"))
    assert key(io) == {("K", "bulk_read"): (2 * 32768, 2 * 2048), ("O", "bulk_write"): (2 * 16384, 2 * 1024),
                       ("Q", "bulk_read"): (2 * 16384, 2 * 1024), ("V", "bulk_read"): (2 * 32768, 2 * 2048)}
    assert io.sectors == 0 and io.by_class()["bulk"].sectors == 2 * (1024 + 2048 + 2048 + 1024)
    # causal with 64-row query tiles: query block i loads ⌈64 (i + 1) / 128⌉ key blocks: 1, 1, 2, 2
    io = walk(build_schedule(wl(256, 64, causal=True), "torch_cudnn", "fwd", block_q=64))
    assert io.breakdown[("K", "bulk_read")].elements == (128 + 128 + 256 + 256) * 64
    for n, causal, bq in ((200, False, 128), (333, True, 64), (77, True, 128)):
        w = wl(n, 64, causal=causal)
        got = walk(build_schedule(w, "torch_cudnn", "fwd", block_q=bq, lse=True)).elements_by_key()
        assert got == closed_form_elements(w, "torch_cudnn", "fwd", block_q=bq, lse=True)


@pytest.mark.parametrize(("nq", "nk"), [(40, 256), (7, 512), (300, 256), (33, 768)])
def test_naive_tril_requests_brute_force(nq, nk):
    # triu_tril_kernel on a bool (nq, nk) matrix, tril(nk - nq): global thread c owns bytes
    # [8c, 8c + 8); warps are 32 consecutive threads; at step i each thread whose chunk starts in the
    # kept triangle loads byte 8c + i (every thread stores it).  A request's sectors are the distinct
    # 32-byte sectors of its warp's addresses at that step.
    cpr, k = nk // 8, nk - nq
    loads = stores = 0
    for g in range(-(-nq * cpr // 32)):
        chunks = range(32 * g, min(32 * g + 32, nq * cpr))
        active = [c for c in chunks if 8 * (c % cpr) - c // cpr <= k]
        for i in range(8):
            loads += len({(8 * c + i) // 32 for c in active})
            stores += len({(8 * c + i) // 32 for c in chunks})
    # fp32: masked_fill_'s blocks are 256 columns, so any multiple of 256 is a valid Nk
    sched = build_schedule(wl(nq, 64, nk=nk, causal=True, dtype="fp32"), "torch_naive", "fwd")
    io = walk(sched).per_launch["mask_tril"]
    print(nq, nk, loads, stores, io.breakdown)
    assert (io.breakdown[("Mask1", "read")].sectors, io.breakdown[("Mask", "write")].sectors) == (loads, stores)


def test_naive_tma_store_pieces_by_hand():
    # S = QKᵀ at N = 100, fp16, one 128 x 128 tile clipped to 100 x 100: C's rows are 200 bytes,
    # row r starting 8r mod 32 bytes into a sector.  A TMA store writes each row in pieces of
    # 128 bytes (one swizzle row), rows apart: the first piece spans 4 sectors from a sector's
    # start, 5 otherwise; the second (72 bytes) 3 at every phase: 7 + 8 + 8 + 8 = 31 every 4 rows,
    # 775 in all (the rows as one contiguous range, which the LSU count takes, 625)
    for ordered in (False, True):
        io = walk(build_schedule(wl(100, 64, heads=1), "torch_naive", "fwd", gemm_tiles="128x128"), ordered=ordered)
        assert io.per_launch["gemm_qk"].breakdown[("S", "bulk_write")] == Traffic(10_000, 20_000, 25 * 31)
    # fp32 GEMMs store through the LSU: the rows' union, as before (whole rows: 100 x 400 bytes)
    io = walk(build_schedule(wl(100, 64, heads=1, dtype="fp32"), "torch_naive", "fwd", gemm_tiles="128x128"))
    assert io.per_launch["gemm_qk"].breakdown[("S", "write")].sectors == 100 * 400 // 32
