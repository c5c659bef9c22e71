"""scripts/device/sass_regions.py: Nsight Compute's SASS source page split at the main loop.

The committed record of fwd_fp32_v2 (kernels/data/fwd_fp32_v2_ostage_h200_88f4ef8/) holds the
source pages it was run on and the figures it printed: the script gives them again.  A page it
cannot read is one error line and exit 2."""

import csv
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "kernels" / "data" / "fwd_fp32_v2_ostage_h200_88f4ef8"


def _script():
    spec = importlib.util.spec_from_file_location("sass_regions", ROOT / "scripts" / "device" / "sass_regions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("n", [1024, 4096])
def test_the_record_gives_its_figures_again(n, tmp_path, capsys):
    out = tmp_path / "regions.csv"
    assert _script().main([str(RECORD / f"sass_source_n{n}.csv.gz"), "--top", "3", "--out", str(out)]) == 0
    print(capsys.readouterr().out)
    assert out.read_text() == (RECORD / f"sass_regions_n{n}.csv").read_text()
    rows = {r["region"]: r for r in csv.DictReader(out.open())}
    assert abs(sum(float(r["samples_share"]) for r in rows.values()) - 1) < 1e-9
    # the prologue's share of the warps' time falls about 4x from N = 1,024 to 4,096 (32 -> 128 key blocks)
    lo, hi = (0.07, 0.08) if n == 1024 else (0.019, 0.02)
    assert lo < float(rows["prologue"]["samples_share"]) < hi


def test_a_page_it_cannot_read_is_one_error_line(tmp_path, capsys):
    mod = _script()
    bad = tmp_path / "page.csv"
    bad.write_text("==PROF== nothing profiled\n")
    assert mod.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sass_regions: error:") and "no source table" in err
    assert mod.main([str(tmp_path / "missing.csv")]) == 2
    assert capsys.readouterr().err.startswith("sass_regions: error:")
    noloop = tmp_path / "noloop.csv"
    noloop.write_text('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb"\n'
                      '"0x10","  MOV R1, R2","5","32","0"\n"0x20","  EXIT","1","32","0"\n')
    assert mod.main([str(noloop)]) == 2
    assert "no backward branch" in capsys.readouterr().err
    page = str(RECORD / "sass_source_n1024.csv.gz")
    assert mod.main([page, "--top", "-1"]) == 2
    assert "top=-1" in capsys.readouterr().err
    out = tmp_path / "regions.csv"
    out.write_text("keep me\n")
    assert mod.main([page, "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "keep me\n"
    assert mod.main([page, "--out", str(out), "--force"]) == 0
    assert out.read_text() == (RECORD / "sass_regions_n1024.csv").read_text()
