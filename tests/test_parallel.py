"""Context-parallel schedules (flashsim.parallel): walker == closed form, hand counts for P = 2
and 4, the zig-zag blocks against the global causal mask, the roofline verdicts, bad input."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashsim.api import simulate
from flashsim.config import GPUS, Tiling, Workload, get_gpu
from flashsim.parallel import context_parallel

T2 = Tiling(2, 2)


def w1(n, causal=False, heads=1, kv_heads=None, dtype="fp32", d=4):
    return Workload(batch=1, heads=heads, kv_heads=kv_heads, seq_len_q=n, head_dim=d, dtype=dtype, causal=causal)


def el(r, device):
    return r.per_device[device].elements_by_key()


@st.composite
def cases(draw):
    p = draw(st.sampled_from([1, 2, 3, 4, 8]))
    parallel = draw(st.sampled_from(["ring", "ulysses"]))
    causal = draw(st.booleans())
    kv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2]))
    if parallel == "ulysses":
        kv *= p
    unit = 2 * p if parallel == "ring" and causal else p
    n = unit * draw(st.integers(1, 6))
    d = draw(st.sampled_from([1, 3, 8, 24, 59]))
    w = Workload(batch=draw(st.integers(1, 2)), heads=kv * group, kv_heads=kv, seq_len_q=n, head_dim=d,
                 dtype=draw(st.sampled_from(["fp32", "fp16", "bf16"])), causal=causal)
    tiling = Tiling(draw(st.integers(1, 9)), draw(st.integers(1, 9)))
    return w, p, parallel, tiling, draw(st.sampled_from(["fwd", "bwd", "fwd+bwd"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_walker_equals_closed_form(case):
    w, p, parallel, tiling, pass_ = case
    r = context_parallel(w, np.int64(p) if p % 2 else p, parallel, pass_, tiling=tiling)
    for a, b in zip(r.per_device, r.per_device_closed):
        assert a.elements_by_key() == b.elements_by_key()
        assert a.bytes_by_key() == b.bytes_by_key()
    assert r.agrees and len(r.per_device) == p


def test_one_device_ring_is_flash2():
    """P = 1 in fp32: the ring is the single-device kernel, its O and L named as partial outputs."""
    for causal in (False, True):
        w = w1(16, causal)
        for pass_ in ("fwd", "bwd"):
            r = context_parallel(w, 1, "ring", pass_, tiling=T2)
            ref = simulate(w, "flash2", pass_, tiling=T2).io.elements_by_key()
            names = {"O": "Os", "L": "Ls"} if pass_ == "fwd" else {"dQ": "dQs", "dK": "dKs", "dV": "dVs"}
            assert el(r, 0) == {(names.get(t, t), dr): v for (t, dr), v in ref.items()}
            assert r.sent_bytes == (0,) and r.exposed_steps == 0


def test_ring_forward_full_p2_p4_by_hand():
    # N = 8, d = 4, B = H = 1, fp32, 2 x 2 tiles.
    # P = 2: n = 4 rows per device, each step a 4 x 4 flash2 forward: Q read 4 rows x 4 = 16;
    # K and V read once per query block, Tr = 2 blocks x 4 rows x 4 = 32; Os written 16, Ls 4.
    # Two steps double those; step 1's merge reads Oacc 16, Lacc 4, Os 16, Ls 4 and writes Oacc
    # 16, Lacc 4 (step 0's Os/Ls are the accumulators: fp32, nothing moves); step 0 sends K and V
    # (read 16 each from HBM, written 16 each by the receiver).
    r = context_parallel(w1(8), 2, "ring", "fwd", tiling=T2)
    want = {("Q", "read"): 32, ("K", "read"): 64, ("V", "read"): 64, ("Os", "write"): 32, ("Ls", "write"): 8,
            ("Oacc", "read"): 16, ("Lacc", "read"): 4, ("Os", "read"): 16, ("Ls", "read"): 4,
            ("Oacc", "write"): 16, ("Lacc", "write"): 4,
            ("K@link", "read"): 16, ("K@link", "write"): 16, ("V@link", "read"): 16, ("V@link", "write"): 16}
    assert el(r, 0) == want and el(r, 1) == want
    # link: step 0 carries K and V, 2 x 16 elements x 4 bytes = 128 bytes; the last step nothing
    assert [s.link_bytes for s in r.device_steps(0)] == [128, 0]
    # P = 4: n = 2, Tr = 1: per step Q 8, K 8, V 8, Os 8, Ls 2; four steps; three merges of 2
    # rows (Oacc, Os: 8; Lacc, Ls: 2); three sends of K, V (8 elements each, 64 bytes per step).
    r = context_parallel(w1(8), 4, "ring", "fwd", tiling=T2)
    want = {("Q", "read"): 32, ("K", "read"): 32, ("V", "read"): 32, ("Os", "write"): 32, ("Ls", "write"): 8,
            ("Oacc", "read"): 24, ("Lacc", "read"): 6, ("Os", "read"): 24, ("Ls", "read"): 6,
            ("Oacc", "write"): 24, ("Lacc", "write"): 6,
            ("K@link", "read"): 24, ("K@link", "write"): 24, ("V@link", "read"): 24, ("V@link", "write"): 24}
    assert all(el(r, d) == want for d in range(4))
    assert [s.link_bytes for s in r.device_steps(2)] == [64, 64, 64, 0]
    assert r.sent_bytes == (192,) * 4


def test_ring_forward_causal_zigzag_by_hand():
    # N = 8, P = 2: chunks of c = 2; device 0 holds chunks 0 and 3 (rows 0, 1, 6, 7), device 1
    # chunks 1 and 2 (rows 2-5).  Step 0 (diag): causal 4 x 4 with 2 x 2 tiles: query block 0
    # loads key block 0 (2 rows), block 1 loads blocks 0, 1 (4 rows): K = V = 6 rows x 4 = 24;
    # Q 16, Os 16, Ls 4.
    diag = {("Q", "read"): 16, ("K", "read"): 24, ("V", "read"): 24, ("Os", "write"): 16, ("Ls", "write"): 4}
    # "upper" (K, V from a later device): 2 query rows against 4 keys, one query block:
    # Q 8, K = V = 16, Os 8, Ls 2; its merge touches 2 rows (Oacc, Os 8 each; Lacc, Ls 2).
    upper = {("Q", "read"): 8, ("K", "read"): 16, ("V", "read"): 16, ("Os", "write"): 8, ("Ls", "write"): 2,
             ("Oacc", "read"): 8, ("Os", "read"): 8, ("Lacc", "read"): 2, ("Ls", "read"): 2,
             ("Oacc", "write"): 8, ("Lacc", "write"): 2}
    # "lower" (K, V from an earlier device): 4 query rows against its first 2 keys, Tr = 2:
    # Q 16, K = V = 2 x 2 x 4 = 16, Os 16, Ls 4; merge of 4 rows (16 and 4).
    lower = {("Q", "read"): 16, ("K", "read"): 16, ("V", "read"): 16, ("Os", "write"): 16, ("Ls", "write"): 4,
             ("Oacc", "read"): 16, ("Os", "read"): 16, ("Lacc", "read"): 4, ("Ls", "read"): 4,
             ("Oacc", "write"): 16, ("Lacc", "write"): 4}

    def total(*parts, sends):
        out = {}
        for part in parts:
            for k, v in part.items():
                out[k] = out.get(k, 0) + v
        for t in ("K@link", "V@link"):
            for dr in ("read", "write"):
                out[(t, dr)] = 16 * sends  # n = 4 rows x 4
        return out

    r = context_parallel(w1(8, causal=True), 2, "ring", "fwd", tiling=T2)
    assert [s.kind for s in r.device_steps(0)] == ["diag", "upper"]
    assert [s.kind for s in r.device_steps(1)] == ["diag", "lower"]
    assert el(r, 0) == total(diag, upper, sends=1)
    assert el(r, 1) == total(diag, lower, sends=1)
    # P = 4, N = 16, c = 2: device r has r lower steps and 3 - r upper ones.
    r = context_parallel(w1(16, causal=True), 4, "ring", "fwd", tiling=T2)
    assert el(r, 0) == total(diag, upper, upper, upper, sends=3)
    assert el(r, 3) == total(diag, lower, lower, lower, sends=3)
    assert el(r, 1) == total(diag, lower, upper, upper, sends=3)
    # every step after the first computes the same 2c^2 = 8 scores on every device (balanced)
    assert {s.matmul_flops for s in r.steps if s.index > 0} == {2 * 2 * 4 * 8}


def test_zigzag_blocks_match_the_global_causal_mask():
    for p in (1, 2, 3, 4, 8):
        n_total = 2 * p * 3
        c = 3
        mask = np.tril(np.ones((n_total, n_total), dtype=bool))
        rows = [np.r_[i * c:(i + 1) * c, (2 * p - 1 - i) * c:(2 * p - i) * c] for i in range(p)]
        r = context_parallel(w1(n_total, causal=True), p, "ring", "fwd", tiling=T2)
        for dev in range(p):
            for s in r.device_steps(dev):
                src = (dev - s.index) % p
                sub = mask[np.ix_(rows[dev], rows[src])]
                if s.kind == "diag":
                    assert (sub == np.tril(np.ones((2 * c, 2 * c), dtype=bool))).all()
                elif s.kind == "lower":
                    assert sub[:, :c].all() and not sub[:, c:].any()
                else:
                    assert s.kind == "upper" and sub[c:, :].all() and not sub[:c, :].any()


def test_ring_backward_p2_by_hand():
    # N = 8, P = 2, n = 4, fp32, 2 x 2 tiles; each step a 4 x 4 flash2 backward: its pre-pass
    # reads O 16 and dO 16 and writes D 4; dK/dV reads K, V once (16) and Q, dO, L, D once per
    # key block (Tc = 2: 8 rows); dQ reads Q, dO, L, D (4 rows) and K, V once per query block
    # (Tr = 2: 8 rows).  So Q 12 rows = 48, dO 16 + 48 = 64, L 12, D read 12, K = V = 16 + 32 = 48,
    # dKs = dVs = dQs = 16 written.  Step 1's accumulations read acc and step (16 + 16) and
    # write 16, for dQ, dK, dV.  Links: step 0 sends K, V (16 each); step 1 sends the dK, dV
    # accumulators of step 0 (fp32, 16 each); the last sends take them home (16 each).
    step = {("O", "read"): 16, ("dO", "read"): 64, ("D", "write"): 4, ("Q", "read"): 48, ("L", "read"): 12,
            ("D", "read"): 12, ("K", "read"): 48, ("V", "read"): 48, ("dKs", "write"): 16, ("dVs", "write"): 16,
            ("dQs", "write"): 16}
    want = {k: 2 * v for k, v in step.items()}
    for a in ("dQ", "dK", "dV"):
        want[(f"{a}acc", "read")] = 16
        want[(f"{a}s", "read")] = 16
        want[(f"{a}acc", "write")] = 16
    for t, sends in (("K@link", 1), ("V@link", 1), ("dK@link", 2), ("dV@link", 2)):
        want[(t, "read")] = want[(t, "write")] = 16 * sends
    r = context_parallel(w1(8), 2, "ring", "bwd", tiling=T2)
    assert el(r, 0) == want and el(r, 1) == want
    # bytes on the link: K, V in fp32 (128); dK, dV accumulators, fp32 (128) with step 1's and the
    # final step's
    assert [(s.kind, s.link_bytes) for s in r.device_steps(0)] == [("full", 128), ("full", 128), ("final", 128)]


def test_ulysses_p2_p4_by_hand():
    # P = 2: B = 1, H = 2, N = 8, d = 4, fp32.  The all-to-all reads the device's Q, K, V shards
    # (4 rows x 4 x 2 heads = 32 each) and writes what it receives (32 each); the attention is
    # flash2 on one head, all 8 rows, 2 x 2 tiles: Q 32, K = V = Tr (4) x 8 x 4 = 128, O 32,
    # L 8; O goes back: 32 read, 32 written.
    want = {("Q", "read"): 32, ("K", "read"): 128, ("V", "read"): 128, ("O", "write"): 32, ("L", "write"): 8}
    for t in ("Q", "K", "V", "O"):
        want[(f"{t}@link", "read")] = want[(f"{t}@link", "write")] = 32
    r = context_parallel(w1(8, heads=2), 2, "ulysses", "fwd", tiling=T2)
    assert el(r, 0) == want and el(r, 1) == want
    # a switch: each device sends (P-1)/P of Q, K, V (3 x 128 bytes): 192 bytes; O: 64
    assert [(s.kind, s.link_bytes) for s in r.device_steps(0)] == [("a2a_in", 192), ("attn", 0), ("a2a_out", 64)]
    # P = 4, H = 4: shards of 2 rows x 4 x 4 heads = 32 again; attention one head, the same.
    r = context_parallel(w1(8, heads=4), 4, "ulysses", "fwd", tiling=T2)
    assert el(r, 3) == want
    # switch: 3/4 of 384 bytes = 288; ring topology: chunks of 96 bytes go 1, 2, 1 hops, 4 hops
    # over the two directions: 2 chunks = 192 bytes on the busiest link
    assert r.device_steps(0)[0].link_bytes == 288
    ring = context_parallel(w1(8, heads=4), 4, "ulysses", "fwd", tiling=T2, topology="ring")
    assert ring.device_steps(0)[0].link_bytes == 192


def test_roofline_verdicts():
    # long shards on an H100: each step's compute (2 n^2 d per head, fp16) dwarfs the K, V
    # transfer (2 n d per head at 450 GB/s), so every transfer hides; a tiny shard exposes it.
    big = context_parallel(Workload(batch=1, heads=8, seq_len_q=65536, head_dim=128, causal=True), 4, "ring",
                           "fwd+bwd", gpu="h100")
    assert big.exposed_steps == sum(s.kind == "final" for s in big.steps)  # only the dK, dV homecoming
    assert big.agrees and big.time_s < big.serial_time_s
    small = context_parallel(Workload(batch=1, heads=1, seq_len_q=256, head_dim=128), 4, "ring", "fwd")
    assert [s.verdict for s in small.device_steps(0)] == ["exposed", "exposed", "exposed", "hidden"]
    s = small.device_steps(0)[0]
    assert s.link_s == pytest.approx(s.link_bytes / get_gpu("h100").link_bytes_per_s)
    # Ulysses' all-to-alls overlap no compute: the phases add up
    u = context_parallel(Workload(batch=1, heads=8, seq_len_q=65536, head_dim=128), 4, "ulysses", "fwd")
    assert [s.verdict for s in u.device_steps(0)] == ["exposed", "hidden", "exposed"]
    assert [s.compute_s > 0 for s in u.device_steps(0)] == [False, True, False]
    assert u.time_s == pytest.approx(sum(s.time_s for s in u.device_steps(0)))


def test_presets_have_nvlink():
    assert {k: g.link_bytes_per_s for k, g in GPUS.items()} == {"a100-40gb": 300e9, "a100-80gb": 300e9,
                                                                 "h100": 450e9, "h200": 450e9}
    assert {g.link_topology for g in GPUS.values()} == {"switch"}


@pytest.mark.parametrize("kw, field", [
    (dict(w=w1(8), devices=0), "devices=0"),
    (dict(w=w1(8), devices=-2), "devices=-2"),
    (dict(w=w1(8), devices=2.0), "devices=2.0"),
    (dict(w=w1(8), devices=3), "seq_len_q=8"),
    (dict(w=w1(12, causal=True), devices=4), "seq_len_q=12"),  # 12 % 4 == 0 but 12 % 8 != 0
    (dict(w=w1(8, heads=3), devices=2, parallel="ulysses"), "heads=3"),
    (dict(w=w1(8, heads=4, kv_heads=1), devices=2, parallel="ulysses"), "kv_heads=1"),
    (dict(w=Workload(batch=1, heads=1, seq_len_q=8, seq_len_k=4, head_dim=4), devices=2), "seq_len_k=4"),
    (dict(w=w1(8), devices=2, parallel="tree"), "parallel='tree'"),
    (dict(w=w1(8), devices=2, pass_="both"), "pass_='both'"),
    (dict(w=w1(8), devices=2, topology="torus"), "topology='torus'"),
])
def test_bad_input(kw, field):
    w = kw.pop("w")
    with pytest.raises(ValueError) as e:
        context_parallel(w, tiling=T2, **kw)
    print(e.value)
    assert str(e.value).startswith(field)


def test_million_tokens_is_fast():
    import time

    t0 = time.perf_counter()
    w = Workload(batch=1, heads=32, seq_len_q=2**20, head_dim=128, causal=True)
    for parallel in ("ring", "ulysses"):
        assert context_parallel(w, 8, parallel, "fwd+bwd", gpu="h200").agrees
    assert time.perf_counter() - t0 < 5


def test_cli(capsys):
    from flashsim.cli import main

    argv = ["simulate", "--devices", "2", "--parallel", "ring", "--causal", "--batch", "1", "--heads", "2",
            "--seq-len", "64", "--head-dim", "16", "--block-m", "8", "--block-n", "8", "--pass", "fwd+bwd"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ring attention on 2 devices" in out and "closed form agrees with the walker: yes" in out
    assert "K@link" in out and "dK@link" in out and "upper" in out and "lower" not in out.split("device 0, step")[1]
    assert main(argv + ["--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["closed_form_agrees"] and d["devices"] == 2 and len(d["per_device"]) == 2
    assert {s["kind"] for s in d["steps"]} == {"diag", "upper", "lower", "final"}
    assert main(["simulate", "--devices", "4", "--parallel", "ulysses", "--topology", "ring", "--batch", "1",
                 "--seq-len", "256"]) == 0
    assert "a2a_in" in capsys.readouterr().out


@pytest.mark.parametrize("args, msg", [
    (["--devices", "3", "--causal"], "seq_len_q=1024"),
    (["--devices", "0"], "devices=0"),
    (["--devices", "4", "--parallel", "ulysses", "--heads", "6"], "heads=6"),
    (["--parallel", "ulysses"], "devices=None"),
    (["--devices", "2", "--algo", "flash1"], "algo='flash1'"),
    (["--devices", "2", "--parallel", "tree"], "invalid choice"),
])
def test_cli_bad_input(capsys, args, msg):
    from flashsim.cli import main

    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    print(err)
    assert err.startswith("flashsim: error: ") and msg in err and err.count("\n") == 1


def test_hardware_link_fields_are_checked():
    import dataclasses

    h = get_gpu("h100")
    for kw, field in ((dict(link_bytes_per_s=0.0), "link_bytes_per_s=0.0"),
                      (dict(link_bytes_per_s=True), "link_bytes_per_s=True"),
                      (dict(link_topology="torus"), "link_topology='torus'")):
        with pytest.raises(ValueError) as e:
            dataclasses.replace(h, **kw)
        assert str(e.value).startswith(field)
    # no interconnect: transfers take forever, so every moving step is exposed
    r = context_parallel(w1(8), 2, "ring", "fwd", gpu=dataclasses.replace(h, link_bytes_per_s=None), tiling=T2)
    assert r.device_steps(0)[0].verdict == "exposed" and r.agrees
