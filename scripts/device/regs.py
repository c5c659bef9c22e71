"""Registers, local memory (spills) and shared memory of a fast variant's compiled kernel.

    python scripts/device/regs.py fwd_fp32_v1 64 '{"rm": 2}'
    python scripts/device/regs.py fwd_fp32_v2 128 '{}' '{"minb": 2}'

Runs the variant once on small random inputs (so Numba compiles it for this GPU), then prints
what the driver reports for every kernel that module has compiled.  A backward variant (a module
with ``backward`` and a single ``kernel(d, causal, **config)``) runs its saved forward and its
backward.  GPU only.
"""

import json
import sys

import numpy as np

from kernels.perf import variant


def main():
    name, d = sys.argv[1], int(sys.argv[2])
    cfgs = [json.loads(c) for c in sys.argv[3:]] or [{}]
    mod = variant(name)
    dt = np.float32 if "fp32" in name else np.float16
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 256, d)).astype(dt) for _ in range(3))
    bwd = hasattr(mod, "backward")
    for cfg in cfgs:
        for causal in (False, True):
            if bwd:
                o, lse = mod.saved_forward(q, k, v, causal=causal)
                mod.backward(q, k, v, o, lse, q, causal=causal, **cfg)
            else:
                mod.forward(q, k, v, causal=causal, **cfg)
    print(f"{name} d={d}:")
    for cfg in cfgs:
        full = dict(mod.default_config(d), **cfg)
        for causal in (False, True):
            args = dict(full)
            if bwd:
                kern = mod.kernel(d, causal, **args)[0]
            else:  # the forwards' kernel(d=, causal=, **config), as kernels.perf._launch calls it
                kern = mod.kernel(d=d, causal=causal, **args)[0]
            regs = kern.get_regs_per_thread()
            lmem = kern.get_local_mem_per_thread()
            print(f"  {json.dumps(full)} causal={causal}: regs {list(regs.values())} local bytes {list(lmem.values())}")


if __name__ == "__main__":
    main()
