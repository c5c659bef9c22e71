"""The main job: `flashsim report` on the paper's GPT-2-medium workload."""

import time

import pytest

from analysis.cli import main
from flashsim import get_gpu, simulate
from flashsim.report import DEFAULT_WORKLOAD, fmt_num, format_table, run_report, simulate_summary
from flashsim.sweep import read_csv

PNG = b"\x89PNG\r\n\x1a\n"

# one worker for every report test (here and in test_reliability_records): the L2 model's runs are
# kept per process (flashsim.report._dram_bytes), so the report is simulated once
pytestmark = pytest.mark.xdist_group("report")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    lines = []
    t0 = time.perf_counter()
    res = run_report(out, echo=lines.append)
    print(f"report took {time.perf_counter() - t0:.2f} s")
    return out, res, "\n".join(lines)


def test_files_written(report):
    out, res, text = report
    names = {p.name for p in out.iterdir()}
    assert names == {"io_table.csv", "dram_table.csv", "decode_table.csv", "m_sweep.csv", "n_sweep.csv", "m_sweep.png",
                     "n_sweep.png"}
    for p in res["files"].values():
        assert p.parent == out and p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG
        assert str(p) in text  # says where it wrote them


def test_dram_table(report):
    """LSU and DRAM levels side by side on the three presets: the DRAM level is what the L2 model
    lets through, never more reads than requested, and FlashAttention-2's K, V re-reads mostly hit."""
    out, res, text = report
    rows = read_csv(out / "dram_table.csv")
    assert {(r["gpu"][:4], r["algo"]) for r in rows} == {(g, a) for g in ("A100", "H100", "H200")
                                                         for a in ("standard", "flash1", "flash2")}
    for r in rows:
        assert 0 < r["dram_read_bytes"] <= r["lsu_read_bytes"] * 1.001
        assert 0 < r["dram_bytes"]
    f2 = [r for r in rows if r["algo"] == "flash2"]
    assert all(r["dram_bytes"] < 0.5 * r["lsu_bytes"] for r in f2)
    assert "DRAM/LSU" in text


def test_decode_table(report):
    """The decoding section: every row walked, equal to the closed form and to compulsory + the
    overheads; bytes per token grow with Nk; a batch of one sequence is split, and the proposed
    split count fills the GPU."""
    out, res, text = report
    rows = read_csv(out / "decode_table.csv")
    assert len(rows) == 6 and all(r["agrees"] is True for r in rows)
    assert "walker, closed form and compulsory + overheads agree on every row: yes" in text
    for b in (1, 16):
        per = [r["bytes_per_token"] for r in rows if r["batch"] == b]
        assert per == sorted(per) and per[-1] > 200 * per[0]
    one = [r for r in rows if r["batch"] == 1]
    assert all(r["num_splits"] > 1 and r["programs"] >= 0.9 * r["num_sms"] for r in one)
    for r in rows:
        assert r["schedule_bytes"] == r["compulsory_bytes"] + r["split_bytes"] + r["paging_bytes"] + r["lengths_bytes"]
        assert r["lengths_bytes"] == 4 * r["batch"] * r["kv_heads"] * r["num_splits"]  # one int32 per program
        assert r["no_gqa_packing_bytes"] > 2 * r["schedule_bytes"]  # 4 query heads per kv head
    assert "compulsory MB/token" in text


def test_io_table(report):
    out, res, text = report
    io = read_csv(out / "io_table.csv")
    assert len(io) == 2 * 3 * 2  # GPUs x algorithms x passes
    assert {(r["algo"], r["pass"]) for r in io} == {(a, p) for a in ("standard", "flash1", "flash2")
                                                    for p in ("fwd", "bwd")}
    assert all(r["agrees"] is True for r in io)
    assert "walker and closed form agree on every run: yes" in text
    by = {(r["gpu"], r["algo"], r["pass"]): r for r in io}
    for g in ("A100-SXM4-40GB", "H100-SXM5-80GB"):
        for p in ("fwd", "bwd"):
            # the paper's point: the flash algorithms move several times fewer bytes than standard attention
            assert by[(g, "flash1", p)]["hbm_bytes"] * 2 < by[(g, "standard", p)]["hbm_bytes"]
            assert by[(g, "flash2", p)]["hbm_bytes"] * 2 < by[(g, "standard", p)]["hbm_bytes"]
            assert by[(g, "standard", p)]["bound"] == "memory"
            for a in ("standard", "flash1", "flash2"):
                r = by[(g, a, p)]
                assert r["hbm_bytes"] == r["hbm_read_bytes"] + r["hbm_write_bytes"]
                assert r["time_s"] > 0 and r["flops"] > 0
    # the table printed has every row
    assert sum(1 for ln in text.splitlines() if ln.split()[1:2] in (["standard"], ["flash1"], ["flash2"])) >= 12


