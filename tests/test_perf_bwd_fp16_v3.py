"""bwd_fp16_v3 (one kernel, 2-D warp tiles in every product, dQ by atomics) against the float64
reference, under the CUDA simulator, by the 2x rule against plain fp16 attention.

Tiny shapes and two warps (one Python thread per simulated lane): GQA with causal Nq > Nk (rows
that see no key) with two m-tiles a warp in every phase, as the d = 128 default has; the warps
split along the keys and the queries, with ragged N in both directions (two query blocks, two
key blocks, both partial); and one drawn case (heads, N, mask, m-tiles of each phase).
"""

import numpy as np
import pytest
from _fp16 import check_backward, make
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kernels.perf import bwd_fp16_v3
from kernels.reference import attention_forward


@st.composite
def cases(draw):
    """Two warps at d = 32 (every m-tile split of the three phases is valid there); one or two
    query heads on one or two kv heads; up to two query and two key blocks of 32."""
    h, hkv = draw(st.sampled_from([(1, 1), (2, 1), (2, 2)]))
    m = st.sampled_from([1, 2])
    return dict(seed=draw(st.integers(0, 2**16)), h=h, hkv=hkv, nq=draw(st.integers(1, 64)),
                nk=draw(st.integers(1, 64)), d=32, causal=draw(st.booleans()),
                cfg=dict(bq=32, bk=32, nw=2, ma=draw(m), mb=draw(m), mc=draw(m)))


# GQA, causal with Nq > Nk (the first 7 rows see no key); two m-tiles a warp in every phase
GQA_CAUSAL = dict(seed=3, h=2, hkv=1, nq=37, nk=30, d=32, causal=True, cfg=dict(bq=32, bk=32, nw=2, ma=2, mb=2, mc=2))
# one m-tile a warp, the two warps along the keys (phases A, B) and the queries (phase C); two
# query blocks and two key blocks, the last of each partial
RAGGED = dict(seed=5, h=1, hkv=1, nq=45, nk=40, d=32, causal=False, cfg=dict(bq=32, bk=32, nw=2, ma=1, mb=1, mc=1))
# causal with two kv heads and two key blocks: longest_first's order (the l-th block issued takes
# key block l // 2 of kv head l % 2) covers every (key block, head) once
HEADS_FIRST = dict(seed=13, h=2, hkv=2, nq=45, nk=40, d=32, causal=True,
                   cfg=dict(bq=32, bk=32, nw=2, ma=1, mb=1, mc=1))
# d = 96 with two warps: 64 threads do not copy whole rows of 12 chunks a pass, so each pass's
# chunks cross rows (the copies' general path, which d = 96 takes with 8 warps too); ragged, GQA
WIDE = dict(seed=9, h=2, hkv=1, nq=21, nk=40, d=96, causal=True, cfg=dict(bq=32, bk=32, nw=2, ma=1, mb=1, mc=1))
# d = 80 with four warps: phases B and C with an odd number of n-tiles (5: the last x4 load's
# second half unused), and 320 chunks a tile over 128 threads (a partial last copy pass); on the
# GPU d = 16, 48, 80 and 112 take such paths at the default 8 warps (test_gpu_backward_head_dims)
ODD = dict(seed=11, h=2, hkv=1, nq=40, nk=37, d=80, causal=False, cfg=dict(bq=32, bk=32, nw=4, ma=1, mb=1, mc=1))


