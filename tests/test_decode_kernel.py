"""The decode kernels (kernels/decode.py, kernels/perf/decode.py) against float64 and the schedule.

Under the CUDA simulator (tiny sizes): exactness against ``kernels.reference.decode_forward``
(fp32 near 1e-6; fp16 and bf16 within 2x plain low-precision decoding's error), the reference
kernel's traffic counters equal to the schedule's formulas (``kernels.decode.expected_counts``;
hand-derived integers for a small case), bad inputs.  ``@pytest.mark.gpu``: larger shapes on a GPU.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from _ptx import run_without_simulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels
from kernels import reference as ref
from kernels.counters import new_counters, to_elements
from kernels.decode import expected_counts, visible_blocks

FP32_TOL = 2e-6


def _cache(rng, b, hkv, lengths, d, dtype, page_size=None, extra_pages=2):
    """(k_cache, v_cache, block_table): contiguous (B, Hkv, Nk_max, d) if page_size is None, else
    paged (num_pages, P, Hkv, d) with each sequence's pages scattered in a shuffled pool."""
    nk = max(lengths)
    if page_size is None:
        k = rng.standard_normal((b, hkv, nk, d)).astype(dtype)
        v = rng.standard_normal((b, hkv, nk, d)).astype(dtype)
        return k, v, None
    per = -(-nk // page_size)
    npages = b * per + extra_pages
    k = rng.standard_normal((npages, page_size, hkv, d)).astype(dtype)
    v = rng.standard_normal((npages, page_size, hkv, d)).astype(dtype)
    table = rng.permutation(npages)[: b * per].reshape(b, per).astype(np.int32)
    return k, v, table


def test_counters_hand_derived():
    """B = 2, Hq = 2, Hkv = 1, Nq = 1, d = 4, Bc = 8, P = 4, lengths (10, 3), S = 2.
    Sequence 0: key blocks 0 (rows 0-7, pages 0-1) and 1 (rows 8-9, page 2), one per split;
    sequence 1: block 0 (rows 0-2, page 0) in split 0, split 1 empty.  Q 8 per non-empty split
    (3 of them); K = V = 8·4 + 2·4 + 3·4 = 52; BT 2 + 1 + 1; Op/Lp written by all four blocks
    (4·8, 4·2); Lens 1 per main block, B·Hkv·S = 2·1·2 = 4 (the empty split's block reads its
    length too); the combine's 4 blocks read Lp 2 and Op 2·4 each, write O 4 and L 1 (no length)."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 2, 1, 4)).astype(np.float32)
    k, v, table = _cache(rng, 2, 1, [10, 3], 4, np.float32, page_size=4)
    c = new_counters()
    o, lse = kernels.decode_attention(q, k, v, cache_seqlens=np.array([10, 3], np.int32), block_table=table,
                                      num_splits=2, block_n=8, counters=c)
    want = {("Lens", "read"): 4, ("Q", "read"): 24, ("K", "read"): 52, ("V", "read"): 52, ("BT", "read"): 4,
            ("Op", "write"): 32, ("Lp", "write"): 8, ("Lp", "read"): 8, ("Op", "read"): 32,
            ("O", "write"): 16, ("L", "write"): 4}
    assert to_elements(c) == dict(sorted(want.items()))
    assert expected_counts([10, 3], heads=2, kv_heads=1, nq=1, d=4, bc=8, splits=2, page_size=4) == to_elements(c)
    ro, rl = ref.decode_forward(q, k, v, [10, 3], block_table=table)
    print("fp32 rel err O", ref.rel_error(o, ro), "L", ref.rel_error(lse, rl))
    assert ref.rel_error(o, ro) < FP32_TOL and ref.rel_error(lse, rl) < FP32_TOL


def test_expected_counts_compulsory():
    """One split, contiguous, no window: K and V are read once, each row of each cache (the
    compulsory traffic), Q once, O and L written once, each block's length once (B·Hkv = 4·2); no
    Op, Lp, BT."""
    lengths = [1, 7, 64, 100]
    c = expected_counts(lengths, heads=8, kv_heads=2, nq=1, d=64, bc=32)
    assert c[("K", "read")] == c[("V", "read")] == 2 * sum(lengths) * 64
    assert c[("Q", "read")] == 4 * 8 * 64 and c[("O", "write")] == 4 * 8 * 64 and c[("L", "write")] == 4 * 8
    assert c[("Lens", "read")] == 4 * 2
    assert set(c) == {("Lens", "read"), ("Q", "read"), ("K", "read"), ("V", "read"), ("O", "write"), ("L", "write")}
    # a window reads from the start of the block that holds pos - left on
    j0, n = visible_blocks(100, 1, 32, left=40)
    assert (j0, n) == (1, 3)  # lo = 100 - 1 - 40 = 59 -> blocks 1, 2, 3


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fp32_against_float64_and_counters(data):
    """fp32, both kernels: variable lengths, GQA, Nq 1-3, paged or not, splits, windows."""
    b = data.draw(st.integers(1, 2), label="b")
    hkv = data.draw(st.sampled_from([1, 2]), label="hkv")
    g = data.draw(st.sampled_from([1, 2, 4]), label="g")
    nq = data.draw(st.integers(1, 3), label="nq")
    d = data.draw(st.sampled_from([8, 16, 24]), label="d")
    lengths = [data.draw(st.integers(nq, 70), label=f"L{i}") for i in range(b)]
    page = data.draw(st.sampled_from([None, 4, 16]), label="page")
    window = data.draw(st.sampled_from([None, (5, -1), (20, 0), (-1, 1)]), label="window")
    causal = data.draw(st.booleans(), label="causal")
    impl = data.draw(st.sampled_from(["reference", "fast"]), label="impl")
    bc = 16 if impl == "reference" else 32  # the fast kernel's T for fp32 at these sizes
    most = max(visible_blocks(n, nq, bc, -1 if window is None else window[0])[1] for n in lengths)
    splits = data.draw(st.integers(1, most), label="splits")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    q = rng.standard_normal((b, hkv * g, nq, d)).astype(np.float32)
    k, v, table = _cache(rng, b, hkv, lengths, d, np.float32, page)
    lens = np.array(lengths, dtype=np.int32)
    c = new_counters() if impl == "reference" else None
    o, lse = kernels.decode_attention(q, k, v, cache_seqlens=lens, block_table=table, num_splits=splits,
                                      window=window, causal=causal, impl=impl, counters=c,
                                      block_n=bc if impl == "reference" else None)
    ro, rl = ref.decode_forward(q, k, v, lengths, block_table=table, window=window, causal=causal)
    eo, el = ref.rel_error(o, ro), ref.rel_error(lse, rl)
    print(f"{impl} S={splits} page={page} window={window} lengths={lengths}: rel err O {eo:.2e} L {el:.2e}")
    assert o.dtype == np.float32 and lse.dtype == np.float32
    assert eo < FP32_TOL and el < FP32_TOL
    if c is not None:
        want = expected_counts(lengths, heads=hkv * g, kv_heads=hkv, nq=nq, d=d, bc=bc, splits=splits,
                               page_size=page or 0, window=window)
        assert to_elements(c) == want


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_fp16_two_x_rule(impl):
    """fp16, paged, windowed, two splits: within 2x plain fp16 decoding's error against float64.
    (The fast kernel's key block is 64 in fp16, the reference one runs Bc = 16: lengths to match.)"""
    rng = np.random.default_rng(3)
    lengths, window, nq = ([140, 40], (100, -1), 1) if impl == "fast" else ([45, 30], (24, -1), 2)
    q = rng.standard_normal((2, 4, nq, 32)).astype(np.float16)
    k, v, table = _cache(rng, 2, 1, lengths, 32, np.float16, page_size=8)
    o, lse = kernels.decode_attention(q, k, v, cache_seqlens=lengths, block_table=table, num_splits=2,
                                      window=window, impl=impl, block_n=16 if impl == "reference" else None)
    j = ref.judge_decode(o, q, k, v, lengths, block_table=table, window=window)
    print(f"fp16 {impl}: {j}")
    assert o.dtype == np.float16 and j.ok


def test_tensor_core_variant_fp16():
    """v3 (``kernels.perf.decode.forward_tc``: the products on the tensor cores, through the
    simulator's twins of mma.sync): paged, windowed, two splits, GQA 4:1 with Nq = 2 (8 rows)."""
    from kernels.perf import decode as fast

    rng = np.random.default_rng(9)
    lengths = [130, 66]
    q = rng.standard_normal((2, 4, 2, 64)).astype(np.float16)
    k, v, table = _cache(rng, 2, 1, lengths, 64, np.float16, page_size=16)
    o, lse = fast.forward_tc(q, k, v, cache_seqlens=lengths, block_table=table, num_splits=2, window=(90, -1))
    j = ref.judge_decode(o, q, k, v, lengths, block_table=table, window=(90, -1))
    _, rl = ref.decode_forward(q, k, v, lengths, block_table=table, window=(90, -1))
    print(f"fp16 tensor cores: {j}; L rel err {ref.rel_error(lse, rl):.1e}")
    assert o.dtype == np.float16 and j.ok and ref.rel_error(lse, rl) < 1e-5
    with pytest.raises(ValueError, match="tensor-core decode takes fp16"):
        fast.forward_tc(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), cache_seqlens=lengths,
                        block_table=table)


def test_bf16_through_torch():
    """bf16 (torch CPU tensors; the kernels read the int16 bits) within 2x plain bf16 decoding,
    on the fast kernel with two splits (the combine rounds O to bf16)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    lengths = [130, 21]
    q32 = rng.standard_normal((2, 2, 1, 16)).astype(np.float32)
    k32, v32, _ = _cache(rng, 2, 1, lengths, 16, np.float32)
    q, k, v = (torch.from_numpy(x).to(torch.bfloat16) for x in (q32, k32, v32))
    o, lse = kernels.decode_attention(q, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), num_splits=2)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    qf, kf, vf = (x.float().numpy() for x in (q, k, v))
    j = ref.judge_decode(o.float().numpy(), qf, kf, vf, lengths, dtype="bf16")
    print(f"bf16: {j}")
    assert j.ok


def test_round_bf16():
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1); 1 + 3·2^-8 rounds up to 1 + 2^-6
    assert ref.round_bf16(np.float32(1.00390625)) == 1.0
    assert ref.round_bf16(np.float32(1.01171875)) == np.float32(1.015625)
    assert ref.round_bf16(np.float32(np.inf)) == np.inf
    assert np.isnan(ref.round_bf16(np.float32("nan")))


def test_cu_seqlens_and_cache_seqlens_agree():
    from kernels.decode import plan

    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 2, 1, 8)).astype(np.float32)
    k, v, _ = _cache(rng, 3, 2, [9, 9, 9], 8, np.float32)
    a = plan(q, k, v, cache_seqlens=[3, 9, 1]).lengths
    b = plan(q, k, v, cu_seqlens_k=[0, 3, 12, 13]).lengths
    assert a.tolist() == b.tolist() == [3, 9, 1]
    assert plan(q, k, v).lengths.tolist() == [9, 9, 9]


def _bad(match, **kw):
    rng = np.random.default_rng(6)
    base = dict(q=rng.standard_normal((2, 4, 1, 8)).astype(np.float32))
    k, v, table = _cache(rng, 2, 2, [16, 16], 8, np.float32, page_size=4)
    base.update(k_cache=k, v_cache=v, block_table=table, cache_seqlens=[16, 10])
    base.update(kw)
    args = {n: base.pop(n) for n in ("q", "k_cache", "v_cache")}
    with pytest.raises(ValueError, match=match):
        kernels.decode_attention(args["q"], args["k_cache"], args["v_cache"], **base)


def test_bad_inputs():
    rng = np.random.default_rng(7)
    kc, vc, table = _cache(rng, 2, 2, [16, 16], 8, np.float32, page_size=4)
    bad_table = table.copy()
    bad_table[1, 0] = kc.shape[0]
    _bad(r"block_table\[1, 0\]=", block_table=bad_table)
    neg = table.copy()
    neg[0, 3] = -1
    _bad(r"block_table\[0, 3\]=-1", block_table=neg)
    _bad(r"block_table.shape", block_table=table[:1])
    _bad(r"page_size=7: does not divide", k_cache=kc.reshape(-1, 2, 8)[:-1], v_cache=vc.reshape(-1, 2, 8)[:-1],
         page_size=7)
    _bad(r"page_size=8: must equal", page_size=8)
    _bad(r"num_splits=5: more than the 4 key blocks", num_splits=5, block_n=4, counters=new_counters())
    _bad(r"num_splits=0", num_splits=0)
    _bad(r"cache_seqlens.shape", cache_seqlens=[16, 10, 3])
    _bad(r"length 17 of sequence 0 exceeds", cache_seqlens=[17, 3])
    _bad(r"length 0 of sequence 1 is below Nq=1", cache_seqlens=[3, 0])
    _bad(r"cu_seqlens_k", cache_seqlens=None, cu_seqlens_k=[1, 3, 5])
    _bad(r"cu_seqlens_k.shape", cache_seqlens=None, cu_seqlens_k=[0, 3])
    _bad(r"give one of them", cu_seqlens_k=[0, 3, 5])
    _bad(r"kv_heads=2: must divide", q=np.zeros((2, 3, 1, 8), np.float32))
    _bad(r"head_dim", q=np.zeros((2, 4, 1, 16), np.float32))
    _bad(r"q.shape", q=np.zeros((2, 4, 8), np.float32))
    _bad(r"window=", window=(3,))
    _bad(r"window\[0\]=-2", window=(-2, 0))
    _bad(r"dtypes=", q=np.zeros((2, 4, 1, 8), np.float16))
    _bad(r"q.dtype=float64", q=np.zeros((2, 4, 1, 8)))
    _bad(r"impl='fast': counters", impl="fast", counters=new_counters())
    _bad(r"impl=", impl="quick")
    _bad(r"k_cache.shape", block_table=None, cache_seqlens=None)  # a paged cache without its table
    kcont, vcont, _ = _cache(rng, 2, 2, [16, 16], 8, np.float32)
    _bad(r"v_cache.shape", k_cache=kcont, v_cache=vcont[:, :, :8], block_table=None)
    _bad(r"k_cache.shape\[0\]=1", k_cache=kcont[:1], v_cache=vcont[:1], block_table=None)
    _bad(r"causal='yes'", causal="yes")
    from kernels.perf import decode as fast

    with pytest.raises(ValueError, match=r"tile=48"):
        fast.forward(np.zeros((2, 4, 1, 8), np.float32), kcont, vcont, tile=48)


PTX_SCRIPT = textwrap.dedent("""
    import sys
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda, float32, int32, int64, types
    try:  # is there a compiler at all?  (NVRTC/NVVM wheels or a CUDA toolkit)
        cuda.compile_ptx(lambda a: None, "void(float32[::1])", cc=(9, 0))
    except Exception as e:
        print("NO_COMPILER", type(e).__name__, e)
        sys.exit(0)

    class Device:  # device functions compile for the current device's cc; there is no GPU here
        compute_capability = (9, 0)

    dispatcher.get_current_device = lambda: Device()
    from kernels import decode as ref
    from kernels.perf import decode as fast

    f32 = lambda n: types.Array(float32, n, "C")
    bt, lens, cnt = types.Array(int32, 2, "C"), types.Array(int32, 1, "C"), types.Array(int64, 2, "C")
    for dt, which in (("fp16", "fast"), ("bf16", "reference")):
        t = ref._ST[dt]
        a4, a1 = types.Array(t, 4, "C"), types.Array(t, 1, "C")
        if which == "fast":
            src = fast._source(dt, 64, 64, 4, 1, True, True, True, True, 16)
            sig = types.void(a4, a1, a1, bt, lens, a4, f32(3), f32(5), f32(4), float32, int64, int64, int64, int64)
        else:
            src = ref._main_source(dt, 64, 32, 4, 1, True, True, True, True, True, 16)
            sig = types.void(a4, a4, a4, bt, lens, a4, f32(3), f32(5), f32(4), float32, int64, int64, cnt)
        text, _ = cuda.compile_ptx(src, sig, cc=(9, 0))
        assert ".local" not in text, (dt, which)
        if which == "fast":
            assert "ld.shared.v4.f32" in text  # the RB = 4 rows of a thread read as one vector
        print(dt, which, "ok", len(text))
    cuda.compile_ptx(ref._combine_source("bf16", True), types.void(f32(5), f32(4), types.Array(ref._ST["bf16"], 4, "C"),
                                                                  f32(3), cnt), cc=(9, 0))
    print("combine ok")
""")


def test_ptx_sm90_compiles_without_local_memory():
    """The fast kernel (fp16, paged, split, windowed, g = 4) and the reference kernel and combine
    (bf16: the bit conversions through libdevice) compile for sm_90 with nothing in local memory,
    and the fast kernel reads its rows of τQ and S as 16-byte vectors.  The simulator runs neither
    libdevice nor the GPU's typing: this is what catches a kernel that only the GPU would refuse.
    In a subprocess without NUMBA_ENABLE_CUDASIM; skipped when NVRTC/NVVM are missing."""
    r = run_without_simulator(PTX_SCRIPT)
    print(r.stdout[-2000:], r.stderr[-4000:])
    if "NO_COMPILER" in r.stdout:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0
    assert r.stdout.count(" ok") == 3


# ---------------------------------------------------------------------------------------------
# On a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("page", [None, 16, 256])
def test_gpu_exactness_and_counters(impl, dtype, page):
    rng = np.random.default_rng(11)
    b, hkv, g, nq, d = 4, 2, 8, 2, 128
    lengths = [3000, 17, 2048, 1025]
    q = rng.standard_normal((b, hkv * g, nq, d)).astype(dtype)
    k, v, table = _cache(rng, b, hkv, lengths, d, dtype, page)
    for splits, window in ((1, None), (5, (500, -1))):
        c = new_counters() if impl == "reference" else None
        o, lse = kernels.decode_attention(q, k, v, cache_seqlens=lengths, block_table=table, num_splits=splits,
                                          window=window, impl=impl, counters=c)
        ro, rl = ref.decode_forward(q, k, v, lengths, block_table=table, window=window)
        if dtype == np.float32:
            err = ref.rel_error(o, ro)
            print(f"{impl} fp32 page={page} S={splits} window={window}: rel err {err:.2e}")
            assert err < 1e-5
        else:
            j = ref.judge_decode(o, q, k, v, lengths, block_table=table, window=window)
            print(f"{impl} fp16 page={page} S={splits} window={window}: {j}")
            assert j.ok
        assert ref.rel_error(lse, rl) < 1e-5
        if c is not None:
            from kernels.decode import default_block_n

            bc = default_block_n("fp32" if dtype == np.float32 else "fp16", d, g * nq, page or 0)
            want = expected_counts(lengths, heads=hkv * g, kv_heads=hkv, nq=nq, d=d, bc=bc, splits=splits,
                                   page_size=page or 0, window=window)
            assert to_elements(c) == want


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 16])
@pytest.mark.parametrize("g,nq,d", [(8, 1, 128), (4, 2, 64)])
def test_gpu_tensor_core_variant(page, g, nq, d):
    from kernels.perf import decode as fast

    rng = np.random.default_rng(12)
    b, hkv = 4, 2
    lengths = [3000, 17, 2048, 1025]
    q = rng.standard_normal((b, hkv * g, nq, d)).astype(np.float16)
    k, v, table = _cache(rng, b, hkv, lengths, d, np.float16, page)
    for splits, window in ((1, None), (3, (500, -1)), (None, None)):
        o, lse = fast.forward_tc(q, k, v, cache_seqlens=lengths, block_table=table, num_splits=splits, window=window)
        j = ref.judge_decode(o, q, k, v, lengths, block_table=table, window=window)
        _, rl = ref.decode_forward(q, k, v, lengths, block_table=table, window=window)
        print(f"tensor cores page={page} g={g} nq={nq} d={d} S={splits} window={window}: {j}")
        assert j.ok and ref.rel_error(lse, rl) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("hkv,g", [(8, 1), (1, 8)])
def test_gpu_long_cache_torch(hkv, g):
    """Nk = 65,536 with torch CUDA tensors (fp16 and bf16), default splits, against float64 on
    the GPU, and the reference kernel's result beside the fast one's."""
    torch = pytest.importorskip("torch")
    b, nq, d, nk = 2, 1, 128, 65536
    gen = torch.Generator(device="cuda").manual_seed(0)
    for tdt, name in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        q = torch.randn(b, hkv * g, nq, d, device="cuda", generator=gen).to(tdt)
        k = torch.randn(b, hkv, nk, d, device="cuda", generator=gen).to(tdt)
        v = torch.randn(b, hkv, nk, d, device="cuda", generator=gen).to(tdt)
        lens = torch.tensor([nk, nk - 1000], dtype=torch.int32)
        o, lse = kernels.decode_attention(q, k, v, cache_seqlens=lens)
        o_ref, _ = kernels.decode_attention(q, k, v, cache_seqlens=lens, impl="reference", num_splits=4)
        torch.cuda.synchronize()
        assert o.dtype == tdt and o.is_cuda
        qd, kd, vd = (x.double() for x in (q, k, v))
        errs = []
        for bb, n in enumerate(lens.tolist()):
            kk = kd[bb, :, :n].repeat_interleave(g, dim=0)
            vv = vd[bb, :, :n].repeat_interleave(g, dim=0)
            want = torch.softmax(qd[bb] @ kk.transpose(-1, -2) / d ** 0.5, -1) @ vv
            errs.append(((o[bb].double() - want).norm() / want.norm()).item())
            errs.append(((o_ref[bb].double() - want).norm() / want.norm()).item())
        print(f"{name} hkv={hkv} g={g}: rel errs {errs}")
        assert max(errs) < (2e-3 if name == "fp16" else 1.6e-2)


def test_decode_measure_set_and_worker_call():
    """The `flashsim measure --set decode` configurations are distinct and valid (splits within the
    key blocks, pages dividing nothing they must not), and the worker's call runs a tiny one under
    the simulator to the float64 result."""
    from analysis.configs import SETS, config_id
    from analysis.worker import _decode_call

    cfgs = SETS["decode"]()
    assert len({config_id(c) for c in cfgs}) == len(cfgs) == 11
    for c in cfgs:
        assert c["kernel"] == "decode" and c["heads"] == 8 * c["kv_heads"]
        assert c["num_splits"] <= visible_blocks(c["seq_len_k"], c["seq_len_q"], c["block_n"], -1)[1]
    tiny = dict(cfgs[-1], batch=1, heads=2, kv_heads=1, seq_len_k=40, num_splits=2, block_n=16, page_size=8,
                head_dim=8)
    o, lse = _decode_call(tiny, np.random.default_rng(0))()
    assert o.shape == (1, 2, 1, 8) and np.isfinite(o.copy_to_host()).all()


def test_auto_falls_back_to_the_reference_kernel():
    """fp32, d = 256, 8 query heads per kv head: the fast kernel's tiles do not fit 48 KB, the
    reference kernel's (Bc = 8) do; impl="auto" runs the reference one, impl="fast" refuses."""
    from kernels.perf import decode as fast

    assert not fast.supports("fp32", 256, 8) and fast.supports("fp16", 128, 8)
    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, 8, 1, 256)).astype(np.float32)
    k, v, _ = _cache(rng, 1, 1, [3], 256, np.float32)
    o, lse = kernels.decode_attention(q, k, v)
    ro, _ = ref.decode_forward(q, k, v)
    assert ref.rel_error(o, ro) < FP32_TOL
    with pytest.raises(ValueError, match="impl='fast': head_dim=256"):
        kernels.decode_attention(q, k, v, impl="fast")
