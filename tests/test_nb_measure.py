"""analysis/nb_measure.py's CPU-side pieces: the input distributions, the chunked float64 and
plain-fp16 references (against kernels/reference.py) and the configuration sets (the GPU steps
themselves run only on a GPU: scripts/device/nb_measure.sh)."""

import numpy as np
import pytest

from analysis import nb_measure as m
from kernels import reference as ref


@pytest.mark.parametrize("dist", m.DISTRIBUTIONS)
def test_distributions(dist):
    x = m.draw(np.random.default_rng(0), (200_000,), dist)
    want_std = {"normal": 1.0, "uniform": 1.0, "large": 4.0, "outlier": np.sqrt(1 + 399 / 200)}[dist]
    assert abs(x.mean()) < 0.05 and x.std() == pytest.approx(want_std, rel=0.05)


def test_distribution_refused():
    with pytest.raises(ValueError, match="dist="):
        m.draw(np.random.default_rng(0), (3,), "cauchy")


def test_chunked_references_match_kernels_reference():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    q, k, v = (m.draw(rng, (1, 2, 100, 16), "outlier").astype(np.float16) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    want, _ = ref.attention_forward(q, k, v)
    got = m._reference(torch, tq, tk, tv, lowp=False, chunk=7)
    assert np.abs(got.numpy() - want).max() < 1e-12
    low = m._reference(torch, tq, tk, tv, lowp=True, chunk=33)
    assert m._rel(torch, low, torch.from_numpy(want)) == pytest.approx(
        ref.rel_error(ref.plain_attention_lowp(q, k, v), want), rel=0.05)


def test_configuration_sets():
    fig2 = m.fig2_configs()
    assert {c["kernel"] for c in fig2} == {"flash1", "flash2"}
    assert all(c["batch"] * c["heads"] >= 132 for c in fig2)  # one block per head at least fills an H100
    ds = m.dsweep_configs()
    assert sorted({c["head_dim"] for c in ds}) == [32, 64, 96, 128, 192, 256]
    assert len({c["seq_len_q"] for c in ds}) == 1
    assert "long" in m.STEPS and "exact" in m.STEPS
