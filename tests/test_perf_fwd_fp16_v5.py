"""fwd_fp16_v5, v6 and v7: the fp16/bf16 forward on Hopper's warpgroup products (``wgmma``), against
float64 (v6: v5 with the products issued and waited for apart, P·V of the last block in flight
during the softmax; v7: v5 with K and V copied by the TMA unit, waited for on mbarriers).

Under the CUDA simulator the products are :mod:`kernels.perf.tc_sim`'s twins, which read the
shared tiles through the descriptors the way the PTX ISA's canonical swizzled layouts say the
tensor cores do: these tests check the kernel's copies into the swizzled layout, its descriptors,
masking, online softmax and epilogue.  On an H100 (``FLASHSIM_GPU=1 pytest -m gpu``) the same
checks run on the hardware at real sizes, which is what says the ISA was read right.
"""

import numpy as np
import pytest
from _fp16 import make
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda  # a module global: the CUDA simulator swaps it inside the kernel below
from test_perf_kernels import SETTINGS, check_forward

from kernels.perf import fwd_fp16_v5, fwd_fp16_v7

WG = {"v5": fwd_fp16_v5, "v7": fwd_fp16_v7}


@st.composite
def cases(draw):
    hkv = draw(st.sampled_from([1, 2]))
    return dict(variant=draw(st.sampled_from(sorted(WG))), hkv=hkv, h=hkv * draw(st.sampled_from([1, 2])),
                nq=draw(st.integers(1, 70)),
                nk=draw(st.integers(1, 70)), d=draw(st.sampled_from([64, 128])), causal=draw(st.booleans()),
                bc=draw(st.sampled_from([16, 32])), seed=draw(st.integers(0, 2**16)))


# One warpgroup (64 rows) keeps the simulator at 128 threads a block; two are the example below.
@settings(max_examples=4, **SETTINGS)
@given(cases())
def test_forward_sim(c):
    q, k, v, _ = make(c["seed"], 1, c["h"], c["hkv"], c["nq"], c["nk"], c["d"])
    o, lse = WG[c["variant"]].forward(q, k, v, causal=c["causal"], return_lse=True, bc=c["bc"], nw=4)
    check_forward(o, lse, q, k, v, c["causal"], label=str(c))


@pytest.mark.parametrize("variant,d,bc", [("v5", 40, 16), ("v5", 72, 32), ("v5", 96, 16), ("v5", 200, 16),
                                           ("v7", 88, 16), ("v7", 96, 32), ("v7", 200, 16)])
def test_forward_other_head_dims(poisoned, variant, d, bc):
    """Head dims other than 64 and 128, in poisoned shared memory: d = 40, 72, 200 (d % 16 = 8: S =
    Q Kᵀ reads a 16-byte column pad of Q and K that no copy writes, zeroed by the kernel) and the
    atoms that d fills in part (40, 72, 96, 200: P·V runs over the whole atoms of V, whose columns
    past d hold NaN here and reach only O's columns past d, never stored)."""
    q, k, v, _ = make(d, 1, 2, 1, 21, 37, d)
    o, lse = WG[variant].forward(q, k, v, causal=True, return_lse=True, bc=bc, nw=4)
    check_forward(o, lse, q, k, v, True, label=f"{variant} d={d} poisoned")


@pytest.mark.parametrize("variant", sorted(WG))
def test_forward_two_warpgroups_ragged_causal_gqa(variant):
    """8 warps (the default's two warpgroups), Nq > Nk causal (rows that see no key), GQA 2:1."""
    q, k, v, _ = make(5, 1, 2, 1, 37, 30, 64)
    o, lse = WG[variant].forward(q, k, v, causal=True, return_lse=True, bc=16, nw=8)
    check_forward(o, lse, q, k, v, True, label=f"{variant} two warpgroups")


@pytest.mark.parametrize("variant", sorted(WG))
def test_lpt_order_gives_the_same_bits(variant):
    """``lpt`` (causal blocks longest first across heads) moves blocks, not arithmetic: O and L equal
    grid order's bit for bit (GQA 2:1, B = 2, Nq > Nk: rows that see no key)."""
    q, k, v, _ = make(11, 2, 2, 1, 70, 60, 64)
    on, off = (WG[variant].forward(q, k, v, causal=True, return_lse=True, bc=16, nw=4, lpt=x) for x in (True, False))
    check_forward(*on, q, k, v, True, label=f"{variant} lpt")
    assert np.array_equal(on[0], off[0]) and np.array_equal(on[1], off[1])


