"""Issue 16: no silent wrong number and one clean ValueError (naming the field) for every bad input
to the simulator's API, and one ``flashsim: error:`` line with exit status 2 from the CLI."""

from __future__ import annotations

import numpy as np
import pytest

from flashsim import BlockMask, Tiling, Workload, get_gpu, simulate
from flashsim.api import build_schedule, closed_form_elements
from flashsim.bounds import bounds_table
from flashsim.closed_vec import dense
from flashsim.config import MAX_SIZE
from flashsim.traffic import walk

A100_M = 164 * 1024 // 2  # the A100 preset's shared memory per block, in fp16 elements


@pytest.mark.parametrize("int_type", [int, np.int32, np.int64, np.uint16, np.int16])
def test_numpy_integer_sizes_count_like_python_ints(int_type):
    """np.int32(64) as the batch gave 272,629,760 bytes instead of 4,567,597,056 (int32 overflow),
    with ``agrees`` still True."""
    w = Workload(batch=int_type(64), heads=int_type(16), seq_len_q=int_type(1024), head_dim=int_type(64))
    assert all(type(getattr(w, f)) is int for f in ("batch", "heads", "kv_heads", "seq_len_q", "seq_len_k",
                                                    "head_dim"))
    r = simulate(w, "flash2", "fwd", sram_elems=np.int64(A100_M))
    print(r.io.bytes, r.closed_form.bytes)
    assert r.io.bytes == r.closed_form.bytes == 4_567_597_056
    assert r.agrees


def test_counts_beyond_int64_element_products_stay_exact():
    """Counts past 2^63 come out as exact Python ints, not wrapped int64s."""
    w = Workload(batch=4, heads=4, seq_len_q=2**30, head_dim=2**10)
    r = simulate(w, "standard", "fwd", gemm_block=2**30)
    e = w.bh * w.nq * w.nk
    assert r.io.elements_by_key()[("S", "write")] == e > 2**63
    assert r.agrees and min(t.sectors for t in r.io.breakdown.values()) > 0


@pytest.mark.parametrize("kwargs, words", [
    (dict(batch=np.float64(2.0)), ["batch=", "2.0", "float"]),
    (dict(batch=2.0), ["batch=2.0", "float"]),
    (dict(heads="4"), ["heads='4'", "integer"]),
    (dict(seq_len_q=None), ["seq_len_q=None"]),
    (dict(seq_len_q=np.bool_(True)), ["seq_len_q=", "bool"]),
    (dict(head_dim=2**63), ["head_dim=9223372036854775808", "at most"]),
    (dict(seq_len_q=10**10), ["seq_len_q=10000000000", "at most"]),
    (dict(batch=10**12), ["batch=1000000000000", "at most"]),
    (dict(dtype=[]), ["dtype=[]"]),
    (dict(dtype=None), ["dtype=None"]),
    (dict(causal="yes"), ["causal='yes'"]),
    (dict(block_mask=((True,),)), ["block_mask=tuple"]),
])
def test_workload_refuses_with_the_field(kwargs, words):
    base = dict(batch=1, heads=2, seq_len_q=16, head_dim=8)
    with pytest.raises(ValueError) as e:
        Workload(**{**base, **kwargs})
    print(e.value)
    for word in words:
        assert word in str(e.value)


@pytest.mark.parametrize("call, words", [
    (lambda w: simulate(w, "flash2", tiling=(16, 16)), ["tiling=(16, 16)", "Tiling"]),
    (lambda w: simulate(w, "flash2", sram_elems=10**30), ["sram_elems=", "at most"]),
    (lambda w: simulate(w, "flash2", sram_elems=1024.0), ["sram_elems=1024.0", "float"]),
    (lambda w: simulate(w, "flash2", sram_elems=1024.5), ["sram_elems=1024.5", "float"]),
    (lambda w: simulate(w, "flash2", "sideways"), ["pass_='sideways'"]),
    (lambda w: simulate(w, "flash2", None, sram_elems=1024), ["pass_=None"]),
    (lambda w: simulate(w, "standard", sram_elems=-5), ["sram_elems=-5"]),
    (lambda w: simulate(w, "standard", sram_elems="big"), ["sram_elems='big'"]),
    (lambda w: simulate(w, "standard", gemm_block=16.0), ["gemm_block=16.0"]),
    (lambda w: simulate(w, "standard", dropout=float("nan")), ["dropout=nan"]),
    (lambda w: simulate(w, "standard", fuse=[]), ["fuse=[]"]),
    (lambda w: simulate(w, "smallcache", sram_elems=64, tile=4.0), ["tile=4.0"]),
    (lambda w: simulate(w, "smallcache", sram_elems=64, tile=True), ["tile=True"]),
    (lambda w: simulate(w, ["flash2"]), ["algo=['flash2']"]),
    (lambda w: simulate("w", "flash2", sram_elems=1024), ["workload=str"]),
    (lambda w: build_schedule(w, "flash2", "sideways"), ["pass_='sideways'"]),
    (lambda w: closed_form_elements(w, "flash2", "sideways"), ["pass_='sideways'"]),
    (lambda w: Tiling(16.0, 16), ["block_m=16.0"]),
    (lambda w: Tiling(16, np.float32(16.5)), ["block_n=", "16.5", "float"]),
    (lambda w: Tiling.from_sram(4096.0, 64), ["sram_elems=4096.0"]),
    (lambda w: get_gpu(None), ["gpu=None"]),
    (lambda w: get_gpu(3), ["gpu=3"]),
    (lambda w: bounds_table(w, 4096.7), ["sram_elems=4096.7"]),
    (lambda w: dense("flash2", "fwd", np.array([1024.0]), 64, 4096), ["nq", "float64"]),
    (lambda w: dense("flash2", "fwd", 1024, 64, 4096.5), ["m", "float64"]),
    (lambda w: dense("standard", "fwd", 2**31 - 1, 2**31 - 1, 4096, 2**31 - 1), ["int64"]),
])
def test_api_refuses_with_the_field(call, words):
    w = Workload(batch=1, heads=2, seq_len_q=64, head_dim=16)
    with pytest.raises(ValueError) as e:
        call(w)
    print(e.value)
    for word in words:
        assert word in str(e.value)


