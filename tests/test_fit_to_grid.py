"""flashsim.algorithms.fast.fit_to_grid: the fp16 forward's narrower blocks where its grid would
give each SM at most one block, the same rule in the kernel launcher and in the simulator's
``sms`` option."""

from __future__ import annotations

import numpy as np
import pytest

from flashsim import Workload
from flashsim.algorithms import fast
from flashsim.api import simulate

CFG64 = fast.default_config("fwd_fp16_v4", 64)  # Br = 16 · 4 warps · 2 m-tiles = 128


def test_rule_by_hand():
    # H100: 132 SMs.  B·H = 4, N = 4,096: 32 blocks a head, 128 in all <= 132: one m-tile.
    assert fast.fit_to_grid("fwd_fp16_v4", CFG64, {}, 4096, 4, 132, d=64) == dict(CFG64, mt=1)
    # 33 blocks a head: 132, still narrowed; 34: 136 > 132, as it was.  B·H = 16, N = 2,048: 256.
    assert fast.fit_to_grid("fwd_fp16_v4", CFG64, {}, 4096 + 128, 4, 132, d=64)["mt"] == 1
    assert fast.fit_to_grid("fwd_fp16_v4", CFG64, {}, 4096 + 129, 4, 132, d=64) == CFG64
    assert fast.fit_to_grid("fwd_fp16_v4", CFG64, {}, 2048, 16, 132, d=64) == CFG64
    # a ragged last block counts: N = 4,000 is still 32 blocks a head
    assert fast.fit_to_grid("fwd_fp16_v4", CFG64, {}, 4000, 4, 128, d=64)["mt"] == 1
    # mt given (by the caller or the tuner's cache): kept; other variants: unchanged
    assert fast.fit_to_grid("fwd_fp16_v4", CFG64, {"mt": 2}, 4096, 4, 132, d=64) == CFG64
    cfg32 = fast.default_config("fwd_fp32_v2", 64)
    assert fast.fit_to_grid("fwd_fp32_v2", cfg32, {}, 128, 1, 132, d=64) == cfg32
    # already one m-tile: unchanged
    one = dict(CFG64, mt=1)
    assert fast.fit_to_grid("fwd_fp16_v4", one, {}, 64, 1, 132, d=64) == one


def test_v5_rule_by_hand():
    """v5: two warpgroups (Br = 128) at d = 64 become one (Br = 64) where the 128-row grid gives
    each SM at most one block; d = 128 already runs one warpgroup; nw given: kept."""
    c64, c128 = fast.default_config("fwd_fp16_v5", 64), fast.default_config("fwd_fp16_v5", 128)
    assert (c64["nw"], c64["bc"], c128["nw"], c128["bc"]) == (8, 64, 4, 48)
    assert fast.fit_to_grid("fwd_fp16_v5", c64, {}, 4096, 4, 132, d=64) == dict(c64, nw=4)  # 128 blocks
    assert fast.fit_to_grid("fwd_fp16_v5", c64, {}, 4096 + 129, 4, 132, d=64) == c64  # 136 blocks
    assert fast.fit_to_grid("fwd_fp16_v5", c64, {}, 4096, 16, 132, d=64) == c64  # the bench grid: 512
    assert fast.fit_to_grid("fwd_fp16_v5", c64, {"nw": 8}, 4096, 4, 132, d=64) == c64
    # d = 128: Bc = 48 (three blocks an SM) becomes 64 where the grid is at most four blocks an SM
    assert fast.fit_to_grid("fwd_fp16_v5", c128, {}, 8192, 1, 132, d=128) == dict(c128, bc=64)  # 128 blocks
    assert fast.fit_to_grid("fwd_fp16_v5", c128, {}, 512, 66, 132, d=128) == dict(c128, bc=64)  # 528 blocks
    assert fast.fit_to_grid("fwd_fp16_v5", c128, {}, 512, 67, 132, d=128) == c128  # 536 blocks
    assert fast.fit_to_grid("fwd_fp16_v5", c128, {"bc": 48}, 8192, 1, 132, d=128) == c128
    # d = 192 (Bc = 48 too): Bc = 64 would leave one block an SM (123 KB of shared memory): kept
    c192 = fast.default_config("fwd_fp16_v5", 192)
    assert c192 == dict(bc=48, nw=4, mt=1, qreg=False, lpt=False, splits=1)
    assert fast.fit_to_grid("fwd_fp16_v5", c192, {}, 8192, 1, 132, d=192) == c192
    # above d = 192 two warpgroups, which a small grid narrows to one as at d = 64
    c256 = fast.default_config("fwd_fp16_v5", 256)
    assert fast.fit_to_grid("fwd_fp16_v5", c256, {}, 4096, 4, 132, d=256) == dict(c256, nw=4)


