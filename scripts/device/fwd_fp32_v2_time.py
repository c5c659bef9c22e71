"""usage: python scripts/device/fwd_fp32_v2_time.py [--repeat 15] [--ns 4096 16384] [--sweep] [--out DIR]

The fp32 forward on a GPU: torch's naive attention (TF32 off), fwd_fp32_v1 (FFMA) and fwd_fp32_v2
(3xTF32) in one process, at B·H = 16·16384/N (kernels.bench's shapes), d = 64 and 128, causal and
not.  Each time is the median of ``--repeat`` calls (CUDA events, L2 flushed, three rotating input
sets: ``kernels.bench``'s timer); each variant's O is first checked against float64 on 32 sampled
rows (``kernels.bench``'s check).  Prints one line per shape: ms, TFLOP/s, v2 / naive, v2 / v1
and both errors.  ``--sweep`` then times other block shapes of v2 at N = 4,096 (not causal) against
its default.  ``--ab KEY=VALUE`` instead times, at each shape, naive, v2 and v2 with that config
change in ``--rounds`` rounds (the order rotated each round), and prints per shape whether the
change's O equals v2's bit for bit and its error against float64, then the median over the rounds
of each one's same-round ratio to naive with their range, and of the change's time over v2's.
``--out DIR`` writes ``fwd_fp32_v2_time.csv`` there.
"""

import argparse
import csv
import os
import re
import sys
import time

import numpy as np
import torch

from kernels.bench import _check_fwd, _time, _torch_fns, flops
from kernels.perf import fwd_fp32_v1, fwd_fp32_v2

