"""Decoding's bounds (compulsory traffic plus each overhead == the schedule's bytes) and the split
proposal, and the decode options on the command line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from analysis.cli import main
from flashsim import Tiling, Workload, simulate
from flashsim.decode_splits import decode_bounds, propose
from tests.test_decode_schedule import decode_cases


@settings(max_examples=150, deadline=None)
@given(decode_cases())
def test_bounds_add_up_to_the_schedule(case):
    w, bc, opts = case
    b = decode_bounds(w, Tiling(1, bc), sectors=False, **opts)
    r = simulate(w, "decode", "fwd", tiling=Tiling(1, bc), **opts)
    parts = b["compulsory"] + b["block_rounding"] + b["split"] + b["paging"] + b["lengths"]
    assert parts == b["schedule"] == r.closed_form.bytes
    assert b["lengths"] == 4 * w.batch * w.hkv * opts["num_splits"]  # one int32 per main-launch program
    assert min(b.values()) >= 0
    if opts["num_splits"] == 1:
        assert b["split"] == 0
    if opts["page_size"] is None:
        assert b["paging"] == 0
    if opts["window"] is None:
        assert b["block_rounding"] == 0
    if w.group == 1:
        assert b["no_gqa_packing"] == 0


def test_bounds_hand():
    # B = 1, Hq = 4, Hkv = 2, Nq = 1, d = 8 fp16, L = 10, Bc = 4, S = 2, P = 5.
    w = Workload(batch=1, heads=4, kv_heads=2, seq_len_q=1, seq_len_k=10, head_dim=8, dtype="fp16")
    b = decode_bounds(w, Tiling(1, 4), num_splits=2, page_size=5)
    assert b["compulsory"] == 4 * 8 * 2 + 2 * 2 * 8 * 2 * 10 + 4 * 8 * 2 + 4 * 4   # Q + K,V + O + L
    assert b["split"] == 4 * 8 * 2 * 1 + 2 * 2 * 4 * (8 + 1) * 4      # Q once more; Op, Lp there and back
    # blocks [0,4) page 0, [4,8) pages 0-1, [8,10) page 1: 4 entries per kv head, 4 bytes each
    assert b["paging"] == 2 * 4 * 4
    # B·Hkv·S = 1·2·2 programs of the main launch, each reading L_b (4 bytes)
    assert b["lengths"] == 4 * 1 * 2 * 2
    # compulsory 64 + 640 + 64 + 16 = 784, split 64 + 576 = 640, paging 32, lengths 16: 1472, the
    # closed form's Lens 16 + Q 128 + K, V 640 + BT 32 + Op 512 + Lp 64 + O 64 + L 16 bytes
    assert b["schedule"] == b["compulsory"] + b["split"] + b["paging"] + b["lengths"] == 784 + 640 + 32 + 16 == 1472
    # one program per query head: K, V, the table and the lengths read g = 2 times
    assert b["no_gqa_packing"] == (2 - 1) * (2 * 2 * 8 * 2 * 10 + b["paging"] + b["lengths"])
    # 16-byte rows, two heads interleaved: a head's rows are 32 bytes apart, one sector each (10
    # per head per tensor); the contiguous cache reads blocks of 4, 4 and 2 rows (64, 64 and 32
    # bytes, 32-byte aligned: 2 + 2 + 1 = 5 sectors)
    assert b["paging_sectors"] == 32 * 2 * 2 * (10 - 5)


def test_propose_fills_the_gpu():
    # 1 sequence x 8 kv heads = 8 programs on 132 SMs: one split leaves most SMs idle.
    w = Workload(batch=1, heads=64, kv_heads=8, seq_len_q=1, seq_len_k=2**17, head_dim=128, dtype="bf16")
    pr = propose(w, "h100", Tiling(1, 128))
    assert pr.programs_per_split == 8 and pr.slots == 132
    assert pr.num_splits > 8 and pr.fa2_choice > 8
    row = pr.table[pr.num_splits - 1]
    assert row["eligible"] and row["efficiency"] >= 0.85
    # flash-attention's rule: the smallest eligible S within 85% of the best efficiency
    best = max(r["efficiency"] for r in pr.table if r["eligible"])
    assert pr.fa2_choice == min(r["num_splits"] for r in pr.table if r["eligible"] and r["efficiency"] >= 0.85 * best)
    # a batch that fills the GPU is not split
    w = Workload(batch=32, heads=64, kv_heads=8, seq_len_q=1, seq_len_k=8192, head_dim=128, dtype="bf16")
    pr = propose(w, "h100", Tiling(1, 128))
    assert pr.num_splits == 1 and pr.fa2_choice == 1


def test_propose_bad_input():
    w = Workload(batch=1, heads=8, kv_heads=8, seq_len_q=1, seq_len_k=1024, head_dim=64)
    for kw, field in [(dict(max_splits=0), "max_splits"), (dict(blocks_per_sm=True), "blocks_per_sm"),
                      (dict(launch_s=-1.0), "launch_s"), (dict(gpu="z100"), "gpu")]:
        with pytest.raises(ValueError, match=field):
            propose(w, tiling=Tiling(1, 64), **kw)


# ---------------------------------------------------------------------------------------------
# Command line

DEC = ["simulate", "--algo", "decode", "--batch", "3", "--heads", "8", "--kv-heads", "2", "--nq", "2",
       "--seq-len-k", "256", "--head-dim", "16", "--block-m", "1", "--block-n", "32"]


def run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_decode_json_matches_api(capsys):
    rc, out, err = run([*DEC, "--num-splits", "3", "--page-size", "16", "--window", "100,0", "--lengths",
                        "256,40,100", "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    w = Workload(batch=3, heads=8, kv_heads=2, seq_len_q=2, seq_len_k=256, head_dim=16)
    r = simulate(w, "decode", "fwd", tiling=Tiling(1, 32), num_splits=3, page_size=16, window=(100, 0),
                 lengths=[256, 40, 100])
    assert s["hbm_bytes"] == r.io.bytes and s["closed_form_agrees"]
    assert set(s["breakdown"]) == {"Lens", "Q", "K", "V", "BT", "O", "L", "Op", "Lp"}
    assert s["decode_bounds"]["schedule"] == r.closed_form.bytes
    assert s["bounds"] is None and s["proposed_splits"]["num_splits"] >= 1


def test_cli_decode_text_cu_seqlens_and_dram(capsys):
    rc, out, err = run([*DEC, "--cu-seqlens", "0,100,140,256", "--num-splits", "2", "--level", "dram"], capsys)
    assert rc == 0, err
    for words in ("decode_split", "decode_combine", "decoding, in bytes: compulsory", "proposed num_splits",
                  "DRAM level", "Op"):
        assert words in out


@pytest.mark.parametrize("extra, words", [
    (["--num-splits", "9"], "num_splits=9: more than the 8 key blocks"),
    (["--page-size", "24"], "page_size=24: must divide seq_len_k=256"),
    (["--page-size", "128", "--block-table", "0,1;2,3;4,9"], "block_table[2][1]=9: out of range"),
    (["--page-size", "128", "--block-table", "0,1;2,3"], "block_table.shape=(2, 2)"),
    (["--lengths", "10,20"], "lengths: 2 values for batch=3"),
    (["--lengths", "10,20,300"], "lengths: sequence 2 has length 300"),
    (["--cu-seqlens", "0,10,20"], "cu_seqlens: 3 values for batch=3"),
    (["--window", "5"], "window=5"),
    (["--window=-1,0"], "window left=-1 must be >= 0"),
    (["--kv-heads", "3"], "kv_heads=3: must divide heads=8"),
    (["--pass", "bwd"], "'decode' models only"),
])
def test_cli_decode_bad_input(extra, words, capsys):
    rc, out, err = run([*DEC, *extra], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("flashsim: error: ") and err.count("\n") == 1, err
    assert words in err, err


def test_cli_lengths_file(tmp_path, capsys):
    f = tmp_path / "lengths.txt"
    f.write_text("256\n40, 100\n")
    rc, out, err = run([*DEC, "--lengths", f"@{f}", "--json"], capsys)
    assert rc == 0, err
    rc2, out2, _ = run([*DEC, "--lengths", "256,40,100", "--json"], capsys)
    assert json.loads(out)["hbm_bytes"] == json.loads(out2)["hbm_bytes"]
    rc, out, err = run([*DEC, "--lengths", f"@{tmp_path / 'missing.txt'}"], capsys)
    assert rc == 2 and err.startswith("flashsim: error: lengths=") and "cannot read" in err and err.count("\n") == 1


def test_cli_one_sequence(capsys):
    # "--lengths 100" and "--block-table 1" are read as ints by the option parser: one sequence
    one = ["simulate", "--algo", "decode", "--batch", "1", "--heads", "2", "--nq", "1", "--seq-len-k", "128",
           "--head-dim", "8", "--block-m", "1", "--block-n", "32", "--json"]
    rc, out, err = run([*one, "--lengths", "100"], capsys)
    assert rc == 0, err
    assert json.loads(out)["breakdown"]["K"]["read"]["elements"] == 2 * 8 * 100
    rc, out, err = run([*one, "--page-size", "128", "--block-table", "0"], capsys)
    assert rc == 0, err
    rc, out, err = run([*one, "--page-size", "128", "--block-table", "1"], capsys)
    assert rc == 2 and "block_table[0][0]=1: out of range" in err


def test_cli_flash2_window(capsys):
    rc, out, err = run(["simulate", "--algo", "flash2", "--batch", "1", "--heads", "2", "--seq-len", "256",
                        "--head-dim", "16", "--causal", "--window", "64,0", "--block-m", "32", "--block-n", "32",
                        "--json"], capsys)
    assert rc == 0, err
    s = json.loads(out)
    w = Workload(batch=1, heads=2, seq_len_q=256, head_dim=16, causal=True)
    assert s["hbm_bytes"] == simulate(w, "flash2", "fwd", tiling=Tiling(32, 32), window=(64, 0)).io.bytes
    assert s["options"] == {"window": "64,0"}
