"""flashsim.tma's box rules by hand, and the committed TMA box sweep (H200) against them."""
import numpy as np
import pytest

from flashsim.tma import box_row_sectors, multicast_row_sectors


def test_box_row_sectors_by_hand():
    # a box row of 128 bytes inside the tensor: 4 sectors where it starts on one, 5 where it
    # starts 16 bytes in
    assert box_row_sectors([0, 144], [128, 128], 128).tolist() == [4, 5]
    # 16 bytes in bounds and 48 of zeros (fwd_fp16_v7's third atom of 64 bytes at d = 72): the
    # in-bounds sector and ⌈48 / 32⌉ = 2 for the zeros, wherever the 16 bytes lie
    assert box_row_sectors([128, 272], [16, 16], 64).tolist() == [3, 3]
    # 80 bytes in bounds (3 sectors from 0 or from 16) and 48 of zeros: 5
    assert box_row_sectors([0, 16], [80, 80], 128).tolist() == [5, 5]
    # a row past the tensor's last: zeros only, 4 sectors for 128 bytes, 1 for 16
    assert box_row_sectors([0, 0], [0, 0], 128).tolist() == [4, 4]
    assert box_row_sectors(np.int64(7), np.int64(0), 16).tolist() == 1
    for rule in (box_row_sectors, multicast_row_sectors):
        for start, inb, width, field in ((0, 0, 0, "width"), (0, 65, 64, "inbounds"), (0, -1, 64, "inbounds"),
                                         (-32, 0, 64, "start"), (0, 0, "64", "width"), (0, 0, 64.5, "width"),
                                         (0, 0, True, "width"), (0, [1.5], 64, "inbounds"),
                                         ([0, 32, 64], [1, 2], 64, "broadcast")):
            with pytest.raises(ValueError, match=field):
                rule(start, inb, width)
        assert rule([], [], 64).tolist() == []
        assert rule(np.int32(0), np.uint8(64), np.int16(64)).tolist() == 2


def test_multicast_row_sectors_by_hand():
    # a piece inside the tensor: its sectors from its first byte rounded down to 64 bytes, at
    # least 2: 128 bytes from 0, 16, 32, 48 (mod 64): [0, 128), [0, 144), [0, 160), [0, 176)
    assert multicast_row_sectors([0, 16, 96, 112], [128] * 4, 128).tolist() == [4, 5, 5, 6]
    assert multicast_row_sectors(0, 16, 16).tolist() == 2  # a 16-byte piece: 2, not 1
    assert multicast_row_sectors(32, 32, 32).tolist() == 2  # [0, 64)
    # past the edge: the in-bounds part so, plus max(3, zero sectors): 32 bytes in a piece of 64
    # (2 + 3), 16 in a piece of 128 (2 + 4: the probe's d = 72 at column 64), 64 in 128 (2 + 3)
    assert multicast_row_sectors([0, 128, 0], [32, 16, 64], 128).tolist() == [5, 6, 5]
    assert multicast_row_sectors(32, 32, 64).tolist() == 2 + 3
    assert multicast_row_sectors(0, 0, 64).tolist() == 3  # a piece wholly past the edge


def test_v7_boxes_by_hand():
    # fwd_fp16_v7 at d = 72: atoms of 32 columns (64 bytes), three a row, the third 16 bytes in
    # bounds; rows of 144 bytes start on a sector (even rows: 2 + 2 + 3) or 16 bytes in (odd
    # rows: 3 + 3 + 3): 8 a row; each of the grid's CTAs receives K and V whole
    from analysis.tma_boxes import v7_sectors

    rec = {"op": "v7", "d": 72, "n": 1536, "grid": (12, 48, 1)}
    assert v7_sectors(rec) == 12 * 48 * 2 * 1536 * 8 == 14_155_776
    rec = {"op": "v7", "d": 80, "n": 1536, "grid": (12, 48, 1)}  # rows of 160 bytes: 2 + 2 + (1 + 1)
    assert v7_sectors(rec) == 12 * 48 * 2 * 1536 * 6


def test_tma_box_sweep_record():
    # the committed H200 sweep: every copy to one CTA to the sector (v7's 13 launches, the
    # GEMMs' 81 operands read by one CTA), and every multicast operand (the 120 GEMMs')
    from analysis.tma_boxes import RECORD, load, summary, table

    rows = table(load(RECORD))
    s = summary(rows)
    print(s)
    assert (s["v7"], s["v7_exact"]) == (13, 13)
    assert (s["gemms"], s["self_parts"], s["self_exact"]) == (120, 81, 81)
    assert (s["multicast_parts"], s["multicast_exact"]) == (120, 120)
    assert (s["gemm_exact"], s["gemm_within_2pct"]) == (120, 120)


