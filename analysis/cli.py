"""The whole ``flashsim`` program: the simulator's commands plus the GPU side's, ``measure`` and
``compare``.

The ``flashsim`` console script and ``python -m flashsim`` run :func:`main` here.  Layers only look
down (``flashsim`` <- ``kernels`` <- ``analysis``): the command-line machinery and the simulator's
commands live in :mod:`flashsim.cli`, which imports nothing above ``flashsim``; the two commands
that drive Nsight Compute and read its data are written here, in the layer whose code they run,
and registered here: :data:`COMMANDS` is :data:`flashsim.cli.COMMANDS` with these two after
them (the module docstring there says why this and not a top layer holding the whole command
line).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flashsim import cli as _cli
from flashsim.cli import UsageError, add_force

from .compare import DRAM_ERR_FLOOR, LSU_TOLERANCE
from .compare import run as run_compare
from .configs import SET_METRICS, SETS, config_id
from .measure import DEFAULT_OUT, MeasureError, measure


def _cmd_measure(a: argparse.Namespace) -> int:
    out = DEFAULT_OUT.format(set=a.set) if a.out is None else a.out
    configs = SETS[a.set]()
    if a.only:
        configs = [c for c in configs if a.only in config_id(c)]
        if not configs:
            raise UsageError(f"--only {a.only!r}: matches no configuration of set {a.set!r}")
    try:
        extra = {"metrics": SET_METRICS[a.set]()} if a.set in SET_METRICS else {}
        measure(configs, out, a.set, a.cache_control, force=a.force, **extra)
    except MeasureError as e:
        raise UsageError(str(e)) from None
    return 0


def add_measure(sub) -> None:
    m = sub.add_parser("measure", help="run the measured configurations under Nsight Compute (GPU machine)",
                       description="Run a named set of kernel configurations under Nsight Compute (ncu) and write "
                                   "one row per kernel launch (LSU, L2 and DRAM traffic, time) with its provenance: "
                                   "SET.csv, SET.meta.json and SET.ncu-raw.csv, all three or none. Needs an NVIDIA "
                                   "GPU and ncu; elsewhere it says which is missing.")
    m.add_argument("--set", default="h200", choices=sorted(SETS),
                   help="configuration set (default h200, the committed record's GPU; h100, h200 and main are the "
                        "same 54 configurations, named for the record they make; smoke is five small ones)")
    m.add_argument("--out", "-o", default=None, metavar="DIR",
                   help=f"output folder (default {DEFAULT_OUT.format(set='SET')}; the committed records in "
                        "analysis/data/ are copied there by hand)")
    add_force(m, "an earlier record of the set")
    m.add_argument("--cache-control", default="all", choices=("all", "none"),
                   help="ncu --cache-control: flush caches before each replay pass (all, the default) or not")
    m.add_argument("--only", default=None, metavar="TEXT", help="measure only configurations whose id contains TEXT")
    m.set_defaults(func=_cmd_measure)


def _cmd_compare(a: argparse.Namespace) -> int:
    return run_compare(a.data, a.out, gpu=a.gpu, plots=not a.no_plots, force=a.force)


def add_compare(sub) -> None:
    c = sub.add_parser("compare", help="measured traffic against the simulator (table, fits, plots)",
                       description="Compare a measured CSV (from 'flashsim measure') with the simulator, launch by "
                                   f"launch, at the LSU level (tolerance {100 * LSU_TOLERANCE:g}%) and the DRAM level "
                                   "(the L2 model flashsim.l2, errors reported), and fit Theorem 2's exponents.  "
                                   "A launch's "
                                   "DRAM error is (measured - predicted) / max(predicted, "
                                   f"{DRAM_ERR_FLOOR / 1e6:g} MB): a launch that moves a few kilobytes (the "
                                   "FlashAttention-1 init kernel) would otherwise show a huge relative error for a "
                                   "difference that means nothing.  Exit status 1 if any launch's LSU-level error "
                                   "exceeds the tolerance, 2 if the data cannot be read.")
    c.add_argument("data", metavar="DATA", help="measured CSV, e.g. analysis/data/h100/h100.csv")
    c.add_argument("--out", "-o", default=None, metavar="DIR", help="write comparison CSVs, JSON and plots here")
    add_force(c, "an earlier comparison")
    c.add_argument("--gpu", default=None, help="GPU preset of the measurement (default: the one the data's "
                                                "provenance names)")
    c.add_argument("--no-plots", action="store_true", help="skip the plots")
    c.set_defaults(func=_cmd_compare)


#: Every command of the program: the simulator's, then the GPU side's.
COMMANDS = (*_cli.COMMANDS, add_measure, add_compare)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser(COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``flashsim``; returns the exit status (0 ok, 1 ``compare`` outside tolerance, 2 an error)."""
    return _cli.main(argv, COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
