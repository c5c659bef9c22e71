"""The fast variants are found by the names the records use (kernels/data, BEST), each in the
module of its op and precision; the tensor-core helpers have one interface on both targets."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from kernels import perf
from kernels.perf import tc

DATA = Path(__file__).resolve().parent.parent / "kernels" / "data"


def test_every_variant_resolves_to_its_module_and_interface():
    for name, module in perf.VARIANTS.items():
        v = perf.variant(name)
        print(name, "->", module, sorted(vars(v)))
        assert v.name == name and getattr(perf, name) is v
        assert module == name.rsplit("_", 1)[0] and name in perf.VARIANTS
        assert callable(v.supports) and callable(v.default_config) and v.SOURCES
        assert hasattr(v, "forward") != hasattr(v, "backward")
        if hasattr(v, "backward"):
            assert callable(v.saved_forward)
    with pytest.raises(ValueError, match="variant='fwd_fp16_v1'"):
        perf.variant("fwd_fp16_v1")  # left the tree (kernels/perf/NOTES.md)


def test_best_and_the_bench_record_name_variants_in_the_tree():
    named = {name for choices in perf.BEST.values() for name, _, _ in choices}
    with open(DATA / "bench_h100.csv") as f:
        named |= {r["variant"][len("ours_"):] for r in csv.DictReader(f)
                  if r["variant"].startswith("ours_") and r["variant"] not in ("ours_flash2", "ours_standard")}
    print(sorted(named))
    assert named <= set(perf.VARIANTS)


def test_tc_exports_its_helpers_only():
    assert set(tc.__all__) == {"SIM", "MAX_WARPS", "device_inline", "jit_kernel", "tile_addr", "wg_desc", "ops",
                               *tc.HELPERS}
    assert tc.ops(False) == (tc.mma, tc.mma_z, tc.pack_f16x2)
    assert tc.ops(True) == (tc.mma_bf16, tc.mma_z_bf16, tc.pack_bf16x2)
    for name in tc.HELPERS:
        assert getattr(tc, name) is getattr(tc._target, name)
    assert "int32" not in tc.__all__
