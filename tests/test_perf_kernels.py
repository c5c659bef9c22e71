"""The fast kernels (kernels/perf) against the float64 reference, under the CUDA simulator.

The simulator runs the tensor-core helpers' Python twins (kernels/perf/tc_sim.py): each simulated
lane ends up with exactly the fragment registers the hardware would give it, so these tests check
the kernels' indexing, masking, online softmax and fragment bookkeeping; the GPU run
(``kernels.gpucheck --impl fast``, ``pytest -m gpu``) checks the PTX does the same.  Sizes are
tiny (a warp per 16 rows, one Python thread per lane) and block shapes small, so that tiles are
ragged and several blocks exist.  fp16 is judged by the 2x rule against plain fp16 attention.
"""

import textwrap

import numpy as np
import pytest
from _fp16 import make
from _ptx import run_without_simulator
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kernels
from kernels.perf import bwd_fp16_v1, fwd_fp16_v3, fwd_fp16_v4, fwd_fp32_v1
from kernels.reference import (
    attention_forward,
    judge_low_precision,
    judge_low_precision_backward,
    rel_error,
)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                derandomize=True)
FWD = {"v3": fwd_fp16_v3, "v4": fwd_fp16_v4}


def check_forward(o, lse, q, k, v, causal, scale=None, label=""):
    j = judge_low_precision(o, q, k, v, causal=causal, scale=scale)
    print(f"fwd {label}: {j}")
    assert o.dtype == np.float16 and j.ok, str(j)
    _, ref_lse = attention_forward(q, k, v, causal=causal, scale=scale)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows that see no key must get L = -inf"
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-4, atol=1e-4)
    assert np.all(o[~fin] == 0), "rows that see no key must get O = 0"


@st.composite
def fwd_cases(draw):
    hkv = draw(st.sampled_from([1, 2]))
    return dict(variant=draw(st.sampled_from(["v3", "v4"])), hkv=hkv, h=hkv * draw(st.sampled_from([1, 2])),
                nq=draw(st.integers(1, 40)), nk=draw(st.integers(1, 40)), d=draw(st.sampled_from([8, 16, 24, 32])),
                causal=draw(st.booleans()), bc=draw(st.sampled_from([16, 32])), nw=draw(st.sampled_from([1, 2])),
                mt=draw(st.sampled_from([1, 2])), qreg=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


# Hard cases first: GQA with Nq > Nk causal (rows that see nothing, ragged tiles), Nq < Nk causal,
# d = 24 (padded to 32 on chip), and N = 1 both ways.
@settings(max_examples=4, **SETTINGS)
@given(fwd_cases())
@example(dict(variant="v4", hkv=1, h=2, nq=37, nk=13, d=24, causal=True, bc=16, nw=1, mt=2, qreg=False, seed=1))
@example(dict(variant="v3", hkv=2, h=2, nq=11, nk=40, d=16, causal=True, bc=32, nw=2, mt=1, qreg=True, seed=2))
@example(dict(variant="v4", hkv=1, h=1, nq=1, nk=33, d=32, causal=False, bc=16, nw=1, mt=1, qreg=True, seed=3))
@example(dict(variant="v4", hkv=1, h=1, nq=20, nk=1, d=8, causal=True, bc=16, nw=1, mt=1, qreg=True, seed=4))
def test_forward(c):
    q, k, v, _ = make(c["seed"], 1, c["h"], c["hkv"], c["nq"], c["nk"], c["d"])
    cfg = {x: c[x] for x in ("bc", "nw", "mt", "qreg")}
    o, lse = FWD[c["variant"]].forward(q, k, v, causal=c["causal"], return_lse=True, **cfg)
    check_forward(o, lse, q, k, v, c["causal"], label=str(c))


def test_forward_large_logits_rescale_exactly():
    """Scores up to ~1e4 (scale 1): v4 moves its reference max only when a row's max grows by
    more than 2^8, so blocks arrive both below and above the threshold; the result must stay
    finite and as exact as plain fp16 attention."""
    q, k, v, _ = make(7, 1, 2, 1, 30, 50, 16, scale=6.0)
    s = q[0, 0].astype(np.float64) @ k[0, 0].T.astype(np.float64)
    print(f"max |q·k| = {np.abs(s).max():.3e}")
    assert np.abs(s).max() > 1e2
    for name, mod in FWD.items():
        o, lse = mod.forward(q, k, v, scale=1.0, return_lse=True, bc=16, nw=1, mt=1)
        assert np.isfinite(o).all() and np.isfinite(lse).all()
        check_forward(o, lse, q, k, v, False, scale=1.0, label=f"{name} large logits")


@st.composite
def fp32_cases(draw):
    hkv = draw(st.sampled_from([1, 2]))
    return dict(hkv=hkv, h=hkv * draw(st.sampled_from([1, 2])), nq=draw(st.integers(1, 40)),
                nk=draw(st.integers(1, 40)), d=draw(st.sampled_from([4, 12, 16, 20, 32])),
                causal=draw(st.booleans()), bc=draw(st.sampled_from([16, 32])), nw=draw(st.sampled_from([1, 2])),
                rm=draw(st.sampled_from([1, 2])), unroll=draw(st.sampled_from([1, 2])),
                scale=draw(st.sampled_from([None, 0.05, 1.0])), seed=draw(st.integers(0, 2**16)))


# fp32 (exact FFMA products, no TF32): ‖O − ref‖/‖ref‖ near 1e-7; rows that see no key get O = 0
# and L = -inf.  d = 20 and 12 are not multiples of 16 (padded on chip), N = 1 both ways.
@settings(max_examples=3, **SETTINGS)
@given(fp32_cases())
@example(dict(hkv=1, h=2, nq=37, nk=13, d=20, causal=True, bc=16, nw=1, rm=2, unroll=2, scale=None, seed=1))
@example(dict(hkv=2, h=2, nq=1, nk=33, d=12, causal=False, bc=32, nw=2, rm=1, unroll=1, scale=None, seed=2))
@example(dict(hkv=1, h=1, nq=19, nk=1, d=4, causal=True, bc=16, nw=1, rm=1, unroll=2, scale=None, seed=3))
def test_forward_fp32(c):
    rng = np.random.default_rng(c["seed"])
    q = rng.standard_normal((1, c["h"], c["nq"], c["d"])).astype(np.float32)
    k, v = (rng.standard_normal((1, c["hkv"], c["nk"], c["d"])).astype(np.float32) for _ in range(2))
    cfg = {x: c[x] for x in ("bc", "nw", "rm", "unroll")}
    o, lse = fwd_fp32_v1.forward(q, k, v, causal=c["causal"], scale=c["scale"], return_lse=True, **cfg)
    ref, ref_lse = attention_forward(q, k, v, causal=c["causal"], scale=c["scale"])
    diff = np.abs(o.astype(np.float64) - ref)
    err = rel_error(o, ref)
    print(f"fp32 {c}: rel err {err:.3e}, max abs {diff.max():.3e}, mean abs {diff.mean():.3e}")
    assert o.dtype == np.float32 and err <= 2e-6
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-6, atol=1e-6)
    assert np.all(o[~fin] == 0)


