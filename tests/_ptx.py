"""Running a compile-only script outside the CUDA simulator.

``numba.cuda.compile_ptx`` is unavailable under ``NUMBA_ENABLE_CUDASIM=1`` (which the test suite
sets), so the tests that check a kernel's sm_90 PTX run their script in a fresh interpreter
without it, from the repository root with the root on ``PYTHONPATH``."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_without_simulator(script: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -c script`` without the CUDA simulator; its output captured as text."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
