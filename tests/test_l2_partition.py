"""analysis.l2_partition on records written in the probe's format: the SM and line sides of a
rank-one near/far term recovered exactly under noise, an XOR rule of address bits found where
there is one, and bad records refused with the field named."""

import gzip

import numpy as np
import pytest

from analysis import l2_partition as lp


def _record(tmp_path, line_side_fn, name="r.bin.gz", seed=0, noise=4.0, written_near_writer=None, offset=0):
    rng = np.random.default_rng(seed)
    sms, per_sm, lines, stride = 8, 2, 64, 4096
    smid = np.repeat(np.arange(sms), per_sm)
    rng.shuffle(smid)
    sm_side = (smid // 2) % 2 == 1  # SMs 0, 1 on side False (the smallest smid orients the sides)
    cyc = np.empty((len(smid), 2, 3, lines))
    sides = []
    for s, spacing in enumerate((128, stride)):
        ls = line_side_fn((offset if s else 0) + np.arange(lines) * spacing)
        if s == 1 and written_near_writer:  # every written line near the side of block 0 (rank 0)
            ls = np.full(lines, sm_side[0])
        sides.append(ls)
        far = sm_side[:, None] != ls[None, :]
        base = 266 + 30 * far + rng.normal(0, noise, far.shape) + rng.normal(0, 3, (len(smid), 1))
        cyc[:, s] = np.round(base)[:, None, :]
    path = tmp_path / name
    lp.write(path, smid, cyc, stride, sms, 1980000, write1=written_near_writer, set1_offset=offset)
    return path, smid, sm_side, sides


def test_sides_recovered_and_an_xor_rule_found(tmp_path):
    path, smid, sm_side, sides = _record(tmp_path, lambda a: ((a >> 8) ^ (a >> 12) ^ (a >> 13)) & 1 == 1)
    rec = lp.read(path)
    assert (rec["smid"] == smid).all() and rec["stride"] == 4096 and rec["sms"] == 8
    s = lp.summary(rec)
    print(lp.format_summary(path, rec, s))
    assert s["sm_side"] == {i: bool((i // 2) % 2) for i in range(8)}
    for t, ls in zip(s["sets"], sides):
        bs, got, _ = lp.split(rec["cycles"][:, t["set"], 1], rec["smid"])
        assert (bs == sm_side).all() and (got == ls).all()
        assert abs(t["near"] - 266) < 2 and abs(t["far"] - 296) < 2
    assert s["sets"][0]["xor"] == [8, 12]  # set 0: 64 lines 128 B apart, bits 7-12 vary (13 is 0)
    assert 0.3 < s["sets"][0]["near_loader"] < 0.7  # lines by address: about half near the loader
    assert s["sets"][1]["xor"] == [12, 13]     # set 1: 4 KiB apart, bit 8 never set


def test_written_lines_all_near_their_writer(tmp_path):
    """Version 2, set 1 written by the first block and every written line near its side: the
    share of set 1's lines nearer the writer's side is 1 (the sides of the blocks from set 0)."""
    path, smid, sm_side, _ = _record(tmp_path, lambda a: ((a >> 8) & 1) == 1, written_near_writer=True)
    rec = lp.read(path)
    assert rec["version"] == 2 and rec["write1"] and (rec["rank"] == np.arange(len(smid))).all()
    s = lp.summary(rec)
    print(lp.format_summary(path, rec, s))
    assert s["sets"][1]["near_loader"] == 1.0 and 0.3 < s["sets"][0]["near_loader"] < 0.7
    assert "written by the first block, 1.00 of its lines" in lp.format_summary(path, rec, s)


def test_set1_addresses_start_at_its_offset(tmp_path):
    """Version 2: set 1 starts ``set1_offset`` bytes in; its XOR rule is of those addresses (at
    6,144 bytes in, bit 13 of offset + 4,096 i = bit 1 of i + 1: not a linear function of i's bits)."""
    path, *_ = _record(tmp_path, lambda a: ((a >> 13) & 1) == 1, written_near_writer=False, offset=6144)
    s = lp.summary(lp.read(path))
    assert s["sets"][1]["xor"] == [13] and not s["write1"]


def test_a_side_that_no_xor_gives(tmp_path):
    path, *_ = _record(tmp_path, lambda a: (a // 128) % 3 == 0, name="r.bin")
    s = lp.summary(lp.read(path))
    assert s["sets"][0]["xor"] is None and s["sets"][0]["lines_true"] == 22


@pytest.mark.parametrize("data, words", [
    (b"NOPE" + bytes(40), ["not an l2_partition_probe record"]),
    (b"L2PP" + np.array([3, 1, 4, 4096, 1, 0], "<u4").tobytes(), ["version=3"]),
    (b"L2PP" + np.array([2, 1, 4, 4096, 1], "<u4").tobytes(), ["shorter than a version 2 header"]),
    (b"L2PP" + np.array([1, 2, 4, 4096, 1, 0], "<u4").tobytes() + bytes(10), ["bytes", "2 blocks"]),
])
def test_bad_records_are_refused(tmp_path, data, words, capsys):
    path = tmp_path / "bad.bin.gz"
    with gzip.open(path, "wb") as f:
        f.write(data)
    with pytest.raises(ValueError) as e:
        lp.read(path)
    print(e.value)
    for w in words:
        assert w in str(e.value)
    with pytest.raises(SystemExit) as x:
        lp.main([str(path)])
    err = capsys.readouterr().err
    assert x.value.code == 2 and err.startswith("flashsim: error:") and len(err.strip().splitlines()) == 1


def test_the_committed_h200_record():
    """analysis/data/l2calib/h200_l2_partition: 66 SMs a side, every line in one latency class
    (near about 266 cycles, far about 296), far lines as slow in the third pass as in the first."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "analysis/data/l2calib/h200_l2_partition/l2pp_s4k.bin.gz"
    rec = lp.read(path)
    s = lp.summary(rec)
    print(lp.format_summary(path, rec, s))
    assert sum(1 for v in s["sm_side"].values() if v) == 66 and None not in s["sm_side"].values()
    for t in s["sets"]:
        # single cells overlap (near 99th percentile 285, far 1st 274), each line's two sides do not
        assert 264 < t["near"] < 268 and 294 < t["far"] < 298 and t["line_gap_min"] > 20
        assert t["xor"] is None and abs(t["far_by_pass"][2] - t["far_by_pass"][0]) < 1


def test_reread_table_counts_the_lost_lines_by_side(tmp_path):
    """A re-read record in the probe's CSV form: near lines (266-cycle hits) all kept, far ones
    (296) lost every other one at W = 32; nothing lost at W = 16; bad files refused."""
    rows = ["w_mib,smid,line,first,second"]
    for w in (16, 32):
        for i in range(200):
            hit = 266 if i % 2 else 296
            lost = w == 32 and hit == 296 and i % 4 == 0
            first = 15 * hit + (900 if lost else hit)
            rows.append(f"{w},7,{16 * i},{first},{16 * hit}")
    path = tmp_path / "rr.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    table = lp.reread_table(lp.read_reread(path))
    print(table)
    assert [(t["w_mib"], t["near"], t["far"]) for t in table] == [(16, 100, 100), (32, 100, 100)]
    assert table[0]["near_lost"] == table[0]["far_lost"] == 0 == table[1]["near_lost"]
    assert table[1]["far_lost"] == 0.5 and 280 < table[1]["cut"] < 282
    assert lp.main(["--reread", str(path)]) == 0
    bad = tmp_path / "bad.csv"
    bad.write_text("w_mib,smid,line,first\n1,2,3,4\n")
    with pytest.raises(ValueError, match="columns"):
        lp.read_reread(bad)
    binary = tmp_path / "l2pp.bin.gz"
    with gzip.open(binary, "wb") as f:
        f.write(b"L2PP\x02\x00\x00\x00\x84\xff\xfe")
    with pytest.raises(ValueError, match="not text"):
        lp.read_reread(binary)
    bad.write_text("w_mib,smid,line,first,second\n1,2,3,x,5\n")
    with pytest.raises(ValueError, match="row 2"):
        lp.read_reread(bad)
    # the first run's record (8ab49da): every line 2 and 6 cycles, the loads dropped by ptxas
    bad.write_text("w_mib,smid,line,first,second\n" + "".join(f"16,124,{16 * i},2,6\n" for i in range(8)))
    with pytest.raises(ValueError, match="not between the clock reads"):
        lp.reread_table(lp.read_reread(bad))
    with pytest.raises(SystemExit) as e:
        lp.main(["--reread", str(bad)])
    assert e.value.code == 2


def test_the_committed_h200_write_record():
    """analysis/data/l2calib/h200_l2_partition_write (8ab49da): set 1 written, not read, by the first
    block.  Written lines lie in their address's half as read ones do: about half of them nearer
    the writer's side (0.52), the same latencies, the same SM map as the read records."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "analysis/data/l2calib"
    rec = lp.read(root / "h200_l2_partition_write/l2pp_w.bin.gz")
    s = lp.summary(rec)
    print(lp.format_summary("l2pp_w", rec, s))
    assert rec["version"] == 2 and s["write1"]
    written = s["sets"][1]
    assert 0.45 < written["near_loader"] < 0.6 and 264 < written["near"] < 268 and 294 < written["far"] < 298
    read = lp.summary(lp.read(root / "h200_l2_partition/l2pp_1.bin.gz"))
    assert s["sm_side"] == read["sm_side"]


def test_the_committed_h200_reread_record():
    """analysis/data/l2calib/h200_l2_reread (0aa3913): after one SM's pass over W MiB, near and far
    lines are lost alike (0.29/0.27 at 40 MiB): the two halves do not explain the one-SM
    re-read.  Lines are lost from 32 MiB on, where the model's cache (42.6 MiB, sets by address
    modulo their count, random victims) loses none before 48 MiB; the cold record (no first pass)
    has 99.4% of its timed lines a miss, the written record (the grid wrote the lines) none."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "analysis/data/l2calib/h200_l2_reread"
    table = lp.reread_table(lp.read_reread(root / "reread_1.csv.gz"))
    for t in table:
        assert 270 < t["near_cycles"] < 285 and 300 < t["far_cycles"] < 320, t
        # far lines a little lower: their hits are 30 cycles slower, their DRAM reads stand out less
        assert abs(t["near_lost"] - t["far_lost"]) < 0.06, t
    model = {w: lp.model_reread("h200", w) for w in (32, 40, 48, 64)}
    assert model[32] == model[40] == 0 and 0.1 < model[48] < 0.12 and 0.3 < model[64] < 0.36
    (cold,) = lp.reread_order(lp.read_reread(root / "reread_cold.csv.gz"))
    assert cold["lost"] > 0.99 and cold["runs"] == 4
    # lines the grid has just written: none costs a DRAM read when one SM reads them back
    written = lp.reread_order(lp.read_reread(root / "reread_written.csv.gz"))
    assert [(o["w_mib"], o["lost"], o["runs"]) for o in written] == [(8, 0, 4), (16, 0, 4), (24, 0, 4)]
    # ... but in the launch that wrote them about a quarter does, partly other lines in each run
    same = lp.reread_order(lp.read_reread(root / "reread_written-same.csv.gz"))
    print(same)
    assert all(0.2 < o["lost"] < 0.3 and o["agree"] < 0.7 for o in same) and len(same) == 3
    # whichever side wrote the line or holds it (sides from the committed partition record)
    sides = lp.summary(lp.read(lp.SIDES_RECORD))["sm_side"]
    groups = lp.written_sides(lp.read_reread(root / "reread_written-same.csv.gz"), sides)
    assert len(groups) == 12 and all(0.2 < g["lost"] < 0.3 and g["lines"] > 3000 for g in groups)
    assert all(g["lost"] == 0 for g in lp.written_sides(lp.read_reread(root / "reread_written.csv.gz"), sides))
    with pytest.raises(ValueError, match="no writer column"):
        lp.written_sides(lp.read_reread(root / "reread_cold.csv.gz"), sides)
    with pytest.raises(ValueError, match="no side for SMs"):
        lp.written_sides(lp.read_reread(root / "reread_written.csv.gz"), {0: True})
    rand = [lp.random_sets_loss("h200", w) for w in (32, 40, 48, 64)]
    print(rand)
    assert 0.01 < rand[0] < rand[1] < rand[2] < rand[3] < 0.4


def test_the_h200_reread_record_keeps_the_newest_28_mib():
    """One SM's first pass keeps the newest 27-29 MiB of the window and loses all the lines read
    before them: the same lines on four SMs (agreeing on 96% or more, where independent losses
    of 0.28 would agree on 27% at 40 MiB), the first two tenths lost at 40-64 MiB, none of the last
    three.  A second pass over every line in address order misses about half at 40-48 MiB and all
    at 64 (ncu's one-SM calibration: 0.50, 0.50, 0.99); in reverse order only the oldest part."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "analysis/data/l2calib/h200_l2_reread"
    order = {o["w_mib"]: o for o in lp.reread_order(lp.read_reread(root / "reread_1.csv.gz"))}
    for o in order.values():
        print(o)
        assert o["runs"] == 4 and o["agree"] > 0.95
        assert max(o["by_tenth"][7:]) < 0.01  # the last lines read are all kept
    assert order[16]["lost"] == order[24]["lost"] == 0
    for w in (32, 40, 48, 64):
        assert 26.5 < order[w]["kept_mib"] < 29.5
    for w in (40, 48, 64):
        assert min(order[w]["by_tenth"][:2]) > 0.95
    full = {o["w_mib"]: o["lost"] for o in lp.reread_order(lp.read_reread(root / "reread_full.csv.gz"))}
    rev = {o["w_mib"]: o for o in lp.reread_order(lp.read_reread(root / "reread_full-reverse.csv.gz"))}
    print(full, {w: o["lost"] for w, o in rev.items()})
    assert 0.45 < full[40] < 0.55 and 0.45 < full[48] < 0.55 and full[64] > 0.98
    assert rev[40]["lost"] < 0.2 and max(rev[40]["by_tenth"][4:]) < 0.02 and rev[64]["lost"] < 0.4
    # synthetic: two runs of a W, the second's line numbers restarting at 0
    rows = [dict(w_mib=8, smid=s, line=16 * i, first=15 * 266 + (900 if i < 2 else 266), second=16 * 266)
            for s in (1, 2) for i in range(10)]
    (o,) = lp.reread_order(rows)
    assert (o["runs"], o["lines"], o["lost"], o["agree"]) == (2, 10, 0.2, 1.0) and o["by_tenth"][:3] == [1, 1, 0]
