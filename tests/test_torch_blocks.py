"""Thread blocks of PyTorch's memory-efficient forward and of eager naive attention
(flashsim/blocks.py, ``_torch_memeff`` and ``_torch_naive``): every launch's tiles move the
walker's elements (bulk traffic as reads and writes); small cases by hand; the grids and the
DRAM level on the committed H100 torch record."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_fast_blocks import _steps, _tile_elements

from flashsim import Workload
from flashsim.api import build_schedule
from flashsim.config import get_gpu
from flashsim.traffic import walk

ROOT = Path(__file__).resolve().parents[1]
TORCH = ROOT / "analysis" / "data" / "h100" / "torch"
#: a bulk (TMA) transfer is an ordinary read or write of the L2 for the block model
AS_TILE = {"bulk_read": "read", "bulk_write": "write"}


def _walker_elements(c) -> Counter:
    out = Counter()
    for (name, kind), t in c.breakdown.items():
        if t.elements:
            out[(name, AS_TILE.get(kind, kind))] += t.elements
    return out


CASES = [
    ("torch_memeff", "fwd", dict(batch=2, heads=3, seq_len_q=200, head_dim=64), {}),
    ("torch_memeff", "fwd", dict(batch=1, heads=2, seq_len_q=300, head_dim=128, causal=True), {"lse": True}),
    ("torch_memeff", "fwd", dict(batch=1, heads=2, seq_len_q=150, seq_len_k=333, head_dim=80, dtype="fp32"), {}),
    ("torch_naive", "fwd", dict(batch=2, heads=3, seq_len_q=200, head_dim=64),
     dict(gemm_tiles="64x128", gemm_clusters="2x1")),
    ("torch_naive", "bwd", dict(batch=2, heads=3, seq_len_q=200, head_dim=64),
     dict(gemm_tiles="128x256,64x128,128x64,64x128", gemm_clusters="2x1,1x2,2x1,1x2")),
    ("torch_naive", "fwd", dict(batch=1, heads=2, seq_len_q=300, seq_len_k=1024, head_dim=96, causal=True),
     dict(gemm_clusters="1x2", sms=7)),
    ("torch_naive", "bwd", dict(batch=1, heads=2, seq_len_q=300, seq_len_k=1024, head_dim=96, causal=True),
     dict(gemm_clusters="2x2", sms=5)),
    ("torch_naive", "fwd", dict(batch=1, heads=2, seq_len_q=150, seq_len_k=512, head_dim=80, dtype="fp32", causal=True),
     dict(gemm_tiles="64x32")),
    ("torch_naive", "bwd", dict(batch=2, heads=1, seq_len_q=100, head_dim=32, dtype="fp32"), {}),
    ("torch_naive", "fwd", dict(batch=1, heads=2, seq_len_q=64, head_dim=16, dtype="bf16"), {}),
]


@pytest.mark.parametrize("algo,pass_,kw,opts", CASES)
def test_tiles_move_the_walkers_elements(algo, pass_, kw, opts):
    """Summed over every block, each launch's loads, stores and reductions are the walker's,
    tensor by tensor (bulk reads and writes as reads and writes); a chunk of blocks and its
    complement add up to the whole grid."""
    sched = build_schedule(Workload(**kw), algo, pass_, None, **opts)
    io = walk(sched)
    for launch, (name, c) in zip(sched.launches, io.per_launch.items()):
        want = _walker_elements(c)
        assert _tile_elements(launch.blocks) == want, name
        n = launch.blocks.num_blocks
        assert _tile_elements(launch.blocks, 0, n // 3) + _tile_elements(launch.blocks, n // 3, n) == want, name


def test_memeff_blocks_by_hand():
    """d = 64: Bq = Bk = 64, 4 warps, 18,944 bytes of shared memory and 128 registers (ncu): 4
    blocks an SM (65,536 / (128·128)).  B = 1, H = 2, N = 130, causal: grid (3, 2, 1); block
    (2, 1) (rows 128-129 of head 1) covers keys below min(130, 192) = 130: key blocks 0, 1 and
    the 2 keys 128-129, each Q_i with K_j, then V_j; then O_i."""
    w = Workload(batch=1, heads=2, seq_len_q=130, head_dim=64, causal=True)
    spec = build_schedule(w, "torch_memeff", "fwd", None).launches[0].blocks
    assert (spec.grid, spec.threads, spec.smem_bytes, spec.registers) == ((3, 2, 1), 128, 18944, 128)
    assert spec.blocks_per_sm(get_gpu("h100")) == 4
    q = ("Q", "r", 1, 128, 2)
    assert _steps(spec, 5) == [[q, ("K", "r", 1, 0, 64)], [("V", "r", 1, 0, 64)],
                               [q, ("K", "r", 1, 64, 64)], [("V", "r", 1, 64, 64)],
                               [q, ("K", "r", 1, 128, 2)], [("V", "r", 1, 128, 2)], [("O", "w", 1, 128, 2)]]
    assert [s[0][:2] for s in _steps(spec, 0)] == [("Q", "r"), ("V", "r"), ("O", "w")]  # block (0, 0): key block 0


def test_naive_elementwise_softmax_and_mask_blocks_by_hand():
    """fp16, B = H = 1, N = 512, d = 64, causal.  scale: 128 threads x 8 elements (2 + 2 bytes of
    input and output), 32,768 elements, grid 32, block 1 elements 1,024-2,047 = rows 16-31 of Q.
    ones: 16 elements a thread (1 byte of output), 262,144 -> grid 128.  tril: 128 chunks of 8
    bytes a block, 64 chunks a row: block 0 is rows 0 and 1, which load 1 chunk each (r // 8 +
    1), chunks 0 and 64, and store chunks 0-127.  masked_fill_ (vt = 4, 512 columns a block, one
    block a row): row 400 loads columns 0-383, then the kept lanes of 384-511 (col <= 400: 17),
    its mask row, and stores the row.  softmax: the warp softmax, 4 rows a block: grid 128."""
    w = Workload(batch=1, heads=1, seq_len_q=512, head_dim=64, causal=True)
    launches = {ln.name: ln.blocks for ln in build_schedule(w, "torch_naive", "fwd", None).launches}
    assert launches["scale"].grid == (32, 1, 1)
    assert _steps(launches["scale"], 1) == [[("Q", "r", 0, 16, 16), ("Qs", "w", 0, 16, 16)]]
    assert launches["mask_ones"].grid == (128, 1, 1)
    assert launches["mask_tril"].grid == (256, 1, 1)
    assert _steps(launches["mask_tril"], 0) == [[("Mask1", "r", 0, 0, 1), ("Mask1", "r", 0, 64, 1),
                                                 ("Mask", "w", 0, 0, 128)]]
    fill = launches["masked_fill"]
    assert (fill.grid, fill.threads) == ((512, 1, 1), 128)
    assert _steps(fill, 400, cols=True) == [[("Sm", "r", 0, 400, 1, 0, 384), ("Sm", "r", 0, 400, 1, 384, 17),
                                             ("NotMask", "r", 0, 400, 1, 0, 512), ("Sm", "w", 0, 400, 1, 0, 512)]]
    assert launches["softmax"].grid == (128, 1, 1)
    assert _steps(launches["softmax"], 3) == [[("Sm", "r", 0, 12, 4), ("P", "w", 0, 12, 4)]]


def test_naive_gemm_blocks_by_hand():
    """S = Qs·Kᵀ, N = 256, d = 64, tile 128 x 128, clusters of 2 x 1 (two tiles along S's columns
    share Qs's band: multicast, read by the cluster's first CTA), 4 SMs: 2 cluster tiles (one per
    row band) on min(2, 4 // 2) = 2 clusters, grid (2, 2, 1), one K step of 64.  CTA (1, 0)
    computes S[0:128, 128:256] from K rows 128-255 alone; CTA (0, 1) S[128:256, 0:128] from Qs
    rows 128-255 and K rows 0-127.  fp32: the sm80 kernel, one tile a block, grid x along S's
    columns (tiles of 64 rows x 128 columns: (2, 4, 1)), K steps of 8."""
    w = Workload(batch=1, heads=1, seq_len_q=256, head_dim=64)
    qk = build_schedule(w, "torch_naive", "fwd", None, gemm_tiles="128x128", gemm_clusters="2x1",
                        sms=4).launches[1].blocks
    assert (qk.grid, qk.threads, qk.registers) == ((2, 2, 1), 384, 168)
    assert _steps(qk, 1, cols=True) == [[("K", "r", 0, 128, 128, 0, 64)], [("S", "w", 0, 0, 128, 128, 128)]]
    assert _steps(qk, 2, cols=True) == [[("Qs", "r", 0, 128, 128, 0, 64), ("K", "r", 0, 0, 128, 0, 64)],
                                        [("S", "w", 0, 128, 128, 0, 128)]]
    w32 = Workload(batch=1, heads=1, seq_len_q=256, head_dim=64, dtype="fp32")
    qk32 = build_schedule(w32, "torch_naive", "fwd", None, gemm_tiles="128x64").launches[1].blocks
    assert qk32.grid == (2, 4, 1)
    st = _steps(qk32, 3, cols=True)  # x = 1, y = 1: rows 64-127, columns 128-255
    assert len(st) == 9 and st[0] == [("Qs", "r", 0, 64, 64, 0, 8), ("K", "r", 0, 128, 128, 0, 8)]
    assert st[-1] == [("S", "w", 0, 64, 64, 128, 128)]


def test_the_dram_level_of_the_h100_torch_record():
    """Every memory-efficient and naive launch of the committed torch comparison has DRAM
    predictions on the record's grid (52 launches); reads median within 0.5%, 49 within 8%, all
    within 15%; two configurations recomputed equal the committed outputs."""
    from analysis.compare import read_measured
    from analysis.torch_set import records

    committed = [r for r in csv.DictReader(open(TORCH / "compare" / "compare_launches.csv"))
                 if r["kernel"] in ("torch_memeff", "torch_naive")]
    assert len(committed) == 52 and all(r["grid_matches"] == "True" and r["sim_grid"] == r["grid"] for r in committed)
    rd = np.abs([float(r["dram_read_err"]) for r in committed])
    assert np.median(rd) <= 0.005 and (rd <= 0.08).sum() == 49 and rd.max() <= 0.15
    rows = read_measured(TORCH / "torch.csv")[0]
    for cid in ("torch_memeff-fwd-b1h16-n1024-d64-fp32", "torch_naive-bwd-b1h16-n1024-d64-fp16-causal"):
        got = records(cid, sorted((r for r in rows if r["config_id"] == cid), key=lambda r: r["launch_index"]))
        want = [r for r in committed if r["config_id"] == cid]
        assert [int(g["sim_dram_read_bytes"]) for g in got] == [int(float(r["sim_dram_read_bytes"])) for r in want]
        assert [int(g["sim_dram_write_bytes"]) for g in got] == [int(float(r["sim_dram_write_bytes"])) for r in want]