@pytest.mark.parametrize("variant,causal,splits", [("v7", True, 5), ("v5", False, 2)])
def test_split_kv(variant, causal, splits):
    """``splits`` (split-KV): split z of S walks its share of a query block's key blocks and writes
    float32 partials that a second launch merges.  Against float64, and L within float32 rounding of
    the one-launch kernel's; GQA 2:1, B = 2, Bc = 16, 64-row blocks (whose float32 staging, 18,432
    bytes, reaches past v7's buffers: its mbarriers lie beyond it).  v7 causal, S = 5 (split z takes
    key blocks z·n//5 .. (z+1)·n//5 - 1): Nq > Nk (20 rows see no key: O = 0, L = -inf), the
    first query block with n = 3 key blocks (splits of 0, 1, 0, 1, 1), the second 4 (0, 1, 1, 1,
    1): empty splits first and between; v5 not causal, S = 2: 2 key blocks each."""
    q, k, v, _ = make(13, 2, 2, 1, 70, 50, 64)
    one = WG[variant].forward(q, k, v, causal=causal, return_lse=True, bc=16, nw=4)
    o, lse = WG[variant].forward(q, k, v, causal=causal, return_lse=True, bc=16, nw=4, splits=splits)
    check_forward(o, lse, q, k, v, causal, label=f"{variant} splits={splits}")
    fin = np.isfinite(one[1])
    print("max |L - L_one|", np.abs(lse[fin] - one[1][fin]).max())
    assert np.array_equal(np.isneginf(lse), np.isneginf(one[1]))
    np.testing.assert_allclose(lse[fin], one[1][fin], rtol=1e-6, atol=2e-6)


def test_split_kv_refuses():
    q, k, v, _ = make(1, 1, 1, 1, 8, 8, 64)
    for bad in (0, 65, 1.5):
        with pytest.raises(ValueError, match="splits"):
            fwd_fp16_v7.forward(q, k, v, splits=bad)


def _block_order(start, q, k, tr):
    """(query block, batch·head) that ``start`` (a ``_tiles.query_block``) gives each block of a
    (tr, B·H) grid, by the block's issue order (x fastest), run under the CUDA simulator."""
    bh = q.shape[0] * q.shape[1]

    @cuda.jit
    def order(q, k, out):
        i, b, h, hk, nq, nk, shift, r0, nblk = start(q, k)
        if cuda.threadIdx.x == 0:
            lin = cuda.blockIdx.x + cuda.blockIdx.y * cuda.gridDim.x
            out[lin, 0] = i
            out[lin, 1] = b * q.shape[1] + h

    out = np.full((tr * bh, 2), -1, np.int64)
    order[(tr, bh), 32](q, k, out)
    return out


