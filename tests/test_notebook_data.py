"""analysis.notebook_data: the GPU preset named by a data file's provenance."""

import pytest

from analysis.notebook_data import load_meta, preset_of
from flashsim.config import get_gpu


@pytest.mark.parametrize("name, preset", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                          ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
                                          ("NVIDIA A100-SXM4-40GB", "a100")])
def test_preset_of(name, preset):
    assert preset_of(name) == preset
    get_gpu(preset)  # a preset flashsim knows


def test_preset_of_unknown_gpu():
    with pytest.raises(ValueError, match="no flashsim GPU preset"):
        preset_of("NVIDIA GeForce RTX 4090")


def test_committed_measurements_name_a_known_gpu():
    assert preset_of(load_meta("h200")["gpu"]) == "h200"
