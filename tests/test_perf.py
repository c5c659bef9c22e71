"""analysis.perf on a tiny benchmark CSV written here: typing, failures, series and ratios."""

import math
from pathlib import Path

import pytest

from analysis.perf import cases, ratio_range, ratios, read_bench, series, split_failed, variants

# Two configurations: fp16 forward at N = 1024 and 4096 (two of ours at 4096), fp32 forward at
# N = 1024 where SDPA's flash backend does not run and one of ours failed its check.
CSV = """\
batch,causal,config,d,dtype,error,heads,ms,ms_std,n,pass,rel_err,tflops,variant,x_naive,x_sdpa_flash
4,False,fwd-fp16-d64-full-n1024,64,fp16,,16,4.0,0.1,1024,fwd,1e-4,10.0,naive,1.0,0.5
4,False,fwd-fp16-d64-full-n1024,64,fp16,,16,2.0,0.1,1024,fwd,1e-4,20.0,sdpa_flash,2.0,1.0
4,False,fwd-fp16-d64-full-n1024,64,fp16,,16,1.0,0.1,1024,fwd,1e-4,40.0,ours_fwd_fp16_v4,4.0,2.0
1,False,fwd-fp16-d64-full-n4096,64,fp16,,16,12.0,0.1,4096,fwd,1e-4,10.0,naive,1.0,0.25
1,False,fwd-fp16-d64-full-n4096,64,fp16,,16,3.0,0.1,4096,fwd,1e-4,40.0,sdpa_flash,4.0,1.0
1,False,fwd-fp16-d64-full-n4096,64,fp16,,16,6.0,0.1,4096,fwd,1e-4,20.0,ours_fwd_fp16_v4,2.0,0.5
1,False,fwd-fp16-d64-full-n4096,64,fp16,,16,4.0,0.1,4096,fwd,1e-4,30.0,ours_fwd_fp16_v3,3.0,0.75
4,True,fwd-fp32-d64-causal-n1024,64,fp32,,16,8.0,0.1,1024,fwd,1e-7,2.0,naive,1.0,
4,True,fwd-fp32-d64-causal-n1024,64,fp32,,16,2.0,0.1,1024,fwd,1e-7,8.0,sdpa_mem_eff,4.0,
4,True,fwd-fp32-d64-causal-n1024,64,fp32,"AssertionError('failed the check')",16,,,1024,fwd,0.5,,ours_fwd_fp32_v1,,
"""


@pytest.fixture
def rows(tmp_path):
    p = tmp_path / "bench.csv"
    p.write_text(CSV)
    return read_bench(p)


def test_read_bench_types(rows):
    r = rows[0]
    assert (r["n"], r["d"], r["batch"], r["causal"], r["ms"], r["error"]) == (1024, 64, 4, False, 4.0, None)
    assert rows[7]["causal"] is True and math.isnan(rows[7]["x_sdpa_flash"])
    assert rows[9]["error"].startswith("AssertionError") and math.isnan(rows[9]["ms"])


def test_failures_are_set_apart(rows):
    timed, bad = split_failed(rows)
    assert [r["variant"] for r in bad] == ["ours_fwd_fp32_v1"] and len(timed) == 9
    # a case counts only where one of ours was timed: the fp32 forward has no timed kernel of ours
    assert cases(rows) == [("fwd", "fp16")]
    assert variants(rows) == ["naive", "sdpa_flash", "sdpa_mem_eff", "ours_fwd_fp16_v3", "ours_fwd_fp16_v4",
                              "ours_fwd_fp32_v1"]


def test_na_rows_are_neither_timed_nor_failed(tmp_path):
    p = tmp_path / "rounds.csv"
    p.write_text("variant,pass,dtype,d,causal,n,batch,heads,ms,tflops,error,na\n"
                 "naive,fwd,fp32,64,False,1024,16,16,2.0,10.0,,\n"
                 "sdpa_flash,fwd,fp32,64,False,1024,16,16,,,,SDPA's flash backend takes fp16/bf16 only\n"
                 "ours_fwd_fp32_v2,fwd,fp32,64,False,1024,16,16,,,RuntimeError('x'),\n")
    rows = read_bench(p)
    timed, bad = split_failed(rows)
    assert [r["variant"] for r in timed] == ["naive"] and [r["variant"] for r in bad] == ["ours_fwd_fp32_v2"]
    assert rows[1]["na"].startswith("SDPA's flash") and rows[0]["na"] is None


def test_series(rows):
    s = series(rows, "fwd", "fp16", 64, False)
    assert s["ours_fwd_fp16_v4"] == ([1024, 4096], [40.0, 20.0])
    assert s["ours_fwd_fp16_v3"] == ([4096], [30.0])
    assert "ours_fwd_fp32_v1" not in series(rows, "fwd", "fp32", 64, True)


def test_ratios_match_the_benchmarks_columns(rows):
    recs = ratios(rows)
    assert len(recs) == 3
    by = {(r["n"], r["variant"]): r for r in recs}
    for r in rows:
        if (r["n"], r["variant"]) in by and r["dtype"] == "fp16":
            assert by[r["n"], r["variant"]]["x_naive"] == pytest.approx(r["x_naive"])
            assert by[r["n"], r["variant"]]["x_sdpa_flash"] == pytest.approx(r["x_sdpa_flash"])
    assert all(math.isnan(r["x_sdpa_cudnn"]) for r in recs)  # not in the file


def test_fastest_only_and_ranges(rows):
    best = ratios(rows, fastest_only=True)
    assert [(r["n"], r["variant"]) for r in best] == [(1024, "ours_fwd_fp16_v4"), (4096, "ours_fwd_fp16_v3")]
    assert ratio_range(best, "naive") == (3.0, 4.0, 2)
    assert ratio_range(best, "naive", n_min=4096) == (3.0, 3.0, 1)
    assert ratio_range(best, "sdpa_flash", dtype="fp16") == (0.75, 2.0, 2)
    assert ratio_range(best, "sdpa_flash", pass_="fwd", dtype="fp16", n_min=2048) == (0.75, 0.75, 1)
    lo, hi, k = ratio_range(best, "sdpa_mem_eff")
    assert k == 0 and math.isnan(lo) and math.isnan(hi)


def test_by_head_dim_reads_the_v7_sweep():
    """A head-dim sweep's curve from the committed v7 record: one point per d, the median with its
    quartiles, other N, masks, passes and variants left out."""
    from analysis.perf import by_head_dim

    rows = read_bench(Path(__file__).resolve().parents[1] / "kernels/data/fwd_fp16_v7_h100/sweep_2wg.csv")
    v7 = by_head_dim(rows, "ours_fwd_fp16_v7")
    print({d: round(x[0], 2) for d, x in v7.items()})
    assert list(v7) == list(range(64, 257, 8))
    assert all(q1 <= med <= q3 for med, q1, q3 in v7.values())
    assert round(v7[88][0], 2) == 1.19 and by_head_dim(rows, "ours_fwd_fp16_v7", causal=True) == {}
    assert by_head_dim(rows, "sdpa_flash")[64][0] == 1.0  # flash against itself
