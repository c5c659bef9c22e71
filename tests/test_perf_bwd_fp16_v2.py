"""bwd_fp16_v2 (one kernel, Pᵀ and dSᵀ through shared memory, dQ by atomics) against the float64
reference, under the CUDA simulator, by the 2x rule against plain fp16 attention.

Two warps at most and tiny shapes (one Python thread per simulated lane): ragged N, a padded head
dim (24 → 32 columns), GQA, causal with Nq > Nk (rows that see no key), warps sharing a key tile
in phase A (bk = 16) and both dQ reductions (8 bytes, and 16 bytes after a lane-pair swap).
"""

import numpy as np
import pytest
from _fp16 import check_backward, make

from kernels.perf import bwd_fp16_v2
from kernels.reference import attention_forward

CASES = [
    # GQA, causal with Nq > Nk (the first 7 rows see no key), 16-byte reductions
    dict(seed=3, h=2, hkv=1, nq=37, nk=30, d=32, causal=True,
         cfg=dict(bq=32, bk=32, nw=2, wkv=1, wq=2, reg=True, vred=4)),
    # d = 24 padded to 32, two warps sharing a key tile in phase A, 8-byte reductions
    dict(seed=4, h=1, hkv=1, nq=21, nk=40, d=24, causal=False,
         cfg=dict(bq=32, bk=16, nw=2, wkv=1, wq=1, reg=False, vred=2)),
]


@pytest.mark.parametrize("c", CASES, ids=["gqa-causal-v4", "pad-shared-tile-v2"])
def test_backward_fp16_v2(c):
    q, k, v, do = make(c["seed"], 1, c["h"], c["hkv"], c["nq"], c["nk"], c["d"])
    o, lse = (x.astype(t) for x, t in zip(attention_forward(q, k, v, causal=c["causal"]), (np.float16, np.float32)))
    grads = bwd_fp16_v2.backward(q, k, v, o, lse, do, causal=c["causal"], **c["cfg"])
    check_backward(grads, q, k, v, do, lse, c["causal"], label=str(c["cfg"]))


def test_layout_rejects_what_the_warps_cannot_split():
    for bad in (dict(bq=24), dict(bk=48), dict(bq=16, bk=16, nw=4), dict(wkv=3), dict(wq=4, bq=32),
                dict(nw=16), dict(bq=512)):
        args = dict(bq=64, bk=64, nw=8, wkv=2, wq=2) | bad
        with pytest.raises(ValueError) as e:
            bwd_fp16_v2.layout(128, **args)
        print(bad, e.value)
    with pytest.raises(ValueError, match="odd number of n-tiles"):
        bwd_fp16_v2.layout(40, 64, 64, 4, 2, 2)  # 48 columns = 6 n-tiles: 3 per column group
    assert bwd_fp16_v2.layout(128, 64, 64, 8, 2, 2) == dict(qa=2, mb=2, rd=4, nob=4, mc=2, wdc=4, noc=4)
    for d in range(8, 129, 8):  # every supported head dim has a default its warps can split
        cfg = bwd_fp16_v2.default_config(d)
        bwd_fp16_v2.layout(d, cfg["bq"], cfg["bk"], cfg["nw"], cfg["wkv"], cfg["wq"])
    assert not bwd_fp16_v2.supports(np.float16, 136) and not bwd_fp16_v2.supports(np.float32, 64)
