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


def test_one_gpu_name_to_preset_rule_for_every_layer():
    """flashsim.config.preset_of is the one rule: compare's (None for an unknown GPU), the
    notebooks' (ValueError) and the tuner's (a warning, then the H100's) all go through it."""
    from analysis.compare import preset_of as compare_preset_of
    from flashsim.config import preset_of as config_preset_of
    from kernels.perf.autotune import _preset_for

    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"):
        assert config_preset_of(name) == preset_of(name) == compare_preset_of({"gpu": name}) == _preset_for(name)
    assert config_preset_of("NVIDIA L4") is None and config_preset_of(None) is None
    with pytest.warns(UserWarning, match="no flashsim preset"):
        assert _preset_for("NVIDIA L4") == "h100"