def test_flash2_forward_bytes_by_hand(report):
    """FlashAttention-2 forward on H100 (M = 227 KiB of fp16 = 116,224 elements, so Br = 64):
    Q read and O written once, K and V read once per query block (Tr = 1024/64 = 16), L (fp32)
    written once; B·H = 1024 heads of N·d = 65,536 elements."""
    _, res, _ = report
    r = next(r for r in res["io"] if r["gpu"] == "H100-SXM5-80GB" and r["algo"] == "flash2" and r["pass"] == "fwd")
    assert (r["block_m"], r["block_n"]) == (64, 454)
    bh, nd = 1024, 1024 * 64
    assert r["hbm_bytes"] == bh * (2 * nd + 2 * 16 * nd) * 2 + bh * 1024 * 4 == 4_567_597_056
    m = get_gpu("h100").sram_elems(2)
    assert simulate(DEFAULT_WORKLOAD, "flash2", "fwd", sram_elems=m).io.bytes == r["hbm_bytes"]


def test_sweeps(report):
    out, res, text = report
    m = read_csv(out / "m_sweep.csv")
    n = read_csv(out / "n_sweep.csv")
    assert len(m) == len(res["m_sweep"]) and len(n) == len(res["n_sweep"])
    fits = {(f["gpu"], f["algo"], f["pass"]): f["exponent"] for f in res["m_exponents"]}
    for g in ("A100-SXM4-40GB", "H100-SXM5-80GB"):
        assert abs(fits[(g, "standard", "fwd")]) < 1e-9  # standard attention does not use M
        assert -1.0 <= fits[(g, "flash1", "fwd")] < -0.8  # Θ(N²d²/M), plus the M-free N·d terms
        assert fits[(g, "flash2", "fwd")] < -0.2
    for f in res["n_exponents"]:
        assert 1.6 < f["exponent"] < 2.05, f  # Θ(N²) at fixed M, d
    assert "HBM bytes ∝ M^exponent" in text and "HBM bytes ∝ N^exponent" in text
    # the M table lists every GPU of the report (the plot shows them all), and says why flash2's
    # exponent is not -1: Br = min(⌈M/4d⌉, d) reaches d = 64 at M = 4d² = 16,384, flat after
    m_table = text.split("HBM bytes ∝ M^exponent")[1].split("HBM bytes ∝ N^exponent")[0]
    assert "A100-SXM4-40GB  flash2" in m_table and "H100-SXM5-80GB  flash2" in m_table
    assert "why flash2 is not M^-1" in m_table and "M = 4d² = 16,384" in m_table
    assert "so flash2 moves" in text and "Tr = 16 times" in text


def test_m_sweep_notes_from_the_records(report):
    """The reason printed for flash2's exponent is computed: below the cap its bytes fall as
    M^-1 (within the Θ(Nd) terms), above it they do not move."""
    from flashsim.report import m_sweep_notes

    _, res, _ = report
    f2 = sorted((r for r in res["m_sweep"] if r["gpu"] == "A100-SXM4-40GB" and r["algo"] == "flash2"),
                key=lambda r: r["sram_elems"])
    capped = [r for r in f2 if r["block_m"] == 64]
    assert capped[0]["sram_elems"] == 4 * 64 * 64
    assert len({r["hbm_bytes"] for r in capped}) == 1  # flat once Br = d
    note = " ".join(m_sweep_notes(res["m_sweep"], DEFAULT_WORKLOAD))
    assert "M^+0.000" in note and "-0.358" in note


def test_cli_report(tmp_path, capsys):
    rc = main(["report", "--out", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert (tmp_path / "r" / "io_table.csv").exists()
    assert f"to {tmp_path / 'r'}/" in out


def test_cli_report_bad_out(tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    rc = main(["report", "--out", str(f / "sub")])
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("flashsim: error: ")


def test_simulate_summary_json_ready():
    import json

    m = get_gpu("a100").sram_elems(2)
    r = simulate(DEFAULT_WORKLOAD, "flash2", "bwd", sram_elems=m)
    s = simulate_summary(r, get_gpu("a100"), m)
    json.dumps(s, allow_nan=False)
    assert s["hbm_bytes"] == r.io.bytes and len(s["per_launch"]) == len(r.io.per_launch)


def test_format_helpers():
    assert fmt_num(1234567) == "1,234,567"
    assert fmt_num(0.5) == "0.500" and fmt_num(2.5e9) == "2.5e+09" and fmt_num(None) == "-"
    assert fmt_num(True) == "yes"
    t = format_table(["a", "bb"], [["x", 1], ["yy", 22]]).splitlines()
    assert t[0] == "a   bb" and t[2] == "x    1" and t[3] == "yy  22"
