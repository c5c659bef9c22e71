"""The ncu CSV reader on a recorded export: the calibration kernels run on the H100.

tests/data/ncu_raw_calibrate.csv is the unedited output of
``ncu --clock-control none --cache-control all --metrics ... --csv --page raw --print-units base
--profile-from-start off python -m analysis.calibrate`` (H100 80GB HBM3, ncu 2025.3.1).
"""

import csv
import io
from pathlib import Path

import pytest

from analysis.calibrate import EXPECTED
from analysis.ncu import parse_raw_csv, split_by_marker

DATA = Path(__file__).parent / "data" / "ncu_raw_calibrate.csv"


def test_parse_recorded_calibration():
    launches = parse_raw_csv(DATA.read_text())
    assert len(launches) == 4
    groups = split_by_marker(launches)
    assert [len(g) for g in groups] == [1, 1]
    copy, gather = groups[0][0], groups[1][0]
    assert "copy" in copy["kernel"] and "gather8" in gather["kernel"]
    # The LSU level counts exactly what the kernels ask for, sector-granular:
    for rec, name in ((copy, "copy"), (gather, "gather8")):
        for key, want in EXPECTED[name].items():
            assert rec[key] == want, (name, key)
    # 16 MiB copy: 524,288 sectors each way at L2; DRAM reads the 16 MiB (plus a few sectors).
    assert copy["l2_read_sectors"] == 524288 and copy["l2_write_sectors"] == 524288
    assert copy["dram_read_bytes"] == 16782080
    # The writes mostly stay in the 50 MB L2 when the kernel ends: DRAM sees only 1.5 MB of 16.
    assert copy["dram_write_bytes"] == 1564928
    # gather8 reads one float per 32-byte sector: 8x over-fetch at the LSU level.
    assert gather["lsu_ld_bytes"] == 8 * 4 * (gather["lsu_st_bytes"] // 4)
    assert copy["time_ns"] == pytest.approx(14496.0)


def test_rejects_scaled_units():
    lines = DATA.read_text().splitlines()
    h = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    header, units = next(csv.reader([lines[h]])), next(csv.reader([lines[h + 1]]))
    units[header.index("l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum")] = "Kbyte"
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="").writerow(units)
    lines[h + 1] = buf.getvalue()
    with pytest.raises(ValueError, match="unit 'Kbyte'"):
        parse_raw_csv("\n".join(lines))


def test_rejects_missing_table():
    with pytest.raises(ValueError, match="no ncu CSV table"):
        parse_raw_csv("==PROF== nothing profiled\n")


def test_split_requires_trailing_marker():
    launches = parse_raw_csv(DATA.read_text())
    with pytest.raises(ValueError, match="after the last marker"):
        split_by_marker(launches[:3])


@pytest.mark.parametrize("gpu,preset", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100"),
                                        ("NVIDIA L4", None), (None, None)])
def test_compare_takes_the_preset_from_the_provenance(gpu, preset):
    from analysis.compare import preset_of

    assert preset_of({"gpu": gpu}) == preset


@pytest.mark.xdist_group("h200_record")  # shares the process memo of the same computation
def test_committed_h200_record_meets_the_lsu_tolerance_with_its_own_preset(capsys):
    """`flashsim compare` on the committed H200 data, preset from its provenance: every launch
    within 1% at the LSU level (exit status 0) and the DRAM median printed."""
    from analysis.compare import run

    assert run(Path(__file__).parents[1] / "analysis/data/h200/h200.csv", plots=False) == 0
    out = capsys.readouterr().out
    assert "GPU preset h200" in out and "104/104 launches within 1%" in out
    assert "reads: |err| median" in out and "writes: |err| median" in out
