"""The paper's Figure 2 (left) at the DRAM level: GPT-2-medium attention on the A100 preset.

    python scripts/figure2_dram.py [--gpu a100] [--sample 16] [--out PATH]

One attention layer of GPT-2 medium (N = 1,024, d = 64, 16 heads, batch 64, fp16), forward and
backward, through the L2 model of ``--gpu`` (flashsim.l2, the L2 carried from launch to launch
within a pass, every dirty line written back at the end) beside the walker's LSU-level count,
for the standard-attention variants (fusion, dropout, causal mask) and FlashAttention-1 and -2
with the blocks the paper's rule gives for the preset's shared memory.  The paper reports
40.3 GB (35.3 GB in its later revision) for standard attention and 4.4 GB for FlashAttention.
Prints a table; writes it as CSV when ``--out`` is given.  Each row is
:func:`analysis.figure2.figure2_row`, which notebook 03 uses too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.figure2 import figure2_row
from flashsim.config import get_gpu
from flashsim.sweep import write_csv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    try:
        get_gpu(a.gpu)  # an unknown preset is refused before any work
        if a.sample < 1:
            raise ValueError(f"sample={a.sample}: must be a positive integer (--sample)")
    except ValueError as e:
        print(f"figure2_dram: error: {e}", file=sys.stderr)
        return 2
    cases = [
        ("standard", True, {"fuse": "none", "dropout": 0.1}),
        ("standard", True, {"fuse": "softmax", "dropout": 0.1}),
        ("standard", True, {"fuse": "softmax", "dropout": 0.0}),
        ("standard", False, {"fuse": "softmax", "dropout": 0.0}),
        ("standard", True, {"fuse": "all", "dropout": 0.1}),
        ("flash1", True, {}), ("flash1", False, {}), ("flash2", True, {}), ("flash2", False, {}),
    ]
    rows = []
    for algo, causal, opts in cases:
        rows.append(figure2_row(algo, causal, opts, a.gpu, a.sample))
        r = rows[-1]
        print(f"{algo:<9} causal={causal!s:<5} fuse={r['fuse']!s:<8} dropout={r['dropout']!s:<4} "
              f"blocks={r['blocks']:<7} "
              f"LSU {r['lsu_GB']:7.2f} GB  DRAM {r['dram_GB']:7.2f} GB (read {r['dram_read_GB']:6.2f}, write "
              f"{r['dram_write_GB']:6.2f})  [{r['seconds']:.0f} s]", flush=True)
    if a.out:
        write_csv(rows, a.out)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
