"""analysis.figure2: the paper's Figure 2 (left) cases, at a size the CPU counts in a second."""

import pytest

from analysis.figure2 import GPT2_MEDIUM, PAPER_CASES, PAPER_GB, figure2_row

SMALL = {"batch": 1, "heads": 2, "seq_len_q": 256, "head_dim": 64, "dtype": "fp16"}


def test_paper_cases_are_gpt2_medium_as_stated():
    assert GPT2_MEDIUM == {"batch": 64, "heads": 16, "seq_len_q": 1024, "head_dim": 64, "dtype": "fp16"}
    assert PAPER_GB == {"standard": 40.3, "standard_revision": 35.3, "flash1": 4.4}
    cases = {name: (algo, causal, opts) for name, algo, causal, opts in PAPER_CASES}
    assert cases == {"standard": ("standard", True, {"fuse": "softmax", "dropout": 0.1}),
                     "flash1": ("flash1", False, {})}


@pytest.mark.parametrize("name,algo,causal,opts", PAPER_CASES)
def test_small_case_counts(name, algo, causal, opts):
    r = figure2_row(algo, causal, opts, gpu="a100", sample=1, shape=SMALL)
    print(name, r)
    assert r["dram_GB"] == pytest.approx(r["dram_read_GB"] + r["dram_write_GB"])
    # a working set of a few MB in a 40 MB L2: every re-read hits, so DRAM is below the LSU level
    assert 0 < r["dram_GB"] < r["lsu_GB"]
    assert r["blocks"] == ("" if algo == "standard" else "64x328")  # the paper's rule for the A100's 164 KiB


def test_unknown_gpu_is_refused():
    with pytest.raises(ValueError, match="gpu|preset"):
        figure2_row("flash1", False, gpu="no-such-gpu", shape=SMALL)