def test_tma_multicast_probe_record():
    # the committed H200 multicast probe, the rule read off it: 265 launches to the sector
    from analysis.tma_boxes import MC_RECORD, load_mc, mc_sectors

    recs = load_mc(MC_RECORD)
    bad = [(r["d"], r["w"], r["col0"], r["c"], r["split"], r["tma"], mc_sectors(r)) for r in recs
           if mc_sectors(r) != r["tma"]]
    print(len(recs), bad[:5])
    assert len(recs) == 265 and not bad
    # multicast and self apart: a cluster's launches count only multicast, c = 1 only self
    assert all((r["multicast"] == 0) == (r["c"] == 1) and (r["self"] == 0) == (r["c"] > 1) for r in recs)


def test_tma_boxes_cli_refuses_a_missing_record(tmp_path, capsys):
    from analysis.tma_boxes import main

    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "none")])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("flashsim: error:")
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "raw.csv").write_text("not ncu\n")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    assert e.value.code == 2


def _exit2(capsys, argv):
    from analysis.tma_boxes import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    print(argv, err)
    assert e.value.code == 2 and err.startswith("flashsim: error:") and err.count("\n") == 1
    return err


def test_tma_boxes_cli_refuses_careless_records(tmp_path, capsys):
    import json
    import shutil

    from analysis.tma_boxes import MC_RECORD, RECORD

    # the multicast probe's manifest: a line that is not the probe's names the line and field
    lines = (MC_RECORD / "manifest.txt").read_text().splitlines()
    for bad, field in (("16 64 0 0 0 0", "c="), ("16 64 0 2 7 0", "split="), ("16 64 16 1 0 0", "col0="),
                       ("16 64 0 1 0", "six integers"), ("16 x 0 1 0 0", "six integers"), ("16 64 0 3 1 0", "W=")):
        f = tmp_path / f"mc{abs(hash(bad))}"
        f.mkdir()
        shutil.copy(MC_RECORD / "raw.csv", f / "raw.csv")
        (f / "manifest.txt").write_text("\n".join([bad] + lines[1:]) + "\n")
        assert field in _exit2(capsys, ["--mc", str(f)])
    # the sweep's manifest: not a mapping, or a workload's field out of range
    man = json.loads((RECORD / "manifest.json").read_text())
    first = next(k for k, v in man.items() if v["op"] == "v7")
    for bad, field in ((list(man.values()), "mapping"), ({**man, first: {**man[first], "d": "64"}}, "d="),
                       ({**man, first: {**man[first], "bh": 0}}, "bh="),
                       ({**man, first: {**man[first], "dtype": "fp8"}}, "dtype="),
                       ({**man, first: {**man[first], "op": "conv"}}, "op")):
        f = tmp_path / f"sw{field.strip('=')}"
        f.mkdir()
        shutil.copy(RECORD / "raw.csv", f / "raw.csv")
        (f / "manifest.json").write_text(json.dumps(bad))
        assert field in _exit2(capsys, [str(f)])
    # --csv: a missing folder, an existing file without --force; a folder and --mc together
    assert "--csv" in _exit2(capsys, ["--csv", str(tmp_path / "no" / "t.csv")])
    (tmp_path / "t.csv").write_text("keep")
    assert "exists" in _exit2(capsys, ["--csv", str(tmp_path / "t.csv")])
    assert (tmp_path / "t.csv").read_text() == "keep"
    assert "not both" in _exit2(capsys, [str(tmp_path), "--mc", str(MC_RECORD)])
    from analysis.tma_boxes import main

    assert main(["--csv", str(tmp_path / "t.csv"), "--force"]) == 0
    assert (tmp_path / "t.csv").read_text().startswith("op,d,n,bh,dtype,range,kernel")
    assert not (tmp_path / "t.csv.tmp").exists()


def test_fast_v7_schedule_against_the_sweep():
    # flashsim's schedule of fwd_fp16_v7 states K and V as the TMA unit copies them, one box of a
    # swizzle atom's columns a row, in-bounds bytes only: with the zeros of each row's last atom
    # added (what the SMs also receive) it is the sweep's count, to the sector, at all 13 head dims
    import math

    from analysis.tma_boxes import RECORD, load
    from flashsim import Workload
    from flashsim.algorithms.fast import atom_columns
    from flashsim.api import build_schedule
    from flashsim.traffic import walk

    recs = [r for r in load(RECORD) if r["op"] == "v7"]
    assert len(recs) == 13
    for r in recs:
        d, n, (tr, bh, _) = r["d"], r["n"], r["grid"]
        w = Workload(batch=3, heads=bh // 3, seq_len_q=n, head_dim=d)
        io = walk(build_schedule(w, "fast", "fwd", kernel="fwd_fp16_v7", config={"nw": n // tr // 16, "mt": 1}))
        bulk = sum(t.sectors for (_, kind), t in io.breakdown.items() if kind == "bulk_read")
        aw = atom_columns(d)
        zeros = -(-(aw * math.ceil(d / aw) - d) * 2 // 32)
        print(d, bulk, zeros, r["tma"])
        assert bulk + tr * bh * 2 * n * zeros == r["tma"]