@settings(max_examples=1, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
@example(GQA_CAUSAL)
@example(RAGGED)
@example(HEADS_FIRST)
@example(WIDE)
@example(ODD)
def test_backward_fp16_v3(c):
    q, k, v, do = make(c["seed"], 1, c["h"], c["hkv"], c["nq"], c["nk"], c["d"])
    o, lse = (x.astype(t) for x, t in zip(attention_forward(q, k, v, causal=c["causal"]), (np.float16, np.float32)))
    grads = bwd_fp16_v3.backward(q, k, v, o, lse, do, causal=c["causal"], **c["cfg"])
    check_backward(grads, q, k, v, do, lse, c["causal"], label=str(c))


@pytest.mark.parametrize("c", [GQA_CAUSAL, RAGGED], ids=["gqa_causal", "ragged"])
def test_backward_fp16_v3_bulk_dq(c):
    """``bulkq`` (the default at d = 64 and from d = 112): dQ's tile through shared memory and one bulk reduction a row,
    the last step's sent after the loop; ragged rows send only those that exist."""
    from kernels.perf import bwd_fp16

    assert bwd_fp16.bulk_fits(c["d"], c["cfg"]["bq"], c["cfg"]["bk"])
    test_backward_fp16_v3.hypothesis.inner_test(dict(c, cfg=dict(c["cfg"], bulkq=True)))


@pytest.mark.parametrize("c", [GQA_CAUSAL, RAGGED], ids=["gqa_causal", "ragged"])
@pytest.mark.parametrize("bulkq", [False, True])
def test_backward_fp16_v3_one_q_buffer(c, bulkq):
    """``qbuf`` = 1: one buffer of Q and dO, the next step's copied after phase B behind a third
    barrier (room for ``bulkq``'s tile at d = 200-256); ragged and causal GQA, dQ by ``red.v2``
    and by bulk reductions."""
    test_backward_fp16_v3.hypothesis.inner_test(dict(c, cfg=dict(c["cfg"], qbuf=1, bulkq=bulkq)))


def test_bulkq_refused_where_the_tile_does_not_fit():
    from kernels.perf import bwd_fp16

    # the default at d = 64 (56 runs as 64) and from d = 112 bulk reductions, above d = 128 one Q/dO
    # buffer (two buffers leave room for
    # the tile up to d = 192, rounded up to 16), phase C on two m-tiles where d rounded up to 16
    # is a multiple of 32
    # but at d = 232 and 248 (the padded 240 and 256 spill with bulkq) red.v2 and two buffers
    on = [d for d in range(8, 257, 8) if bwd_fp16.default_config_v3(d)["bulkq"]]
    assert on == [56, 64, *range(104, 225, 8), 240, 256], on  # d = 104 runs as 112
    two_buffers = [d for d in range(136, 257, 8) if bwd_fp16.default_config_v3(d)["qbuf"] == 2]
    assert two_buffers == [232, 248], two_buffers
    for d in (232, 248):  # two buffers fit without dQ's tile
        c = bwd_fp16.default_config_v3(d)
        assert bwd_fp16.smem_bytes_v3(d, c["bq"], c["bk"], c["bulkq"], c["qbuf"]) <= bwd_fp16.SMEM_MAX
    assert [d for d in range(136, 257, 8) if bwd_fp16.bulk_fits(d, 64, 64)] == list(range(136, 193, 8))
    two = [d for d in range(136, 257, 8) if bwd_fp16.default_config_v3(d)["mc"] == 2]
    assert two == [152, 160, 184, 192, 216, 224, 248, 256]

    c = bwd_fp16.default_config_v3(256)
    assert not bwd_fp16.bulk_fits(256, c["bq"], c["bk"]) and bwd_fp16.bulk_fits(192, 64, 64)
    assert bwd_fp16.bulk_fits(256, 64, 64, qbuf=1)  # one Q and dO buffer makes room for the tile
    q, k, v, do = make(1, 1, 1, 1, 16, 16, 256)
    o, lse = (x.astype(t) for x, t in zip(attention_forward(q, k, v), (np.float16, np.float32)))
    with pytest.raises(ValueError, match="bulkq=True"):
        bwd_fp16_v3.backward(q, k, v, o, lse, do, bulkq=True, qbuf=2)
    with pytest.raises(ValueError, match="qbuf=3"):
        bwd_fp16_v3.backward(q, k, v, o, lse, do, qbuf=3)


def test_backward_fp16_v3_head_dim_pad_in_poisoned_shared_memory(poisoned):
    """d = 40 (d % 16 = 8) runs as 48 in shared memory: the column chunk past d of K, V, Q and dO,
    which phase A's k-steps read and no copy writes, must be zeros (the simulator's shared memory
    is NaN-filled here, as a GPU's holds whatever was there), and dQ's n-tile past d is not
    reduced; GQA, causal, ragged."""
    q, k, v, do = make(13, 1, 2, 1, 21, 37, 40)
    o, lse = (x.astype(t) for x, t in zip(attention_forward(q, k, v, causal=True), (np.float16, np.float32)))
    grads = bwd_fp16_v3.backward(q, k, v, o, lse, do, causal=True, bq=32, bk=32, nw=2, ma=1, mb=1, mc=1)
    check_backward(grads, q, k, v, do, lse, True, label="d=40 poisoned")


def test_layout_rejects_what_the_warps_cannot_split():
    base = dict(bq=64, bk=128, nw=8, ma=2, mb=2, mc=2)
    for bad in (dict(nw=16), dict(bq=24), dict(bk=40), dict(ma=3), dict(mb=16), dict(mc=8), dict(nw=6),
                dict(bq=8)):
        with pytest.raises(ValueError) as e:
            bwd_fp16_v3.layout(128, **(base | bad))
        print(bad, e.value)
    with pytest.raises(ValueError, match="part of an n-tile"):
        bwd_fp16_v3.layout(48, **base)  # phase C: 4 warps across 48 columns
    with pytest.raises(ValueError, match="multiple of 16"):
        bwd_fp16_v3.layout(24, **(base | dict(nw=3, bq=96, bk=96)))
    assert bwd_fp16_v3.layout(128, **base) == dict(wak=4, na=4, wbk=4, nb=8, wcq=2, nc=4, rows=16)
    assert bwd_fp16_v3.layout(96, **(base | dict(mc=1)))["rows"] == 0  # a pass's chunks cross rows
    assert bwd_fp16_v3.layout(80, **(base | dict(mc=1)))["nb"] == 5  # odd n-tiles in phases B and C
    assert [d for d in range(8, 265, 8) if bwd_fp16_v3.supports(np.float16, d)] == list(range(16, 257, 8))
    for d in range(16, 257, 8):  # every default block fits an H100 SM's 227 KB
        c = bwd_fp16_v3.default_config(d)
        assert bwd_fp16_v3.smem_bytes(d, c["bq"], c["bk"]) <= 227 * 1024, (d, c)
    assert not bwd_fp16_v3.supports(np.float32, 64)
    assert bwd_fp16_v3.smem_bytes(128, 64, 128) <= 227 * 1024  # one block of 8 warps fits an SM


@pytest.mark.gpu
@pytest.mark.parametrize("d", [16, 32, 48, 80, 96, 112, 144, 160, 176, 192, 224, 256, 40, 72, 200, 136, 184,
                               232, 248])
def test_gpu_backward_head_dims(d):
    """The default block (8 warps; 128 x 128 at d = 32, 48 and 80, 64 keys above d = 128, 64 x 128
    else) at head dims whose copy passes cross rows, end in a partial pass or whose phases B and
    C end in an odd n-tile, and above d = 128 (dQ by bulk reductions up to d = 192, 136 and 184
    with rows of d + 8 in shared memory; 232 and 248 by red.v2 beside two Q/dO buffers): GQA
    4:2, ragged N with Nq > Nk, causal and not."""
    _gpu_ragged_gqa(d)


def _gpu_ragged_gqa(d, **cfg):
    """GQA 4:2, Nq = 1,000 over Nk = 777, causal and not, at head dim d with ``cfg`` over the
    default block."""
    q, k, v, do = make(d, 2, 4, 2, 1000, 777, d)
    for causal in (False, True):
        o, lse = bwd_fp16_v3.saved_forward(q, k, v, causal=causal)
        grads = bwd_fp16_v3.backward(q, k, v, o, lse, do, causal=causal, **cfg)
        check_backward(grads, q, k, v, do, lse, causal, label=f"gpu d={d} {cfg} causal={causal}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 48, 64])
def test_gpu_backward_bulk_square_block(d):
    """dQ by bulk reductions from the 128 x 128 block (d = 32-64, where its tile fits beside two
    Q/dO buffers): ragged GQA, causal and not."""
    _gpu_ragged_gqa(d, bulkq=True)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [200, 224, 256])
def test_gpu_backward_one_q_buffer_red(d):
    """``qbuf`` = 1 with dQ by ``red.v2`` at the head dims it is for (the default there, one buffer
    with bulk reductions, is test_gpu_backward_head_dims'): ragged GQA, causal and not."""
    _gpu_ragged_gqa(d, qbuf=1, bulkq=False)
