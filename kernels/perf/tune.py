"""Block-shape sweep of one numbered forward variant, beside torch's naive attention and SDPA.

    python -m kernels.perf.tune fwd_fp16_v2 --d 64 --n 4096 16384 \
        --configs '{"bc": 64, "mt": 2}' '{"bc": 32, "mt": 2}' [--causal] [--out DIR]

Each configuration is checked against the float64 reference on sampled rows first (the same
check as ``kernels.bench``), then timed with CUDA events (warm-up, median of ``--repeat``
calls over rotating inputs, L2 flushed before each).  Prints one line per (configuration,
shape) and writes ``DIR/tune_<variant>.csv``.  For finding a variant's defaults; the
benchmark of record is ``kernels.bench``.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import sys
from pathlib import Path

import numpy as np

from ..bench import _check_fwd, _time, _torch_fns, flops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant")
    ap.add_argument("--d", type=int, nargs="+", default=[64])
    ap.add_argument("--n", type=int, nargs="+", default=[4096])
    ap.add_argument("--bh", type=int, default=16, help="batch*heads (batch = bh // 16, heads = 16)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "fp32"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--configs", nargs="*", default=["{}"], help="JSON objects overriding default_config(d)")
    ap.add_argument("--peers", nargs="*", default=["naive", "sdpa_flash"])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    mod = importlib.import_module(f"kernels.perf.{args.variant}")
    peers = _torch_fns(torch)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    rng = np.random.default_rng(0)
    tdt = torch.float16 if args.dtype == "fp16" else torch.float32
    rows = []
    for d in args.d:
        for n in args.n:
            b, h = max(1, args.bh // 16), min(16, args.bh)
            inputs = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=tdt) for _ in range(3)) for _ in range(3)]
            fl = flops(b, h, n, d, args.causal, "fwd")
            base = {}
            for p in args.peers:
                if p.startswith("sdpa") and args.dtype == "fp32":
                    continue
                ms, _ = _time(torch, lambda q, k, v, f=peers[p]: f(q, k, v, args.causal), inputs, args.repeat, flush)
                base[p] = ms
                print(f"{p:24s} d={d:<4d} N={n:<6d} {ms:8.3f} ms {fl / ms / 1e9:7.1f} TFLOP/s", flush=True)
            for cj in args.configs:
                cfg = json.loads(cj)
                rec = {"variant": args.variant, "d": d, "n": n, "bh": b * h, "causal": args.causal, **cfg}
                try:
                    def fn(q, k, v, cfg=cfg):
                        return mod.forward(q, k, v, causal=args.causal, **cfg)

                    q, k, v = inputs[0]
                    out = torch.as_tensor(fn(q, k, v), device="cuda")
                    rec["rel_err"] = _check_fwd(out, q, k, v, args.causal, rng)
                    ms, sd = _time(torch, fn, inputs, args.repeat, flush)
                    rec.update(ms=ms, ms_std=sd, tflops=fl / ms / 1e9, **{f"x_{p}": base[p] / ms for p in base})
                    ratios = "  ".join(f"x {p} {base[p] / ms:5.2f}" for p in base)
                    line = f"{ms:8.3f} ms {rec['tflops']:7.1f} TFLOP/s  {ratios}  err {rec['rel_err']:.1e}"
                except Exception as e:  # one configuration's failure must not stop the sweep
                    rec["error"] = repr(e)[:300]
                    line = rec["error"]
                rows.append(rec)
                print(f"{cj:24s} d={d:<4d} N={n:<6d} {line}", flush=True)
            del inputs
    if args.out and rows:
        path = Path(args.out) / f"tune_{args.variant}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        fields = sorted({k for r in rows for k in r})
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