def test_simulator_option():
    """``sms`` narrows the simulated forward's tiles as the launcher narrows the kernel's: B·H = 4,
    N = 4,096, d = 64 on 132 SMs runs 64-row blocks, so K and V are read 64 times a head, not 32;
    walker == closed form either way."""
    w = Workload(batch=1, heads=4, seq_len_q=4096, head_dim=64, dtype="fp16")
    wide = simulate(w, "fast", "fwd", kernel="fwd_fp16_v4")
    narrow = simulate(w, "fast", "fwd", kernel="fwd_fp16_v4", sms=132)
    assert wide.agrees and narrow.agrees
    k_wide = wide.io.breakdown[("K", "read")].elements
    k_narrow = narrow.io.breakdown[("K", "read")].elements
    print(k_wide, k_narrow)
    assert k_wide == 4 * 32 * 4096 * 64 and k_narrow == 4 * 64 * 4096 * 64
    v4 = dict(kernel="fwd_fp16_v4")
    assert fast.blocks(w, None, sms=132, **v4) == (64, 64) and fast.blocks(w, None, **v4) == (128, 64)
    # the warpgroup forwards (v7 BEST at d = 64) narrow too: one warpgroup, 64 rows (this was (128, 64)
    # until the simulator's sms option applied fit_to_grid to v5 and v7 as their launcher does)
    assert fast.blocks(w, None, sms=132) == (64, 64) == fast.blocks(w, None, sms=132, kernel="fwd_fp16_v5")
    assert fast.blocks(w, None) == (128, 64)
    w128 = Workload(batch=1, heads=1, seq_len_q=8192, head_dim=128, dtype="bf16")  # 128 blocks: Bc 48 -> 64
    assert fast.blocks(w128, None, sms=132) == (64, 64) and fast.blocks(w128, None) == (64, 48)
    # a grid that fills the GPU: unchanged
    big = Workload(batch=4, heads=16, seq_len_q=4096, head_dim=64, dtype="fp16")
    assert (simulate(big, "fast", "fwd", kernel="fwd_fp16_v4", sms=132).io.to_dict()
            == simulate(big, "fast", "fwd", kernel="fwd_fp16_v4").io.to_dict())
    # mt given in config: kept
    assert fast.blocks(w, None, sms=132, config="mt=2", **v4) == (128, 64)


def test_bad_sms():
    for bad in (0, -1, 1.5, True, "132"):
        with pytest.raises(ValueError, match="sms="):
            simulate(Workload(batch=1, heads=1, seq_len_q=256, head_dim=64, dtype="fp16"), "fast", "fwd", sms=bad)
        with pytest.raises(ValueError, match="sms="):  # checked for every variant, not only the narrowed one
            simulate(Workload(batch=1, heads=1, seq_len_q=256, head_dim=64, dtype="fp16"), "fast", "bwd", sms=bad)


def test_launcher_narrows_under_the_simulator(monkeypatch):
    """The kernel launcher asks fit_to_grid with the device's SM count (pretended 1,000 here, so
    that a small grid narrows) and runs the narrowed blocks; O within the fp16 rule."""
    import kernels
    from kernels.perf import _launch
    from kernels.reference import judge_low_precision

    seen = []
    real = fast.fit_to_grid

    def spy(*a, **kw):
        out = real(*a, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(fast, "fit_to_grid", spy)
    monkeypatch.setattr(_launch, "num_sms", lambda: 1000)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 40, 16)).astype(np.float16) for _ in range(3))
    o = kernels.flash_attention(q, k, v, causal=True, impl="fast")
    print(seen)
    assert seen and seen[-1]["mt"] == 1
    j = judge_low_precision(o.astype(np.float32), q.astype(np.float32), k.astype(np.float32),
                            v.astype(np.float32), causal=True)
    print(j)
    assert j.ok


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("bh,n,d", [(1, 8192, 128), (4, 4096, 64)])
def test_gpu_narrowed_forward(dtype, bh, n, d, monkeypatch):
    """On the GPU the launcher narrows these grids (64 and 128 blocks of 128 rows, at most the
    SM count of an H100 or H200: fwd_fp16_v4 one m-tile a warp, v5 and v7 one warpgroup or Bc =
    64) and the narrowed forward is within 2x plain attention's error in the same dtype against
    float64 (on the first head's rows); B·H = 1 also split (split-KV)."""
    torch = pytest.importorskip("torch")
    import kernels
    from kernels.reference import judge_low_precision

    seen = []
    real = fast.fit_to_grid
    monkeypatch.setattr(fast, "fit_to_grid", lambda *a, **kw: seen.append((a[1], real(*a, **kw))) or seen[-1][1])
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(1, bh, n, d, device="cuda", dtype=dt, generator=gen) for _ in range(3))
    o = kernels.flash_attention(q, k, v, impl="fast")
    torch.cuda.synchronize()
    print(seen[-1])
    assert seen and seen[-1][1] != seen[-1][0]  # the launcher narrowed the default block
    # and split B·H = 1's 128 blocks of 64 rows in 2 (d = 128) where they fill at most the SMs
    from kernels.perf import _launch

    assert seen[-1][1].get("splits", 1) == (2 if bh == 1 and _launch.num_sms() >= 128 else 1)
    f = [x[:, :1].float().cpu().numpy() for x in (o, q, k, v)]
    j = judge_low_precision(f[0], *f[1:], dtype="bf16" if dtype == "bfloat16" else np.float16)
    print(dtype, bh, n, d, j)
    assert j.ok, str(j)