#: v2's block shapes tried against its default.  Registers from ptxas 13.0 on the CPU machine (not
#: causal): d = 64 default (Bc 64) 181, Bc 32 166 (three blocks of 4 warps an SM fit), mt 2 with
#: Bc 32 238; d = 128 default (Bc 32) 221, nw 8 221, mt 2 with Bc 16 255 and 60 bytes of spills,
#: Bc 64 puts an array in local memory (P V is not fully unrolled); minb 3 caps them at 168 (spills).
SWEEP = {64: [dict(qsplit=False), dict(bc=32), dict(minb=3), dict(bc=32, minb=3), dict(mt=2, bc=32),
              dict(nw=8), dict(ak=1)],
         128: [dict(qsplit=False), dict(minb=3), dict(bc=16), dict(nw=8), dict(ak=2), dict(mt=2, bc=16),
               dict(bc=64)]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--ns", nargs="*", type=int, default=[4096, 16384])
    ap.add_argument("--ds", nargs="*", type=int, default=[64, 128])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds after which the sweep stops")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ab", default=None, metavar="KEY=VALUE", help="A/B of one config change (an int; 0/1 a bool)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--causal", nargs="*", type=int, default=[0, 1])
    a = ap.parse_args()
    if a.ab and not re.fullmatch(r"[a-z_]+=-?\d+", a.ab):
        ap.error(f"--ab {a.ab!r}: must be KEY=INTEGER, a key of fwd_fp32_v2's config")
    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    naive = _torch_fns(torch)["naive"]
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    rng = np.random.default_rng(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []

    def ours(mod, **cfg):
        return lambda q, k, v, c: torch.as_tensor(mod.forward(q, k, v, causal=c, **cfg), device="cuda")

    def run(fns, b, n, d, causal):
        inputs = [tuple(torch.randn(b, 16, n, d, device="cuda") for _ in range(3)) for _ in range(3)]
        out = {}
        for name, f in fns.items():
            q, k, v = inputs[0]
            err = _check_fwd(torch, f(q, k, v, causal), q, k, v, causal, rng)
            ms, sd = _time(torch, lambda q, k, v, f=f, c=causal: f(q, k, v, c), inputs, a.repeat, flush)
            out[name] = dict(ms=ms, sd=sd, err=err, tflops=flops(b, 16, n, d, causal, "fwd") / ms / 1e9)
            rows.append(dict(variant=name, n=n, d=d, causal=causal, batch=b, heads=16, **out[name]))
        del inputs
        torch.cuda.empty_cache()
        return out

    if a.ab:
        return ab(a, naive, ours, flush, rows, t0)
    for d in a.ds:
        for causal in (False, True):
            for n in a.ns:
                b = max(1, 16384 // n)
                r = run({"naive": naive, "fwd_fp32_v1": ours(fwd_fp32_v1), "fwd_fp32_v2": ours(fwd_fp32_v2)},
                        b, n, d, causal)
                nv, v1, v2 = r["naive"], r["fwd_fp32_v1"], r["fwd_fp32_v2"]
                print(f"d={d:3d} causal={causal!s:5s} N={n:6d} B={b:2d}: ms naive {nv['ms']:8.3f}  v1 {v1['ms']:8.3f}"
                      f"  v2 {v2['ms']:8.3f} ({v2['tflops']:5.1f} TFLOP/s; v1 {v1['tflops']:5.1f})  "
                      f"v2/naive {nv['ms'] / v2['ms']:5.2f}x  v2/v1 {v1['ms'] / v2['ms']:5.2f}x  "
                      f"err v2 {v2['err']:.2e} v1 {v1['err']:.2e}", flush=True)
    if a.sweep:
        n = 4096
        for d in a.ds:
            base = fwd_fp32_v2.default_config(d)
            for extra in [{}] + SWEEP.get(d, []):
                if time.time() - t0 > a.budget:
                    print("sweep stopped: time budget spent", flush=True)
                    break
                cfg = dict(base, **extra)
                try:
                    r = run({f"fwd_fp32_v2 {extra}": ours(fwd_fp32_v2, **extra)}, 4, n, d, False)
                except Exception as e:  # a shape that does not compile or fit: report, go on
                    print(f"sweep d={d} {cfg}: {e!r}"[:300], flush=True)
                    continue
                (x,) = r.values()
                print(f"sweep d={d} N={n} {cfg}: {x['ms']:8.3f} ms {x['tflops']:5.1f} TFLOP/s err {x['err']:.2e}",
                      flush=True)
    return finish(a, rows, "fwd_fp32_v2_time.csv", t0)


def finish(a, rows, name, t0) -> int:
    """``--out``: the rows as ``name`` there (written to a temporary name, then renamed)."""
    if a.out:
        path = os.path.join(a.out, name)
        with open(path + ".tmp", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")
    print(f"{time.time() - t0:.0f} s")
    return 0


def ab(a, naive, ours, flush, rows, t0) -> int:
    """``--ab``: naive, v2 and v2 with the change, interleaved in rounds (see the docstring)."""
    from kernels.bench import _calls

    key, val = a.ab.split("=")
    val = int(val)
    change = {key: bool(val) if isinstance(fwd_fp32_v2.default_config(64).get(key), bool) else val}
    fns = {"naive": naive, "v2": ours(fwd_fp32_v2), "change": ours(fwd_fp32_v2, **change)}
    for d in a.ds:
        for causal in map(bool, a.causal):
            for n in a.ns:
                b = max(1, 16384 // n)
                inputs = [tuple(torch.randn(b, 16, n, d, device="cuda") for _ in range(3)) for _ in range(3)]
                q, k, v = inputs[0]
                same = torch.equal(fns["v2"](q, k, v, causal), fns["change"](q, k, v, causal))
                err = _check_fwd(torch, fns["change"](q, k, v, causal), q, k, v, causal, np.random.default_rng(n + d))
                names = list(fns)
                ms = {x: [] for x in names}
                for r in range(a.rounds):
                    for x in names[r % 3:] + names[:r % 3]:
                        f = fns[x]
                        ms[x].append(float(np.median(_calls(torch, lambda q, k, v, f=f, c=causal: f(q, k, v, c), inputs,
                                                            a.repeat, flush, 2))))
                rv2 = [nv / v2 for nv, v2 in zip(ms["naive"], ms["v2"])]
                rch = [nv / c for nv, c in zip(ms["naive"], ms["change"])]
                gain = [v2 / c for v2, c in zip(ms["v2"], ms["change"])]
                print(f"d={d:3d} causal={causal!s:5s} N={n:6d} B={b:2d}: v2/naive {np.median(rv2):.3f} "
                      f"({min(rv2):.3f}-{max(rv2):.3f})  {change}/naive {np.median(rch):.3f} "
                      f"({min(rch):.3f}-{max(rch):.3f})  speed-up {np.median(gain):.3f} "
                      f"({min(gain):.3f}-{max(gain):.3f})  O {'bit-identical' if same else 'differs'}, "
                      f"err {err:.2e}", flush=True)
                for x in names:
                    rows.append(dict(variant=x, change=str(change), n=n, d=d, causal=causal, batch=b, heads=16,
                                     o_identical=same, change_err=err,
                                     ms=float(np.median(ms[x])), ms_min=min(ms[x]), ms_max=max(ms[x]),
                                     tflops=flops(b, 16, n, d, causal, "fwd") / float(np.median(ms[x])) / 1e9))
                del inputs
                torch.cuda.empty_cache()
    return finish(a, rows, "fwd_fp32_v2_ab.csv", t0)


if __name__ == "__main__":
    sys.exit(main())