def test_forward_fp32_large_logits():
    """Scores up to ~1e4: the exponent is (s − m)·τ log2 e, not s·τlog2e − m·τlog2e, so the
    kernel stays as exact as at small logits (the fused form loses ~ulp(1e4) per exponent)."""
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 1, 24, 16)).astype(np.float32) * f for f in (25.0, 25.0, 1.0))
    s = q[0, 0].astype(np.float64) @ k[0, 0].T.astype(np.float64)
    print(f"max |q·k| = {np.abs(s).max():.3e}")
    assert np.abs(s).max() > 5e3
    o, lse = fwd_fp32_v1.forward(q, k, v, scale=1.0, return_lse=True, bc=16, nw=1, rm=1)
    ref, ref_lse = attention_forward(q, k, v, scale=1.0)
    err = rel_error(o, ref)
    print(f"large logits fp32: rel err {err:.3e}, max abs {np.abs(o - ref).max():.3e}")
    assert np.isfinite(o).all() and err <= 2e-6
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)


@st.composite
def bwd_cases(draw):
    hkv = draw(st.sampled_from([1, 2]))
    return dict(hkv=hkv, h=hkv * draw(st.sampled_from([1, 2])), nq=draw(st.integers(1, 36)),
                nk=draw(st.integers(1, 36)), d=draw(st.sampled_from([16, 24, 32])), causal=draw(st.booleans()),
                bq=draw(st.sampled_from([16, 32])), bk=draw(st.sampled_from([16, 32])),
                nw=draw(st.sampled_from([1, 2])), reg=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=2, **SETTINGS)