def test_lpt_rule_by_hand():
    """v5 and v7 keep grid order (``lpt`` off) where B·H exceeds the SM count, unless ``lpt`` is
    given or there is no SM count (0, the CUDA simulator's); the other forwards have no ``lpt``."""
    c = fast.default_config("fwd_fp16_v7", 96)
    assert c["lpt"]
    for bh, want in ((132, True), (133, False), (512, False), (64, True)):
        got = fast.fit_to_grid("fwd_fp16_v7", c, (), 512, bh, 132, 96, nk=512)
        print(bh, got)
        assert got["lpt"] is want
    assert fast.fit_to_grid("fwd_fp16_v7", c, ("lpt",), 512, 512, 132, 96, nk=512)["lpt"]
    assert fast.fit_to_grid("fwd_fp16_v7", c, (), 512, 512, 0, 96, nk=512)["lpt"]  # no SM count (the simulator)
    v5 = dict(fast.default_config("fwd_fp16_v5", 64), lpt=True)
    assert not fast.fit_to_grid("fwd_fp16_v5", v5, (), 512, 512, 132, 64, nk=512)["lpt"]
    v4 = fast.default_config("fwd_fp16_v4", 64)
    assert "lpt" not in fast.fit_to_grid("fwd_fp16_v4", v4, (), 512, 512, 132, 64, nk=512)


def test_split_rule_by_hand():
    """Split-KV where the grid (after the narrowing above) still gives each SM at most one block and
    d <= 128: 4 splits at d <= 64, 2 above, fewer where a split would keep under 32 key blocks;
    ``nk`` not given, splits given, or d > 128: none."""
    c64, c128 = fast.default_config("fwd_fp16_v7", 64), fast.default_config("fwd_fp16_v7", 128)
    # B·H = 1, N = 8,192: 128 blocks of 64 rows; 128 key blocks of 64
    assert fast.fit_to_grid("fwd_fp16_v7", c64, {}, 8192, 1, 132, d=64, nk=8192) == dict(c64, nw=4, splits=4)
    assert fast.fit_to_grid("fwd_fp16_v7", c128, {}, 8192, 1, 132, d=128, nk=8192) == dict(c128, bc=64, splits=2)
    assert fast.fit_to_grid("fwd_fp16_v7", c64, {}, 8192, 1, 132, d=64) == dict(c64, nw=4)  # no nk
    assert fast.fit_to_grid("fwd_fp16_v7", c64, {"splits": 1}, 8192, 1, 132, d=64, nk=8192) == dict(c64, nw=4)
    # N = 4,096: 64 key blocks, so 2 splits of 32 at d = 64 (4 would keep 16); N = 2,048: none
    assert fast.fit_to_grid("fwd_fp16_v7", c64, {}, 4096, 2, 132, d=64, nk=4096)["splits"] == 2
    assert fast.fit_to_grid("fwd_fp16_v7", c128, {}, 2048, 4, 132, d=128, nk=2048)["splits"] == 1
    # 136 blocks of 64 rows (B·H = 17, N = 512): more than the SMs, no split; d = 192: none
    assert fast.fit_to_grid("fwd_fp16_v7", c64, {}, 512, 17, 132, d=64, nk=1 << 20)["splits"] == 1
    c192 = fast.default_config("fwd_fp16_v7", 192)
    assert fast.fit_to_grid("fwd_fp16_v7", c192, {}, 8192, 1, 132, d=192, nk=8192)["splits"] == 1
    # v4 has no splits
    assert "splits" not in fast.fit_to_grid("fwd_fp16_v4", CFG64, {}, 8192, 1, 132, d=64, nk=8192)
    # the simulator's sms option takes the rule: two launches, Q read by each split
    w = Workload(batch=1, heads=1, seq_len_q=8192, head_dim=128, dtype="bf16")
    r = simulate(w, "fast", "fwd", sms=132)
    assert list(r.io.per_launch) == ["fwd_fp16_v7", "fwd_combine"] and r.agrees
    assert r.io.breakdown[("Q", "read")].elements == 2 * 8192 * 128
    with pytest.raises(ValueError, match="splits=65"):  # the kernels' bound (kernels.perf._launch checks it)
        simulate(w, "fast", "fwd", config="splits=65")
