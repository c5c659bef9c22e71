"""The Hopper warpgroup instructions are reachable from a Numba kernel (scripts/wgmma_probe.py):
compile-only, no GPU (in a subprocess, outside the CUDA simulator, as the other PTX tests)."""

import shutil
from pathlib import Path

from _ptx import run_without_simulator

PROBE = Path(__file__).parents[1] / "scripts" / "wgmma_probe.py"


def test_wgmma_and_setmaxnreg_compile_for_sm90a_and_not_for_sm90():
    res = run_without_simulator("import runpy, sys; sys.argv = ['wgmma_probe']; "
                                f"sys.exit(runpy.run_path({str(PROBE)!r}, run_name='__main__'))")
    print(res.stdout)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    a = next(ln for ln in lines if ln.startswith("sm_90a:"))
    plain = next(ln for ln in lines if ln.startswith("sm_90:"))
    # numba-cuda's LTO PTX keeps the linked CUDA C++'s instructions and the target it was asked for
    assert ".target sm_90a, wgmma.mma_async 1, setmaxnreg 2" in a
    assert ".target sm_90, wgmma.mma_async 1, setmaxnreg 2" in plain
    if shutil.which("ptxas"):  # ptxas assembles them for sm_90a and refuses them for sm_90
        text = res.stdout
        assert "  ptxas: accepted" in text.split("sm_90:")[0]
        refused = text.split("sm_90:")[1]
        assert "ptxas: rejected" in refused and "wgmma.mma_async" in refused and "setmaxnreg" in refused


def test_the_probe_refuses_the_simulator(monkeypatch):
    import runpy

    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    monkeypatch.setattr("sys.argv", ["wgmma_probe"])
    mod = runpy.run_path(str(PROBE))
    assert mod["main"]() == 2