@given(bwd_cases())
@example(dict(hkv=1, h=2, nq=35, nk=18, d=16, causal=True, bq=16, bk=16, nw=2, reg=True, seed=5))
@example(dict(hkv=2, h=2, nq=21, nk=36, d=24, causal=True, bq=16, bk=32, nw=1, reg=False, seed=6))
def test_backward(c):
    q, k, v, do = make(c["seed"], 1, c["h"], c["hkv"], c["nq"], c["nk"], c["d"])
    o, lse = kernels.flash_attention(q, k, v, causal=c["causal"], return_lse=True, impl="reference")
    cfg = {x: c[x] for x in ("bq", "bk", "nw", "reg")}
    grads = bwd_fp16_v1.backward(q, k, v, o, lse, do, causal=c["causal"], mt=1, **cfg)
    verdicts = judge_low_precision_backward(grads, q, k, v, do, causal=c["causal"])
    for name, j in verdicts.items():
        print(f"bwd {name} {c}: {j}")
    assert all(g.dtype == np.float16 for g in grads)
    assert all(j.ok for j in verdicts.values()), {n: str(j) for n, j in verdicts.items()}


def test_public_api_picks_the_fast_kernels_where_they_apply():
    q, k, v, do = make(9, 1, 1, 1, 24, 20, 16)
    o, lse = kernels.flash_attention(q, k, v, causal=True, return_lse=True)  # auto: the fast forward
    check_forward(o, lse, q, k, v, True, label="auto")
    o_ref = kernels.flash_attention(q, k, v, causal=True, impl="reference")
    check_forward(o_ref, attention_forward(q, k, v, causal=True)[1], q, k, v, True, label="reference")
    grads = kernels.flash_attention_backward(q, k, v, o, lse, do, causal=True)
    assert all(j.ok for j in judge_low_precision_backward(grads, q, k, v, do, causal=True).values())
    q32, k32, v32, do32 = (x.astype(np.float32) for x in (q, k, v, do))
    o32, lse32 = kernels.flash_attention(q32, k32, v32, causal=True, return_lse=True, impl="fast")  # fwd_fp32_v1
    ref32, _ = attention_forward(q32, k32, v32, causal=True)
    assert rel_error(o32, ref32) <= 2e-6
    with pytest.raises(ValueError, match="impl='fast'"):  # fp32 takes d % 4 == 0 only
        kernels.flash_attention(q32[..., :15], k32[..., :15], v32[..., :15], impl="fast")
    with pytest.raises(ValueError, match="reference kernel only"):
        kernels.flash_attention(q, k, v, impl="fast", block_m=16, block_n=16)
    with pytest.raises(ValueError, match="impl="):
        kernels.flash_attention(q, k, v, impl="fastest")
    # d = 59 is not a multiple of 8: auto falls back to the reference kernel
    q59, k59, v59, _ = make(10, 1, 1, 1, 9, 9, 59)
    assert kernels.flash_attention(q59, k59, v59).shape == q59.shape


@pytest.mark.parametrize("variant,args", [("fwd_fp16_v4", (64, 64, 4, 2, 0, 1)), ("fwd_fp16_v4", (128, 16, 4, 2, 1, 1)),
                                          ("bwd_fp16_v1:dkdv", (64, 64, 4, 1, 0, 1)),
                                          ("bwd_fp16_v1:dq", (64, 64, 4, 1, 1, 1)),
                                          ("bwd_fp16_v3", (64, 64, 128, 8, 2, 2, 2, 0)),
                                          ("bwd_fp16_v3", (128, 64, 128, 8, 2, 2, 2, 1)),
                                          ("bwd_fp32_v2", (128, 64, 64, 8, 0, 4)),
                                          ("fwd_fp32_v2", (128, 32, 4, 1, 1, 4, 1))])
def test_sm90_ptx_uses_tensor_cores_without_local_memory(variant, args):
    """The default shapes, compiled for sm_90 with the helpers linked by LTO (no GPU needed):
    mma.sync in the PTX and no local memory (the fragment arrays live in registers); then, through
    the test extra's ptxas and cuobjdump, no CALL in the SASS of the main loop (a library routine
    there: bwd_fp16_v3's loop once called the 64-bit division routine 7 times a step, 8-10% of its
    time on the H100).  Run in a subprocess because this test session runs the CUDA simulator,
    which cannot compile."""
    code = textwrap.dedent(f"""
        from kernels.perf.inspect import lto_ptx, sass_report
        ptx = lto_ptx({variant!r}, *{args!r})
        rep = sass_report(ptx)
        assert "loop_HMMA" in rep, rep  # the test extra's ptxas, cuobjdump and nvdisasm
        print(ptx.count("mma.sync"), ".local" in ptx, rep["loop_HMMA"], rep["loop_CALL"], rep["loop_local"],
              rep["loop_instructions"], rep["registers"])
    """)
    res = run_without_simulator(code)
    assert res.returncode == 0, res.stderr[-2000:]
    mmas, local, hmma, calls, spills, loop, regs = res.stdout.split()
    print(f"{variant}{args}: {mmas} mma.sync, local memory: {local}; SASS: {regs} registers, main loop "
          f"{loop} instructions, {hmma} HMMA, {calls} CALL, {spills} LDL/STL")
    assert int(mmas) >= 64 and local == "False"
    # bwd_fp32_v2's loop still divides by the run-time block count (it // nblk, it % nblk: 4 calls
    # of the 64-bit routine), as the fp16 backwards did before 084c0c9: the change that took those
    # out is not yet run on a GPU for it (kernels/perf/NOTES.md); the count is pinned until it is.
    assert int(hmma) >= 32 and int(calls) == (4 if variant == "bwd_fp32_v2" else 0)