@pytest.mark.parametrize("group", [1, 2])
def test_lpt_block_order_is_flashsims(group):
    """The kernels' block set-up (``_tiles.query_block`` with ``LPT_KV_BYTES``) gives each block the
    query block and head that flashsim's ``fast.lpt_order`` gives it, sections included: an L2 of
    2.5 keys' K and V rows x Nk holds 2 kv heads, so sections of 2·group query heads, the last
    one short (B·H = 5·group heads)."""
    from flashsim.algorithms import fast
    from kernels.perf._tiles import query_block

    nk, kvb, tr, br = 64, 16, 3, 16
    start = query_block(br, 16, True, LPT_KV_BYTES=kvb, LPT_L2=nk * kvb * 5 // 2)

    heads = 5 * group
    q = np.zeros((1, heads, tr * br, 4), np.float16)
    k = np.zeros((1, heads // group, nk, 4), np.float16)
    out = _block_order(start, q, k, tr)
    i, p = fast.lpt_order(tr, heads, fast.lpt_heads(nk, kvb // 4, 2, group, l2_bytes=nk * kvb * 5 // 2))
    print("kernel:", out.T.tolist(), "flashsim:", i.tolist(), p.tolist())
    assert fast.lpt_heads(nk, kvb // 4, 2, group, l2_bytes=nk * kvb * 5 // 2) == 2 * group
    assert out[:, 0].tolist() == i.tolist() and out[:, 1].tolist() == p.tolist()


def test_lpt_sections_at_the_default_l2():
    """The rule with the kernels' own numbers: K's and V's rows 4·d bytes (fp16, as ``_source``
    passes them) and the default 50 MiB.  Nk = 10^6 keys of d = 8 are 32 MB a kv head, so one fits:
    sections of one kv head's 2 query heads (GQA 2:1), two sections of B·H = 4."""
    from flashsim.algorithms import fast
    from kernels.perf._tiles import query_block

    nk, d, tr, br = 10**6, 8, 2, 16
    start = query_block(br, 16, True, LPT_KV_BYTES=4 * d)

    q = np.zeros((1, 4, tr * br, d), np.float16)
    k = np.zeros((1, 2, nk, d), np.float16)
    out = _block_order(start, q, k, tr)
    heads = fast.lpt_heads(nk, d, 2, group=2)
    i, p = fast.lpt_order(tr, 4, heads)
    print("kernel:", out.T.tolist(), "flashsim:", heads, i.tolist(), p.tolist())
    assert heads == 2
    assert out[:, 0].tolist() == i.tolist() == [1, 1, 0, 0, 1, 1, 0, 0]
    assert out[:, 1].tolist() == p.tolist() == [0, 1, 0, 1, 2, 3, 2, 3]


@pytest.mark.parametrize("variant", sorted(WG))
def test_forward_large_logits_rescale_exactly(variant):
    """Scores up to ~1e3 (scale 1): the lazy rescaling moves a row's reference max on later key
    blocks too, so O is rescaled mid-row (v6: after the wait for the P·V in flight)."""
    q, k, v, _ = make(7, 1, 1, 1, 20, 70, 64, scale=6.0)
    o, lse = WG[variant].forward(q, k, v, scale=1.0, return_lse=True, bc=16, nw=4)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    check_forward(o, lse, q, k, v, False, scale=1.0, label=f"{variant} large logits")


def test_supports_and_refuses():
    assert all(fwd_fp16_v5.supports(np.float16, d) for d in range(8, 257, 8))
    assert not fwd_fp16_v5.supports(np.float16, 12) and not fwd_fp16_v5.supports(np.float16, 264)
    assert not fwd_fp16_v5.supports(np.float32, 64)
    q, k, v, _ = make(1, 1, 1, 1, 8, 8, 12)
    with pytest.raises(ValueError, match="head_dim=12"):
        fwd_fp16_v5.forward(q, k, v)
    q, k, v, _ = make(1, 1, 1, 1, 8, 8, 64)
    with pytest.raises(ValueError, match="MT=2"):
        fwd_fp16_v5.forward(q, k, v, mt=2)
    # a careless block shape: one ValueError naming the key (the shared check of kernels.perf._launch)
    for bad, match in ((dict(nw=None), "nw must be a positive integer"), (dict(qreg="yes"), "qreg must be true"),
                       (dict(bc=-64), "bc must be a positive integer"), (dict(nw=10**9), "at most 32 warps"),
                       (dict(bk=64), "config keys")):
        with pytest.raises(ValueError, match=match):
            fwd_fp16_v5.forward(q, k, v, **bad)


def test_numpy_integers_in_the_block_shape():
    """numpy integers are integers: the descriptors' arithmetic (a 64-bit value near 2**62) must not
    be done in int32 by the twins."""
    q, k, v, _ = make(2, 1, 1, 1, 20, 20, 64)
    o, lse = fwd_fp16_v5.forward(q, k, v, return_lse=True, bc=np.int64(16), nw=np.int32(4))
    check_forward(o, lse, q, k, v, False, label="numpy ints")


# ---------------------------------------------------------------------------------------------
# On a GPU: real sizes, every block shape the tuner may pick, fp16 and bf16.


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1000, 4096])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("cfg", [dict(bc=128, nw=8), dict(bc=64, nw=8), dict(bc=128, nw=4)], ids=str)
def test_gpu_forward(n, d, cfg):
    q, k, v, _ = make(n + d, 2, 4, 2, n, n - 7, d)
    for causal in (False, True):
        o, lse = fwd_fp16_v5.forward(q, k, v, causal=causal, return_lse=True, **cfg)
        check_forward(o, lse, q, k, v, causal, label=f"gpu v5 n={n} d={d} {cfg} causal={causal}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [40, 72, 88, 96, 120, 136, 152, 160, 192, 200, 248, 256])
def test_gpu_forward_head_dims(d):
    """The default block of each head dim (and the small grid's), GQA 2:1, a ragged last block
    (Nk = 993, odd: where d % 16 = 8 every other head's tiles start 16 bytes into a sector)."""
    for n, b in ((1000, 2), (333, 1)):
        q, k, v, _ = make(n + d, b, 4, 2, n, n - 7, d)
        for causal in (False, True):
            o, lse = fwd_fp16_v5.forward(q, k, v, causal=causal, return_lse=True)
            check_forward(o, lse, q, k, v, causal, label=f"gpu v5 n={n} d={d} causal={causal}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_v7_lpt(d):
    """v7 with ``lpt`` on the GPU: against float64 (GQA 2:1, ragged), and bit for bit grid order's
    O and L (every query block run once), also where the rule gives several sections (Nk = 16,384:
    8 heads a section at d = 64, 4 at d = 128, of B·H = 10).  That the kernel's sections are
    flashsim's is the simulator tests' (``test_lpt_block_order_is_flashsims``)."""
    from flashsim.algorithms import fast

    q, k, v, _ = make(d + 3, 2, 4, 2, 1000, 993, d)
    on, off = (fwd_fp16_v7.forward(q, k, v, causal=True, return_lse=True, lpt=x) for x in (True, False))
    check_forward(*on, q, k, v, True, label=f"gpu v7 lpt d={d}")
    assert np.array_equal(on[0], off[0]) and np.array_equal(on[1], off[1])
    q, k, v, _ = make(d + 4, 1, 10, 10, 16384, 16384, d)
    assert fast.lpt_heads(16384, d, 2) == (8 if d == 64 else 4)
    on, off = (fwd_fp16_v7.forward(q, k, v, causal=True, return_lse=True, lpt=x) for x in (True, False))
    print(f"d={d}: max |O| {np.abs(on[0].astype(np.float32)).max():.3f}")
    assert np.array_equal(on[0], off[0]) and np.array_equal(on[1], off[1])


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 200])
def test_gpu_v7_split_kv(d):
    """v7 split-KV on the GPU, fp16 (numpy) and bf16 (torch, a prepared second call): 2-5 splits,
    causal (Nq > Nk: rows that see no key) and not, GQA 2:1, against float64."""
    torch = pytest.importorskip("torch")
    from test_bf16 import check_forward as check_bf16
    from test_bf16 import make as make_bf16

    q, k, v, _ = make(d + 5, 1, 4, 2, 1000, 777, d)
    for causal in (False, True):
        for s in (2, 5):
            o, lse = fwd_fp16_v7.forward(q, k, v, causal=causal, return_lse=True, splits=s)
            check_forward(o, lse, q, k, v, causal, label=f"gpu v7 splits={s} d={d} causal={causal}")
    (q, k, v, _), (qf, kf, vf, _) = make_bf16(d, 4, 2, 1000, 1000, d, device="cuda")
    for causal in (False, True):
        for _ in range(2):
            o, lse = fwd_fp16_v7.forward(q, k, v, causal=causal, return_lse=True, splits=3)
            torch.cuda.synchronize()
            check_bf16(o, lse, qf, kf, vf, causal, None, f"gpu v7 bf16 splits=3 d={d} causal={causal}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 88, 96, 120, 128, 200, 256])
def test_gpu_forward_v7(d):
    """v7 (TMA copies of K and V) at the default blocks: GQA 2:1, ragged last blocks (the TMA
    unit's zeros past N), two grids; then the same K and V at a second call (the tensor maps
    remembered) and new K and V of the same shape (maps made again)."""
    for n, b in ((1000, 2), (333, 1)):
        q, k, v, _ = make(n + d, b, 4, 2, n, n - 7, d)
        for causal in (False, True):
            o, lse = fwd_fp16_v7.forward(q, k, v, causal=causal, return_lse=True)
            check_forward(o, lse, q, k, v, causal, label=f"gpu v7 n={n} d={d} causal={causal}")
    o, lse = fwd_fp16_v7.forward(q, k, v, causal=True, return_lse=True)
    check_forward(o, lse, q, k, v, True, label=f"gpu v7 d={d} again")
    q, k, v, _ = make(d, b, 4, 2, n, n - 7, d)
    o, lse = fwd_fp16_v7.forward(q, k, v, causal=True, return_lse=True)
    check_forward(o, lse, q, k, v, True, label=f"gpu v7 d={d} new inputs")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 120])
def test_gpu_forward_v7_torch_prepared_calls(d):
    """Torch tensors: the second call of a shape replays the first's prepared launch (kernels.perf.
    _launch.with_plan), whose tensor maps are made again from the new tensors' pointers."""
    torch = pytest.importorskip("torch")
    outs = []
    for seed in range(3):
        q, k, v, _ = make(seed + d, 1, 4, 2, 1024, 1000, d)
        tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
        o, lse = fwd_fp16_v7.forward(tq, tk, tv, causal=True, return_lse=True)
        torch.cuda.synchronize()
        outs.append((o.cpu().numpy(), lse.cpu().numpy(), q, k, v))
    for o, lse, q, k, v in outs:
        check_forward(o, lse, q, k, v, True, label=f"gpu v7 torch d={d}")


@pytest.mark.gpu
@pytest.mark.parametrize("variant,d", [("v5", 64), ("v5", 128), ("v5", 96), ("v5", 200),
                                       ("v5", 256), ("v7", 64), ("v7", 120)])
def test_gpu_forward_bf16(d, variant):
    torch = pytest.importorskip("torch")
    from test_bf16 import check_forward as check_bf16
    from test_bf16 import make as make_bf16

    (q, k, v, _), (qf, kf, vf, _) = make_bf16(d, 4, 2, 1000, 1000, d, device="cuda")
    for causal in (False, True):
        o, lse = WG[variant].forward(q, k, v, causal=causal, return_lse=True)
        torch.cuda.synchronize()
        check_bf16(o, lse, qf, kf, vf, causal, None, f"gpu {variant} bf16 d={d} causal={causal}")


@pytest.mark.parametrize("d,bc", [(64, 64), (128, 128)])
def test_sm90a_ptx_and_sass(d, bc):
    """The default shapes compiled for sm_90a without a GPU: d/16 warpgroup products for S and Bc/16
    for P·V, no mma.sync, no local memory; ptxas (the test extra's wheel) assembles them without
    spills into HGMMA instructions."""
    from _ptx import run_without_simulator

    res = run_without_simulator(
        "from kernels.perf.inspect import lto_ptx, sass_report\n"
        f"ptx = lto_ptx('fwd_fp16_v5', {d}, {bc}, 8, 1, 0, 0)\n"
        "r = sass_report(ptx)\n"
        "print(ptx.count('wgmma.mma_async'), ptx.count('mma.sync'), '.local' in ptx, r.get('spill_store_bytes'),\n"
        "      r.get('registers'), r.get('loop_HGMMA'), r.get('loop_CALL'), r.get('loop_local'),\n"
        "      r.get('ptxas_error', '-')[:80].replace(' ', '_'))\n")
    assert res.returncode == 0, res.stderr[-2000:]
    wg, mma, local, spills, regs, loop_wg, loop_call, loop_local, err = res.stdout.split()
    print(f"d={d} Bc={bc}: wgmma {wg}, mma.sync {mma}, local {local}, spills {spills}, registers {regs}, "
          f"main loop: HGMMA {loop_wg}, CALL {loop_call}, local {loop_local}; {err}")
    assert int(wg) == d // 16 + bc // 16 and int(mma) == 0 and local == "False" and err == "-"
    assert spills in ("0", "None")
    if loop_wg != "None":  # SASS read (cuobjdump found): every product in the main loop, no call, no spill
        assert (int(loop_wg), int(loop_call), int(loop_local)) == (d // 16 + bc // 16, 0, 0)


def test_v7_sm90a_ptx_and_sass():
    """v7 at d = 120 (the head dim it was made for), causal with ``lpt`` (its blocks longest first
    across heads, as it ships), compiled for sm_90a without a GPU: its K and V copies are TMA
    instructions (UTMALDG in the SASS, 2 an atom a buffer), its mbarrier waits are there, and no
    cp.async is left but Q's; no spills."""
    from _ptx import run_without_simulator

    res = run_without_simulator(
        "from kernels.perf.inspect import lto_ptx, sass_report\n"
        "import tempfile, os\n"
        "ptx = lto_ptx('fwd_fp16_v7', 120, 48, 4, 1, 1, 0, LPT=True)\n"
        "f = tempfile.NamedTemporaryFile(suffix='.sass', delete=False).name\n"
        "r = sass_report(ptx, f)\n"
        "sass = open(f).read(); os.unlink(f)\n"
        "print(ptx.count('cp.async.bulk.tensor.3d'), ptx.count('mbarrier.try_wait.parity'), sass.count('UTMALDG'),\n"
        "      r.get('spill_store_bytes'), r.get('ptxas_error', '-')[:80].replace(' ', '_'))\n")
    assert res.returncode == 0, res.stderr[-2000:]
    tma, waits, utmaldg, spills, err = res.stdout.split()
    print(f"d=120: cp.async.bulk.tensor {tma}, try_wait {waits}, UTMALDG {utmaldg}, spills {spills}; {err}")
    assert int(tma) >= 4 and int(waits) >= 1 and err == "-" and spills in ("0", "None")
    assert utmaldg == "0" or int(utmaldg) >= 4  # 0: no cuobjdump here
