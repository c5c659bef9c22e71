"""Exactness of every kernel at realistic sizes on a real GPU, recorded as data.

    python -m kernels.gpucheck --out kernels/data/h200_exactness.json [--quick] [--force]
    python -m kernels.gpucheck --impl fast --out kernels/data/h200_exactness_fast.json

Runs each kernel on random inputs and compares with the float64 reference of
``kernels.reference``: fp32 by ‖out − ref‖/‖ref‖ (must be < 1e-5), fp16 by the ratio of that
error to the error of plain fp16 attention (``judge_low_precision``, must be ≤ 2).  For long
sequences the forward reference is evaluated on a random sample of query rows (rows of the
forward are independent; the sample's error estimates the whole), so that N = 16,384 costs
seconds; backward checks use N ≤ 2,048 and the whole reference.  Also runs the N = 131,072
forward (B·H = 16, d = 64, fp16), where materialising S would take 512 GiB, and records the
peak device memory the kernel needed beyond its inputs and outputs.
The JSON holds one record per check, pass counts and the provenance (GPU, driver, versions,
date, commit); it is written to a temporary name and renamed, and an existing ``--out`` is
refused without ``--force``.  With no GPU (or under Numba's CUDA simulator) it prints one
``flashsim: error:`` line, exit status 2, and writes nothing.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
from numba import cuda

from flashsim.cmdline import ToolParser
from flashsim.output import atomic_write
from flashsim.provenance import git_state

from . import reference as ref

FP32_TOL = 1e-5
ROWS_SAMPLED = 64


def _inputs(rng, b, h, hkv, nq, nk, d, dtype, logit_scale=1.0):
    q = (rng.standard_normal((b, h, nq, d)) * logit_scale).astype(dtype)
    k = rng.standard_normal((b, hkv, nk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, nk, d)).astype(dtype)
    return q, k, v


def _judge(out, q, k, v, causal, rows=None):
    """Error of a forward output against float64, on all rows or a sample."""
    if rows is not None:
        # The reference of a subset of query rows: causal masks depend on the row index, so keep
        # rows in their place by computing on the sampled rows with the matching offset.
        nq, nk = q.shape[2], k.shape[2]
        outs, refs, bases = [], [], []
        for r in rows:
            qr = q[:, :, r:r + 1]
            # A single query row at position r sees keys j <= r + nk - nq: emulate with Nq = 1
            # by trimming the keys it cannot see (bottom-right alignment of a 1-row problem).
            limit = min(nk, r + nk - nq + 1) if causal else nk
            if limit <= 0:
                o_ref = np.zeros_like(qr, dtype=np.float64)
                base = np.zeros_like(o_ref)
            else:
                o_ref, _ = ref.attention_forward(qr, k[:, :, :limit], v[:, :, :limit])
                base = (ref.plain_attention_lowp(qr, k[:, :, :limit], v[:, :, :limit])
                        if q.dtype == np.float16 else o_ref)
            outs.append(out[:, :, r:r + 1])
            refs.append(o_ref)
            bases.append(base)
        o, o_ref, base = (np.concatenate(x, axis=2) for x in (outs, refs, bases))
    else:
        o = out
        o_ref, _ = ref.attention_forward(q, k, v, causal=causal)
        base = ref.plain_attention_lowp(q, k, v, causal=causal) if q.dtype == np.float16 else o_ref
    err = ref.rel_error(o, o_ref)
    diff = np.abs(o.astype(np.float64) - o_ref)
    rec = {"rel_err": err, "max_abs_err": float(diff.max()), "mean_abs_err": float(diff.mean()),
           "finite": bool(np.isfinite(o).all())}
    if q.dtype == np.float16:
        berr = ref.rel_error(base, o_ref)
        rec["plain_fp16_rel_err"] = berr
        rec["ratio"] = err / berr if berr > 0 else float("inf")
        rec["ok"] = rec["finite"] and rec["ratio"] <= 2.0
    else:
        rec["ok"] = rec["finite"] and err < FP32_TOL
    return rec


def _forward(kernel, q, k, v, causal, **kw):
    import kernels

    fn = {"flash2": kernels.flash_attention, "flash1": kernels.flash1_attention,
          "standard": kernels.standard_attention}[kernel]
    return fn(q, k, v, causal=causal, **kw)


def check_forward(rng, kernel, b, h, hkv, n, d, dtype, causal, sample=True, **kw):
    q, k, v = _inputs(rng, b, h, hkv, n, n, d, dtype)
    t0 = time.perf_counter()
    out = _forward(kernel, q, k, v, causal, **kw)
    wall = time.perf_counter() - t0
    rows = np.sort(rng.choice(n, size=min(n, ROWS_SAMPLED), replace=False)) if sample and n > 2048 else None
    rec = _judge(np.asarray(out), q, k, v, causal, rows)
    rec.update({"kernel": kernel, "pass": "fwd", "batch": b, "heads": h, "kv_heads": hkv, "n": n, "d": d,
                "dtype": np.dtype(dtype).name, "causal": causal, "rows_checked": "all" if rows is None else len(rows),
                "wall_s_incl_transfers": wall, **{k_: v_ for k_, v_ in kw.items()}})
    return rec


def check_backward(rng, kernel, b, h, hkv, n, d, dtype, causal, impl="reference"):
    import kernels

    q, k, v = _inputs(rng, b, h, hkv, n, n, d, dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    if kernel == "flash2":
        o, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True, impl=impl)
        grads = kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal, impl=impl)
    else:
        o = kernels.standard_attention(q, k, v, causal=causal)
        grads = kernels.standard_attention_backward(q, k, v, o, do, causal=causal)
    rec = {"kernel": kernel, "pass": "bwd", "batch": b, "heads": h, "kv_heads": hkv, "n": n, "d": d,
           "dtype": np.dtype(dtype).name, "causal": causal, "rows_checked": "all", "impl": impl}
    if dtype == np.float16:
        # The forward's rule for gradients: each within 2x of plain fp16 autograd's error.
        verdicts = ref.judge_low_precision_backward(grads, q, k, v, do, causal=causal)
        for name, j in verdicts.items():
            rec[f"rel_err_{name.lower()}"] = j.error
            rec[f"plain_fp16_rel_err_{name.lower()}"] = j.baseline_error
            rec[f"ratio_{name.lower()}"] = j.ratio
        rec["rel_err"] = max(j.error for j in verdicts.values())
        rec["ratio"] = max(j.ratio for j in verdicts.values())
        rec["ok"] = all(j.ok for j in verdicts.values())
        return rec
    want = ref.attention_backward(q, k, v, do, causal=causal)
    errs = {}
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        errs[name] = ref.rel_error(np.asarray(g), w)
    rec.update({f"rel_err_{k_}": v_ for k_, v_ in errs.items()})
    worst = max(errs.values())
    rec["rel_err"] = worst
    rec["ok"] = bool(np.isfinite(worst)) and worst < FP32_TOL * max(1.0, np.sqrt(n / 1024))
    return rec


def long_sequence(rng, n=131072, bh=16, d=64, impl="auto"):
    """The O(N) memory claim: N = 131,072 forward, B·H = 16, fp16."""
    import kernels

    q, k, v = _inputs(rng, 1, bh, bh, n, n, d, np.float16)
    dq, dk, dv = (cuda.to_device(x) for x in (q, k, v))
    inputs_bytes = 3 * q.nbytes
    free0, total = cuda.current_context().get_memory_info()
    t0 = time.perf_counter()
    o, lse = kernels.flash_attention(dq, dk, dv, return_lse=True, impl=impl)
    cuda.synchronize()
    wall = time.perf_counter() - t0
    free1, _ = cuda.current_context().get_memory_info()
    out = o.copy_to_host()
    rows = np.sort(rng.choice(n, size=16, replace=False))
    rec = _judge(out, q, k, v, False, rows)
    rec.update({"kernel": "flash2", "pass": "fwd", "batch": 1, "heads": bh, "kv_heads": bh, "n": n, "d": d,
                "dtype": "float16", "causal": False, "rows_checked": len(rows), "wall_s": wall, "impl": impl,
                "inputs_bytes": inputs_bytes, "outputs_bytes": int(out.nbytes + 4 * bh * n),
                "device_bytes_allocated_by_call": int(free0 - free1),
                "S_would_need_bytes": int(bh * n * n * 2)})
    return rec


def plan(quick: bool):
    f2 = []
    for d in (64, 128):
        for n in ((1024, 4096) if quick else (1024, 4096, 16384)):
            for dt in (np.float32, np.float16):
                f2.append(("flash2", 1, 16, 16, n, d, dt, False))
        f2.append(("flash2", 1, 16, 16, 4096, d, np.float16, True))
        f2.append(("flash2", 2, 8, 2, 2048, d, np.float16, True))  # GQA
        f2.append(("flash2", 1, 16, 16, 4096, d, np.float32, True))
    f1 = [("flash1", 1, 16, 16, 2048, 64, dt, False, kb) for dt in (np.float16, np.float32)
          for kb in (8, 16, 32, 64, 128, 192)]
    st = [("standard", 1, 16, 16, n, d, dt, False) for n in (1024, 4096) for d in (64, 128)
          for dt in (np.float32, np.float16)]
    bwd = [(kern, 1, 8, 8, n, d, dt, c) for kern in ("flash2", "standard") for n in (512, 2048) for d in (64, 128)
           for dt in (np.float32, np.float16) for c in (False, True) if not (c and n == 512)]
    bwd.append(("flash2", 2, 8, 2, 1024, 64, np.float16, True))
    return f2, f1, st, bwd


def require_gpu(why: str, simulator_ok: bool = False) -> None:
    """A ValueError (for a command line's one error line) where Numba sees no CUDA GPU, or, unless
    ``simulator_ok``, where its CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``): ``why`` says what
    needs the GPU.  The tools that run kernels call it before they write anything."""
    from numba import config

    if config.ENABLE_CUDASIM:
        if not simulator_ok:
            raise ValueError(f"Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): {why} needs a real GPU")
        return
    if not cuda.is_available():
        raise ValueError(f"no CUDA GPU visible: {why} needs one")


def provenance() -> dict:
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    smi = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).split(",")
    import numba
    import numba_cuda

    return {"gpu": smi[0].strip() if smi[0] else None, "driver": smi[1].strip() if len(smi) > 1 else None,
            "cuda": (run(["nvcc", "--version"]).splitlines() or [None])[-1], "numba": numba.__version__,
            "numba_cuda": numba_cuda.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **git_state()}


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the JSON record here (an existing file needs --force)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing --out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-long", action="store_true")
    ap.add_argument("--impl", default="reference", choices=["reference", "fast"],
                    help="which FlashAttention-2 kernels: the readable reference ones (with flash1 and "
                         "standard attention) or the fast variants of kernels/perf alone")
    args = ap.parse_args(argv)
    try:
        if args.out is not None:
            if not args.out.strip() or os.path.isdir(args.out):
                raise ValueError(f"out={args.out!r}: give a file name for the JSON record")
            if os.path.exists(args.out) and not args.force:
                raise ValueError(f"out={args.out!r} exists (give --force to overwrite it)")
        require_gpu("kernels.gpucheck")
    except ValueError as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(2026)
    records = []
    f2, f1, st, bwd = plan(args.quick)
    if args.impl == "fast":  # the FlashAttention-2 cases the fast variants take, through the public API
        from . import perf

        def fast(case):
            kern, dt, d, pass_ = case[0], case[6], case[5], "bwd" if case in bwd else "fwd"
            return kern == "flash2" and perf.best(pass_, dt, d) is not None

        f2, bwd = [c for c in f2 if fast(c)], [c for c in bwd if fast(c)]
        f1, st = [], []

    def log(rec):
        records.append(rec)
        tag = "ok  " if rec["ok"] else "FAIL"
        extra = f" ratio {rec['ratio']:.2f}" if "ratio" in rec else ""
        print(f"{tag} {rec['kernel']:8s} {rec['pass']} B={rec['batch']} H={rec['heads']}/{rec['kv_heads']} "
              f"N={rec['n']} d={rec['d']} {rec['dtype']} causal={rec['causal']} "
              f"{rec.get('sram_bytes', '')} rel err {rec['rel_err']:.2e}{extra}", flush=True)

    for kern, b, h, hkv, n, d, dt, c in f2 + st:
        try:
            kw = {"impl": args.impl} if kern == "flash2" else {}
            log(check_forward(rng, kern, b, h, hkv, n, d, dt, c, **kw))
        except Exception as e:  # record and go on: one failure must not hide the others
            records.append({"kernel": kern, "pass": "fwd", "n": n, "d": d, "error": repr(e), "ok": False})
            print("ERROR", kern, n, d, repr(e), flush=True)
    for kern, b, h, hkv, n, d, dt, c, kb in f1:
        try:
            log(check_forward(rng, kern, b, h, hkv, n, d, dt, c, sram_bytes=kb * 1024))
        except Exception as e:
            records.append({"kernel": kern, "pass": "fwd", "n": n, "d": d, "sram_bytes": kb * 1024,
                            "error": repr(e), "ok": False})
            print("ERROR", kern, n, d, kb, repr(e), flush=True)
    for kern, b, h, hkv, n, d, dt, c in bwd:
        try:
            log(check_backward(rng, kern, b, h, hkv, n, d, dt, c, impl=args.impl if kern == "flash2" else "reference"))
        except Exception as e:
            records.append({"kernel": kern, "pass": "bwd", "n": n, "d": d, "error": repr(e), "ok": False})
            print("ERROR bwd", kern, n, d, repr(e), flush=True)
    if not args.skip_long:
        try:
            rec = long_sequence(rng, impl="fast" if args.impl == "fast" else "reference")
            log(rec)
            alloc = rec["device_bytes_allocated_by_call"] / 2**20
            print(f"N=131072: {rec['wall_s']:.2f} s, call allocated {alloc:.0f} MiB on the device; "
                  f"S would need {rec['S_would_need_bytes'] / 2**30:.0f} GiB", flush=True)
        except Exception as e:
            records.append({"kernel": "flash2", "pass": "fwd", "n": 131072, "error": repr(e), "ok": False})
            print("ERROR long", repr(e), flush=True)
    passed = sum(bool(r.get("ok")) for r in records)
    summary = {"provenance": provenance(), "impl": args.impl, "passed": passed, "total": len(records),
               "fp32_tolerance": FP32_TOL, "fp16_rule": "rel err <= 2x plain fp16 attention's rel err",
               "records": records}
    print(f"{passed} passed, {len(records) - passed} failed")
    if args.out:
        if os.path.exists(args.out) and not args.force:  # made while this ran: kept, and this run's record not
            print(f"flashsim: error: out={args.out!r} appeared while the checks ran (give --force to overwrite it)",
                  file=sys.stderr)
            return 2
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        atomic_write(args.out, lambda f: json.dump(summary, f, indent=1, default=float))
    return 0 if passed == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
