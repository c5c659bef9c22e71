"""Benchmark: our kernels beside torch's naive attention and each SDPA backend, in one run.

    python -m kernels.bench [--quick] [--out kernels/data/bench_h100.csv]

For every configuration it first checks each variant against the float64 reference (the
forward on a sample of query rows, the backward's dQ, dK, dV on the first head against autograd
through float64 attention; variants that fail are reported and not timed), then times it with
CUDA events: 3 warm-up calls, then the median of ``--repeat`` calls, each on one of three
rotating input sets and after a 256 MiB write that flushes the L2.  A backward peer keeps one
autograd graph (with its N x N P) per input set; where three do not fit in the GPU's memory it
rotates fewer (the ``inputs`` column).  It prints one aligned line per (variant, configuration)
with ms, TFLOP/s and the ratios to torch's naive attention and to SDPA's flash backend measured
in the same run, and rewrites the CSV, with the provenance (GPU, driver, versions, date, commit)
in a ``.meta.json`` beside it, after every configuration, so that a run stopped early keeps
what it measured.

FLOPs: forward 4·B·H·Nq·Nk·d (the two matrix products), halved for causal; backward 2.5× the
forward (five products instead of two), the convention of flash-attention's benchmarks.  Our
kernels get torch tensors through ``__cuda_array_interface__``, so no copy is timed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from functools import partial
from pathlib import Path

import numpy as np

from . import reference as ref

#: Timed by default: torch's peers and our fastest variant of each pass and dtype.  The
#: readable reference kernels (ours_flash2, ours_standard) and the earlier numbered variants
#: still in the tree (ours_fwd_fp16_v3) run when named with --variants.
VARIANTS_FWD = ("naive", "sdpa_flash", "sdpa_mem_eff", "sdpa_cudnn", "ours_fwd_fp16_v4", "ours_fwd_fp32_v1")
VARIANTS_BWD = ("naive", "sdpa_flash", "sdpa_mem_eff", "sdpa_cudnn", "ours_bwd_fp16_v1", "ours_bwd_fp16_v3",
                "ours_bwd_fp32_v1", "ours_bwd_fp32_v2")
OTHERS = ("ours_flash2", "ours_standard", "ours_fwd_fp16_v3")


def flops(b, h, n, d, causal, pass_):
    f = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
    return f if pass_ == "fwd" else 2.5 * f


def _torch_fns(torch):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def naive(q, k, v, causal):
        s = (q * (q.shape[-1] ** -0.5)) @ k.transpose(-1, -2)
        if causal:
            n, m = s.shape[-2], s.shape[-1]
            mask = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
            s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    def sdpa(backend):
        def fn(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn

    return {"naive": naive, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
            "sdpa_mem_eff": sdpa(SDPBackend.EFFICIENT_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}


def _ours(name, torch):
    """(fwd, bwd, save) of one of our variants; bwd and save are None for forward-only ones."""
    import kernels

    if name == "ours_flash2":
        def fwd(q, k, v, causal):
            return torch.as_tensor(kernels.flash_attention(q, k, v, causal=causal), device="cuda")

        def bwd(q, k, v, do, causal, saved):
            o, lse = saved
            return kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal)

        def save(q, k, v, causal):
            return kernels.flash_attention(q, k, v, causal=causal, return_lse=True)
        return fwd, bwd, save
    if name == "ours_standard":
        def fwd(q, k, v, causal):
            return torch.as_tensor(kernels.standard_attention(q, k, v, causal=causal), device="cuda")

        def bwd(q, k, v, do, causal, saved):
            o, _, p = saved
            return kernels.standard_attention_backward(q, k, v, o, do, causal=causal, p=p)

        def save(q, k, v, causal):
            return kernels.standard_attention(q, k, v, causal=causal, return_intermediates=True)
        return fwd, bwd, save
    # The numbered fast variants (kernels/perf): "ours_<variant>", e.g. ours_fwd_fp16_v4.
    from . import perf

    mod = perf.variant(name[len('ours_'):])
    if hasattr(mod, "forward"):
        def fwd(q, k, v, causal):
            return torch.as_tensor(mod.forward(q, k, v, causal=causal), device="cuda")
        return fwd, None, None

    def bwd(q, k, v, do, causal, saved):
        o, lse = saved
        return mod.backward(q, k, v, o, lse, do, causal=causal)

    def save(q, k, v, causal):
        return mod.saved_forward(q, k, v, causal=causal)
    return None, bwd, save


def _applies(var: str, dtype: str, pass_: str) -> bool:
    """Whether a variant runs this dtype and pass (fast variants say so in their names)."""
    if var.startswith("sdpa") and dtype == "fp32" and var != "sdpa_mem_eff":
        return False  # the flash and cuDNN backends take fp16/bf16 only
    if var.startswith("ours_") and var not in ("ours_flash2", "ours_standard"):
        parts = var.split("_")
        return parts[1] == pass_ and parts[2] == dtype
    return True


def _time(torch, fn, inputs, repeat, flush):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(3):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(repeat):
        flush.zero_()
        start.record()
        fn(*inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times)), float(np.std(times))


def _check_fwd(torch, out, q, k, v, causal, rng):
    """Relative error of O on 32 sampled query rows (all rows if N is small), against softmax
    attention in float64 on the GPU (the rows' scores against every key: B·H·32·N numbers)."""
    n, nk = q.shape[2], k.shape[2]
    rows = torch.as_tensor(np.sort(rng.choice(n, size=min(n, 32), replace=False)), device=q.device)
    s = (q[:, :, rows].double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:  # bottom-right aligned: row r sees keys <= r + Nk - Nq
        s = s.masked_fill(torch.arange(nk, device=q.device)[None, :] > rows[:, None] + (nk - n), float("-inf"))
    want = torch.softmax(s, -1) @ v.double()
    got = torch.as_tensor(out, device=q.device)[:, :, rows].double()
    return ref.rel_error(got.cpu().numpy(), want.cpu().numpy())


def bwd_error(torch, grads, q, k, v, do, causal) -> float:
    """Worst relative error of (dQ, dK, dV) against autograd through float64 attention, on the
    first head of the first batch (heads are independent; one keeps the float64 S small)."""
    grads = [torch.as_tensor(g, device=q.device)[:1, :1] for g in grads]
    q, k, v, do = (x.detach()[:1, :1] for x in (q, k, v, do))
    leaf = [x.double().requires_grad_(True) for x in (q, k, v)]
    s = (leaf[0] @ leaf[1].transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n, m = s.shape[-2], s.shape[-1]
        s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n), float("-inf"))
    (torch.softmax(s, -1) @ leaf[2]).backward(do.double())
    return max(float((g.double() - x.grad).norm() / x.grad.norm()) for g, x in zip(grads, leaf))


def _graph(torch, fwd, inp, causal):
    q, k, v, do = inp
    leaf = [x.clone().requires_grad_(True) for x in (q, k, v)]
    return fwd(*leaf, causal), do, leaf


def time_peer_backward(torch, fwd, inputs, causal, repeat, flush, check):
    """(ms, std, rel err, input sets rotated) of autograd's backward through a torch peer.

    One graph (the forward's saved tensors, N x N P among them for the naive code) per input set,
    as many as leave room for the backward's own N x N temporaries: on the first check only the
    first, then more until one does not fit, dropping one again if the timed calls run out of
    memory.  ``check(grads)`` gives the error of the first graph's gradients."""
    graphs = [_graph(torch, fwd, inputs[0], causal)]
    o, do, leaf = graphs[0]
    o.backward(do, retain_graph=True)
    err = check([x.grad for x in leaf])
    del o, do, leaf
    for inp in inputs[1:]:
        try:
            graphs.append(_graph(torch, fwd, inp, causal))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            break
    while True:
        try:
            fn = lambda o, do: o.backward(do, retain_graph=True)  # noqa: E731
            ms, sd = _time(torch, fn, [(o, do) for o, do, _ in graphs], repeat, flush)
            return ms, sd, err, len(graphs)
        except torch.cuda.OutOfMemoryError:
            if len(graphs) == 1:
                raise
            graphs.pop()
            torch.cuda.empty_cache()


def _checked_bwd_error(torch, inp, causal, tol, grads) -> float:
    err = bwd_error(torch, grads, *inp[:4], causal)
    if not err < tol:
        raise AssertionError(f"failed the check against float64: rel err {err:.2e}")
    return err


def _tolerance(dtype: str) -> float:
    return 1e-4 if dtype == "fp32" else 1e-2


def configs(quick: bool, ns=None):
    out = []
    ns = ns or ((1024, 4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384, 32768))
    for pass_ in ("fwd", "bwd"):
        for dtype in ("fp16", "fp32"):
            for d in (64, 128):
                for causal in (False, True):
                    for n in ns:
                        if pass_ == "bwd" and n > 16384:
                            continue
                        b = max(1, 16384 // n) if n < 16384 else 1
                        out.append({"pass": pass_, "dtype": dtype, "batch": b, "heads": 16, "n": n, "d": d,
                                    "causal": causal})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="substring filter, e.g. 'fwd-fp16-d64'")
    ap.add_argument("--variants", nargs="*", default=None, help="run only these variants (peers included)")
    ap.add_argument("--ns", nargs="*", type=int, default=None, help="sequence lengths (default: the full set)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("flashsim bench: torch is not installed: the peers (naive, SDPA) need it", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("flashsim bench: no CUDA GPU visible", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(0)
    peers = _torch_fns(torch)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    rows = []
    meta = {}
    if args.out:
        from .gpucheck import provenance

        meta = dict(provenance(), torch=torch.__version__, method=__doc__, tf32="off")
    for cfg in configs(args.quick, args.ns):
        tag = f"{cfg['pass']}-{cfg['dtype']}-d{cfg['d']}-{'causal' if cfg['causal'] else 'full'}-n{cfg['n']}"
        if args.only and args.only not in tag:
            continue
        tdt = torch.float16 if cfg["dtype"] == "fp16" else torch.float32
        b, h, n, d, causal = cfg["batch"], cfg["heads"], cfg["n"], cfg["d"], cfg["causal"]
        inputs = [tuple(torch.randn(b, h, n, d, device="cuda", dtype=tdt) for _ in range(4)) for _ in range(3)]
        results = {}
        variants = VARIANTS_FWD if cfg["pass"] == "fwd" else VARIANTS_BWD
        if args.variants:
            variants = [v_ for v_ in dict.fromkeys(variants + OTHERS + tuple(args.variants))
                        if v_ in args.variants and (v_ in variants or v_.startswith("ours"))]
        for var in variants:
            if args.variants and var not in args.variants:
                continue
            if not _applies(var, cfg["dtype"], cfg["pass"]):
                continue
            rec = dict(cfg, variant=var, config=tag)
            try:
                if var.startswith("ours"):
                    fwd, bwd, save = _ours(var, torch)
                else:
                    fwd = peers[var]
                if cfg["pass"] == "fwd":
                    q, k, v, _ = inputs[0]
                    rec["rel_err"] = _check_fwd(torch, fwd(q, k, v, causal), q, k, v, causal, rng)
                    if not rec["rel_err"] < _tolerance(cfg["dtype"]):
                        raise AssertionError(f"failed the check against float64: rel err {rec['rel_err']:.2e}")
                    fn = lambda q, k, v, do, f=fwd, c=causal: f(q, k, v, c)  # noqa: E731
                    ms, sd = _time(torch, fn, inputs, args.repeat, flush)
                    rec["inputs"] = len(inputs)
                else:
                    if var.startswith("ours"):
                        saved = [save(q, k, v, causal) for q, k, v, _ in inputs]
                        fn_inputs = [(q, k, v, do, s) for (q, k, v, do), s in zip(inputs, saved)]
                        fn = lambda q, k, v, do, s, f=bwd, c=causal: f(q, k, v, do, c, s)  # noqa: E731
                        rec["rel_err"] = _checked_bwd_error(torch, inputs[0], causal, _tolerance(cfg["dtype"]),
                                                            fn(*fn_inputs[0]))
                        ms, sd = _time(torch, fn, fn_inputs, args.repeat, flush)
                        rec["inputs"] = len(fn_inputs)
                    else:
                        check = partial(_checked_bwd_error, torch, inputs[0], causal, _tolerance(cfg["dtype"]))
                        ms, sd, rec["rel_err"], rec["inputs"] = time_peer_backward(
                            torch, fwd, inputs, causal, args.repeat, flush, check)
                rec.update(ms=ms, ms_std=sd, tflops=flops(b, h, n, d, causal, cfg["pass"]) / ms / 1e9)
            except torch.cuda.OutOfMemoryError:
                rec["error"] = "out of memory"
            except Exception as e:  # one variant's failure must not stop the table
                rec["error"] = repr(e)[:200]
            fn_inputs = saved = fn = None  # free this variant's tensors before the next
            torch.cuda.empty_cache()
            results[var] = rec
        for rec in results.values():
            if "ms" in rec:
                for peer in ("naive", "sdpa_flash", "sdpa_cudnn"):
                    if "ms" in results.get(peer, {}):
                        rec[f"x_{peer}"] = results[peer]["ms"] / rec["ms"]
            if "ms" in rec:
                xn, xf = rec.get("x_naive", float("nan")), rec.get("x_sdpa_flash", float("nan"))
                body = (f"{rec['ms']:9.3f} ms {rec['tflops']:7.1f} TFLOP/s  x naive {xn:5.2f}  x flash {xf:5.2f}"
                        f"  err {rec['rel_err']:.1e}")
            else:
                body = rec.get("error", "")
            line = f"{rec['variant']:14s} {tag:32s} B={b:<2d} {body}"
            print(line, flush=True)
            rows.append(rec)
        del inputs
        torch.cuda.empty_cache()
        if args.out:
            write(args.out, rows, meta)
    if args.out:
        print(f"wrote {args.out}")
    return 0


def write(out, rows: list[dict], meta: dict) -> None:
    """The CSV (every row so far) and its ``.meta.json``."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    path.with_name(path.stem + ".meta.json").write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