@pytest.mark.parametrize("mask, words", [
    (np.array([[1.0, np.nan]]), ["mask[0][1]=", "nan"]),
    (np.array([[1.0, 0.5]]), ["mask[0][1]=", "0.5"]),
    (np.array([[1, 2]]), ["mask[0][1]=", "2"]),
    ([["a", "b"]], ["mask.dtype"]),
    ([[True], [True, False]], ["row lengths"]),
    (np.ones((2, 2, 2), bool), ["mask.ndim=3"]),
])
def test_block_mask_refuses_what_bool_would_make_true(mask, words):
    with pytest.raises(ValueError) as e:
        BlockMask(16, 16, mask)
    print(e.value)
    for word in words:
        assert word in str(e.value)


def test_block_mask_accepts_0_1_numbers_exactly():
    a = BlockMask(16, 16, np.array([[1.0, 0.0], [0.0, 1.0]]))
    b = BlockMask(16, 16, [[True, False], [False, True]])
    c = BlockMask.from_array(np.array([[1, 0], [0, 1]], np.uint8), 16, 16)
    assert a == b == c and a.array.dtype == bool and a.density == 0.5


@pytest.mark.parametrize("argv", [
    ["simulate", "--seq-len", "10000000000"],
    ["simulate", "--batch", "1000000000000"],
    ["simulate", "--head-dim", str(2**63)],
    ["simulate", "--algo", "flash2", "--pass", "sideways"],
    ["bounds", "--seq-len", "10000000000"],
    ["sweep", "--param", "N", "--values", "10000000000", "--out", "{tmp}"],
])
def test_cli_prints_one_error_line(argv, tmp_path, capsys):
    from flashsim.cli import main

    argv = [a.replace("{tmp}", str(tmp_path / "s")) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    print(err)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("flashsim: error:") and "Traceback" not in err


def test_size_limits_are_stated():
    with pytest.raises(ValueError, match=f"at most {MAX_SIZE:,}"):
        Workload(batch=1, heads=1, seq_len_q=MAX_SIZE + 1, head_dim=8)
    Workload(batch=1, heads=1, seq_len_q=MAX_SIZE, head_dim=8)  # the limit itself is accepted


@pytest.mark.parametrize("algo, kw", [("flash2", dict(sram_elems=256)), ("flash1", dict(sram_elems=256)),
                                      ("standard", dict(gemm_block=1)), ("smallcache", dict(sram_elems=5))])
def test_too_many_blocks_or_programs_is_a_value_error(algo, kw):
    """Beyond the walker's limits (2^22 blocks per axis, 2^22 programs): a ValueError stating the
    limit, never a MemoryError."""
    w = Workload(batch=1, heads=1, seq_len_q=2**23, head_dim=64, causal=algo != "smallcache")
    with pytest.raises(ValueError, match="at most 4,194,304"):
        simulate(w, algo, **kw)
    w = Workload(batch=2**12, heads=2**11, seq_len_q=64, head_dim=64)
    with pytest.raises(ValueError, match="at most 4,194,304 programs"):
        simulate(w, algo, **kw)


def test_walker_counts_wide_tensors_exactly():
    """A tensor whose slice passes 2^62 bytes is refused by the walker, not wrapped."""
    w = Workload(batch=1, heads=1, seq_len_q=2**31 - 1, head_dim=8, dtype="fp32")
    with pytest.raises(ValueError, match="walker"):
        walk(build_schedule(w, "standard", gemm_block=2**31 - 1))


@pytest.mark.parametrize("argv, words", [
    (["--only", "bwd_fp16_v3", "--config", "{qbuf: 1}"], ["--config"]),
    (["--only", "bwd_fp16_v3", "--config", "[1]"], ["JSON object"]),
    (["--config", '{"qbuf": 1}'], ["needs --only"]),
])
def test_sanitize_refuses_a_bad_config(argv, words, capsys):
    """kernels.sanitize's --config (a JSON object overriding one variant's block): one error line,
    exit 2, before any kernel runs."""
    from kernels.sanitize import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    print(err)
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for word in words:
        assert word in err