def test_deterministic_backward_runs_no_kernel_with_atomics(monkeypatch):
    """deterministic=True passes over the variants that sum dQ by atomics (kernels.perf.ATOMIC):
    bwd_fp16_v1 for fp16 at d = 64 (v3 otherwise), the reference kernels for fp32 (and a
    ValueError naming it with impl="fast"); None takes torch's setting for torch tensors."""
    from kernels import perf

    assert perf.best("bwd", np.float16, 64).name == "bwd_fp16_v3"
    assert perf.best("bwd", np.float16, 64, deterministic=True).name == "bwd_fp16_v1"
    assert perf.best("bwd", np.float16, 96, deterministic=True).name == "bwd_fp16_v1"
    assert perf.best("bwd", np.float32, 64).name == "bwd_fp32_v2"
    assert perf.best("bwd", np.float32, 64, deterministic=True) is None
    assert perf.best("fwd", np.float16, 64, deterministic=True).name == "fwd_fp16_v7"
    ran = []
    for name in ("bwd_fp16_v1", "bwd_fp16_v3"):
        monkeypatch.setattr(perf.variant(name), "backward", lambda *a, name=name, **kw: ran.append(name))
    monkeypatch.setattr(kernels._flash2, "backward", lambda *a, **kw: ran.append("reference"))
    q, k, v, do = make(11, 1, 1, 1, 16, 16, 64)
    lse = np.zeros((1, 1, 16), np.float32)
    kernels.flash_attention_backward(q, k, v, q, lse, do)
    kernels.flash_attention_backward(q, k, v, q, lse, do, deterministic=True)
    q32 = q.astype(np.float32)
    kernels.flash_attention_backward(q32, q32, q32, q32, lse, q32, deterministic=True)
    assert ran == ["bwd_fp16_v3", "bwd_fp16_v1", "reference"]
    with pytest.raises(ValueError, match="impl='fast': no fast deterministic bwd kernel"):
        kernels.flash_attention_backward(q32, q32, q32, q32, lse, q32, deterministic=True, impl="fast")
    kernels.flash_attention_backward(q, k, v, q, lse, do, deterministic=np.True_)  # numpy bools count
    assert ran[-1] == "bwd_fp16_v1"
    for bad in ("yes", 1, 0.0):
        with pytest.raises(ValueError, match="deterministic=.*must be None or a bool"):
            kernels.flash_attention_backward(q, k, v, q, lse, do, deterministic=bad)
    torch = pytest.importorskip("torch")
    tq = torch.from_numpy(q)
    with _deterministic(torch):
        kernels.flash_attention_backward(tq, tq, tq, tq, torch.from_numpy(lse), tq)
    kernels.flash_attention_backward(tq, tq, tq, tq, torch.from_numpy(lse), tq)
    assert ran[-2:] == ["bwd_fp16_v1", "bwd_fp16_v3"]  # (torch's setting restored)


class _deterministic:
    """torch.use_deterministic_algorithms(True) for a with block, restored after."""

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        self.before = self.torch.are_deterministic_algorithms_enabled()
        self.torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        self.torch.use_deterministic_algorithms(self.before)


@pytest.mark.parametrize("kw", [["LPT"], ["LPT=yes"], ["1=1"]])
def test_inspect_refuses_a_bad_keyword(kw, capsys):
    """``kernels.perf.inspect --kw KEY=INT`` (a keyword of the source, e.g. ``LPT=1``): anything else
    ends in one usage error, exit 2, before any compiling."""
    from kernels.perf import inspect

    with pytest.raises(SystemExit) as e:
        inspect.main(["fwd_fp16_v7", "64", "64", "8", "1", "1", "0", "--kw", *kw])
    err = capsys.readouterr().err
    print(err)
    assert e.value.code == 2 and "--kw" in err
