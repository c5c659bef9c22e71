"""Inputs and the verdict shared by the fast fp16 backward tests (test_perf_kernels,
test_perf_bwd_fp16_v3)."""

from __future__ import annotations

import numpy as np

from kernels.reference import judge_low_precision_backward


def make(seed, b, h, hkv, nq, nk, d, scale=1.0):
    """fp16 Q, K, V, dO from standard normals (Q and K times ``scale``); K, V with ``hkv`` heads."""
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((b, h, nq, d)) * scale).astype(np.float16)
    k = (rng.standard_normal((b, hkv, nk, d)) * scale).astype(np.float16)
    v = rng.standard_normal((b, hkv, nk, d)).astype(np.float16)
    do = rng.standard_normal((b, h, nq, d)).astype(np.float16)
    return q, k, v, do


def check_backward(grads, q, k, v, do, lse, causal, label=""):
    """fp16 gradients within 2x plain fp16 attention's error against float64 (printed first), and
    dQ = 0 on the rows that see no key (causal with Nq > Nk: L = -inf)."""
    verdicts = judge_low_precision_backward(grads, q, k, v, do, causal=causal)
    for name, j in verdicts.items():
        print(f"{name} {label}: {j}")
    assert all(g.dtype == np.float16 for g in grads)
    assert all(j.ok for j in verdicts.values()), {n: str(j) for n, j in verdicts.items()}
    nq, nk = q.shape[2], k.shape[2]
    blind = np.isneginf(np.asarray(lse))
    assert blind.sum() == q.shape[0] * q.shape[1] * (max(0, nq - nk) if causal else 0)
    assert np.all(np.asarray(grads[0])[blind] == 0), "rows that see no key get dQ = 0"
