"""Block-shape sweep of one numbered variant, beside torch's naive attention and SDPA.

    python -m kernels.perf.tune fwd_fp16_v4 --d 64 --n 4096 16384 \
        --configs '{"bc": 64, "mt": 2}' '{"bc": 32, "mt": 2}' [--causal] [--hkv H] [--out DIR [--force]]

Each configuration is checked against the float64 reference first (the same checks as
``kernels.bench``: the forward on sampled rows, a backward variant's gradients on the first head
against autograd through float64 attention), then timed with CUDA events (warm-up, median of
``--repeat`` calls over rotating inputs, L2 flushed before each).  A backward variant (a module
with ``backward``) is timed on the saved forward's O and L; the peers' backward through
autograd.  Prints one line per (configuration, shape) and writes ``DIR/tune_<variant>.csv`` and
its ``.meta.json`` (provenance), each to a temporary name then renamed; an earlier run's files
there are refused without ``--force``.  Bad arguments, and a machine without a CUDA GPU (or
torch), end in one ``flashsim: error:`` line, exit status 2, before anything runs or is written.
For finding a variant's defaults; the benchmark of record is ``kernels.bench``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from flashsim.cmdline import ToolParser

from ..bench import _check_fwd, _time, _torch_fns, bwd_error, cuda_torch, flops, time_peer_backward, write
from . import VARIANTS, variant

#: The peers ``--peers`` may name (kernels.bench's torch functions).
_PEERS = ("naive", "sdpa_flash", "sdpa_mem_eff", "sdpa_cudnn")


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant")
    ap.add_argument("--d", type=int, nargs="+", default=[64])
    ap.add_argument("--n", type=int, nargs="+", default=[4096])
    ap.add_argument("--bh", type=int, default=16, help="batch*heads (batch = bh // 16, heads = 16)")
    ap.add_argument("--hkv", type=int, default=None, help="kv heads (grouped-query; default: the query heads)")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--configs", nargs="*", default=["{}"], help="JSON objects overriding default_config(d)")
    ap.add_argument("--peers", nargs="*", default=["naive", "sdpa_flash"])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--out", default=None, metavar="DIR", help="write DIR/tune_VARIANT.csv and its .meta.json")
    ap.add_argument("--force", action="store_true", help="overwrite an earlier run's files in --out")
    args = ap.parse_args(argv)
    try:
        out = _checked(args)
        torch = cuda_torch("the peers (naive, SDPA) and the inputs need it")
        mod = variant(args.variant)
    except ValueError as e:
        print(f"flashsim: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    peers = _torch_fns(torch)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    rng = np.random.default_rng(0)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    rows = []
    for d in args.d:
        for n in args.n:
            b, h = max(1, args.bh // 16), min(16, args.bh)
            hkv = args.hkv or h
            inputs = [tuple(torch.randn(b, x, n, d, device="cuda", dtype=tdt) for x in (h, hkv, hkv))
                      for _ in range(3)]
            bwd = hasattr(mod, "backward")
            fl = flops(b, h, n, d, args.causal, "bwd" if bwd else "fwd")
            base = {}
            for p in args.peers:
                if p.startswith("sdpa") and args.dtype == "fp32":
                    continue
                if bwd:  # autograd through the peer, as kernels.bench times it (unchecked here)
                    sets = [(q, k, v, torch.randn_like(q)) for q, k, v in inputs]
                    ms, _, _, _ = time_peer_backward(torch, peers[p], sets, args.causal, args.repeat, flush,
                                                     lambda grads: float("nan"))
                    del sets
                else:
                    ms, _ = _time(torch, lambda q, k, v, f=peers[p]: f(q, k, v, args.causal), inputs, args.repeat,
                                  flush)
                base[p] = ms
                print(f"{p:24s} d={d:<4d} N={n:<6d} {ms:8.3f} ms {fl / ms / 1e9:7.1f} TFLOP/s", flush=True)
            for cj in args.configs:
                cfg = json.loads(cj)
                rec = {"variant": args.variant, "d": d, "n": n, "bh": b * h, "hkv": hkv, "causal": args.causal, **cfg}
                try:
                    if bwd:
                        sets = []
                        for q, k, v in inputs:
                            o, lse = mod.saved_forward(q, k, v, causal=args.causal)
                            sets.append((q, k, v, o, lse, torch.randn_like(q)))

                        def fn(q, k, v, o, lse, do, cfg=cfg):
                            return mod.backward(q, k, v, o, lse, do, causal=args.causal, **cfg)

                        q0, k0, v0, _, _, do0 = sets[0]
                        rec["rel_err"] = bwd_error(torch, fn(*sets[0]), q0, k0, v0, do0, args.causal)
                        ms, sd = _time(torch, fn, sets, args.repeat, flush)
                    else:
                        def fn(q, k, v, cfg=cfg):
                            return mod.forward(q, k, v, causal=args.causal, **cfg)

                        q, k, v = inputs[0]
                        out = torch.as_tensor(fn(q, k, v), device="cuda")
                        rec["rel_err"] = _check_fwd(torch, out, q, k, v, args.causal, rng)
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
    if out is not None and rows:
        from ..gpucheck import provenance

        write(out, rows, dict(provenance(), torch=torch.__version__, method=__doc__, tf32="off"))
    return 0


def _checked(args):
    """The CSV to write (or None) once every argument is checked; ValueError naming the flag for a
    bad one, or for an earlier run's files in ``--out`` without ``--force``."""
    if args.bh < 1:
        raise ValueError(f"--bh {args.bh}: must be >= 1")
    h = min(16, args.bh)
    if args.hkv is not None and (args.hkv < 1 or h % args.hkv):
        raise ValueError(f"--hkv {args.hkv}: must divide the {h} query heads")
    if args.repeat < 1:
        raise ValueError(f"--repeat {args.repeat}: must be >= 1")
    for name, xs in (("--d", args.d), ("--n", args.n)):
        if any(x < 1 for x in xs):
            raise ValueError(f"{name} {' '.join(map(str, xs))}: each must be >= 1")
    for cj in args.configs:
        try:
            cfg = json.loads(cj)
        except json.JSONDecodeError as e:
            raise ValueError(f"--configs {cj!r}: not JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"--configs {cj!r}: must be a JSON object")
    unknown = [p for p in args.peers if p not in _PEERS]
    if unknown:
        raise ValueError(f"--peers {' '.join(unknown)}: not a peer (one of {', '.join(_PEERS)})")
    if args.variant not in VARIANTS:  # the name alone: its module is imported once a GPU is there
        raise ValueError(f"variant={args.variant!r}: one of {', '.join(sorted(VARIANTS))} (the positional VARIANT)")
    if args.out is None:
        return None
    folder = Path(args.out)
    if not args.out.strip() or (folder.exists() and not folder.is_dir()):
        raise ValueError(f"--out {args.out!r}: give a folder")
    out = folder / f"tune_{args.variant}.csv"
    there = [p.name for p in (out, out.with_name(out.stem + ".meta.json")) if p.exists()]
    if there and not args.force:
        raise ValueError(f"--out {args.out!r}: holds an earlier run ({', '.join(there)}); give --force to overwrite it")
    return out


if __name__ == "__main__":
    sys.exit(main())
