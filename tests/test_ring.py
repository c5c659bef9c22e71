"""Ring attention over torch.distributed (kernels/ring.py): 2 processes, gloo, on the CPU.

Both ranks draw the same full inputs, take their shards (zig-zag for causal), run the ring
forward and backward, and compare their shards of O, L, dQ, dK, dV with single-device float64
attention of the whole sequence.  Two step backends: the float64 reference (the ring logic
alone: full and causal, grouped-query, exact to rounding) and our kernels under Numba's CUDA
simulator (fp32, the readable reference kernels with 4 x 4 tiles; causal through the autograd op,
full through ring_forward/ring_backward: within 1e-5 of float64).  Each rank writes its
errors to a JSON file; the test prints and asserts them.
"""

import json
import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from kernels.reference import attention_backward, attention_forward  # noqa: E402

WORLD = 2


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _inputs(b, h, hkv, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for shape in
            ((b, h, n, d), (b, hkv, n, d), (b, hkv, n, d), (b, h, n, d))]


def _case(rank, name, shape, causal, attn, dtype, autograd):
    from kernels.ring import ring_attention, ring_backward, ring_forward, shard

    q, k, v, do = _inputs(*shape, seed=7)
    scale = 1.0 / math.sqrt(shape[-1])
    ref_o, ref_l = attention_forward(q.numpy(), k.numpy(), v.numpy(), causal=causal, scale=scale)
    ref_dq, ref_dk, ref_dv = attention_backward(q.numpy(), k.numpy(), v.numpy(), do.numpy(), causal=causal,
                                                scale=scale)
    sq, sk, sv, sdo = (shard(x, rank, WORLD, causal).to(dtype) for x in (q, k, v, do))
    ref = {name_: shard(torch.from_numpy(np.ascontiguousarray(x)), rank, WORLD, causal)
           for name_, x in (("O", ref_o), ("L", ref_l), ("dQ", ref_dq), ("dK", ref_dk), ("dV", ref_dv))}
    if autograd:
        sq, sk, sv = (x.clone().requires_grad_() for x in (sq, sk, sv))
        o = ring_attention(sq, sk, sv, causal=causal, scale=scale, attn=attn)
        o.backward(sdo)
        got = {"O": o.detach(), "dQ": sq.grad, "dK": sk.grad, "dV": sv.grad}
    else:
        o, lse = ring_forward(sq, sk, sv, causal=causal, scale=scale, attn=attn)
        dq, dk, dv = ring_backward(sq, sk, sv, o, lse, sdo, causal=causal, scale=scale, attn=attn)
        got = {"O": o, "L": lse, "dQ": dq, "dK": dk, "dV": dv}
    return {f"{name}/{t}": _rel(x.detach().double().numpy(), ref[t].numpy()) for t, x in got.items()}


def _worker(rank, store, out):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    sys.setswitchinterval(2e-4)  # the CUDA simulator's thread hand-overs (as tests/conftest.py)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    from kernels.ring import KernelAttention, ReferenceAttention

    errors = {}
    try:
        ref = ReferenceAttention()
        for causal in (False, True):
            tag = "causal" if causal else "full"
            errors.update(_case(rank, f"reference/{tag}", (2, 4, 2, 24, 8), causal, ref, torch.float64, False))
        errors.update(_case(rank, "reference/causal/autograd", (1, 2, 1, 8, 4), True, ref, torch.float64, True))
        # our kernels under the CUDA simulator: the readable reference kernels with 4 x 4 tiles
        kern = KernelAttention(impl="reference", block_m=4, block_n=4)
        errors.update(_case(rank, "kernels/causal", (1, 1, 1, 8, 16), True, kern, torch.float32, True))
        errors.update(_case(rank, "kernels/full", (1, 1, 1, 8, 16), False, kern, torch.float32, False))
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(errors, f)


def test_ring_two_processes_gloo(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        errors = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for k, e in sorted(errors.items()):
            print(f"rank {rank} {k}: {e:.2e}")
        for k, e in errors.items():
            assert e < (1e-12 if k.startswith("reference") else 1e-5), (rank, k, e)
        assert {k.split("/")[-1] for k in errors} == {"O", "L", "dQ", "dK", "dV"}


def test_shard_unshard_and_blocks():
    from kernels.ring import shard, step_blocks, unshard

    x = torch.arange(16).view(1, 1, 16, 1)
    for world in (1, 2, 4):
        for causal in (False, True):
            parts = [shard(x, r, world, causal) for r in range(world)]
            assert torch.equal(unshard(parts, causal), x)
    assert shard(x, 0, 4, True).flatten().tolist() == [0, 1, 14, 15]
    assert shard(x, 3, 4, True).flatten().tolist() == [6, 7, 8, 9]
    assert step_blocks(3, 1, 4, 4, True)[0] == "lower" and step_blocks(0, 1, 4, 4, True)[0] == "upper"
    with pytest.raises(ValueError, match="seq_len=12"):
        shard(torch.zeros(1, 1, 12, 1), 0, 4, True)
    with pytest.raises(ValueError, match="world=0"):
        shard(x, 0, 0, False)
