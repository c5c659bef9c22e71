"""The GPU measurements behind the notebooks' figures (issue 22), one step at a time.

    python -m analysis.nb_measure STEP --out ROOT        STEP: fig2, dsweep, exact, gpt2, long

Every file lands under ``ROOT`` at the path it has in the repository, with ``<gpu>`` the GPU's
short name (``h100``, ``h200``), so that ``cp -r ROOT/. .`` puts it where the notebooks read it:

* ``fig2``: the paper's Figure 2 (middle), runtime against block size, on a configuration that
  fills the GPU: FlashAttention-1's forward (Algorithm 1, blocks from the SRAM size M by the
  paper's rule) and FlashAttention-2's readable forward (explicit Br x Bc) at the paper's own
  GPT-2-medium shape (B 64, H 16, N 1,024, d 64, fp16: 1,024 blocks of FlashAttention-1, over
  8 per SM).  A record of :func:`analysis.measure.measure` (LSU, L2, DRAM bytes and time per
  launch under ncu, ``--cache-control all --clock-control none``) in
  ``analysis/data/<gpu>/fig2/fig2_<gpu>.*``, and ``fig2_<gpu>.timing.csv``: the same calls timed
  with CUDA events outside the profiler, ``REPEATS`` times each after an L2 flush.
* ``dsweep``: the head-dimension sweep d = 32, 64, 96, 128, 192, 256 at fixed N under ncu:
  FlashAttention-1 (N 2,048, M 32 KB and 64 KB, the paper's rule) and FlashAttention-2's readable forward (N
  2,048, the kernel's default blocks), B 1, H 16, fp16: ``analysis/data/<gpu>/dsweep/dsweep_<gpu>.*``.
* ``exact``: FlashAttention-2's forward (the readable kernels) against float64 attention over
  several seeds and four input distributions (normal, uniform, large logits, outliers), fp32
  and fp16, N 1,024 to 16,384 with every row checked (the reference computed in float64 on the
  GPU with torch, by row chunks); fp32 up to N 32,768; and the device memory one forward call
  allocates at N 16,384 to 131,072 (the fast kernels; checked on every row from 65,536 on).
  ``kernels/data/<gpu>_exactness_spread.csv`` (one row per run) and ``.meta.json``.
* ``long``: that last part alone (memory per call at N 16,384 … 131,072, every row checked from
  65,536 on): ``kernels/data/<gpu>_exactness_long.csv`` and ``.meta.json``.
* ``gpt2``: attention alone, forward + backward, at the GPT-2-medium shape (B 64, H 16, N 1,024,
  d 64, fp16), causal and not: torch's naive attention, the SDPA backends (flash, cuDNN,
  memory-efficient) and ours (``kernels.torch_op.attention``: the fast kernels), ``RUNS`` runs of
  ``REPS`` timed calls each on fresh inputs; the forward alone too.
  ``kernels/data/gpt2_medium_attention_<gpu>.csv`` (one row per timed call) and ``.meta.json``.

Provenance (GPU, driver, versions, date, ``FLASHSIM_GIT_COMMIT`` and ``FLASHSIM_GIT_DIRTY``) is
in each ``.meta.json``.  Run on the GPU machine by ``scripts/device/nb_measure.sh``.  Before a step
runs it checks what it needs (a CUDA GPU; torch with CUDA for ``exact``, ``long`` and ``gpt2``; ncu
for ``fig2`` and ``dsweep``) and refuses a step whose files are already under ``ROOT`` unless
``--force``: either ends in one ``flashsim: error:`` line, exit status 2, with nothing written.
Every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from flashsim.cmdline import ToolParser

from .configs import config_id

#: The paper's GPT-2-medium attention shape.
GPT2_MEDIUM = {"batch": 64, "heads": 16, "seq_len": 1024, "head_dim": 64}
REPEATS = 5      # fig2: event-timed calls per configuration
RUNS, REPS = 5, 20  # gpt2: runs (fresh inputs) x timed calls per run
DISTRIBUTIONS = ("normal", "uniform", "large", "outlier")
SEEDS = (0, 1, 2, 3)
D_SWEEP = (32, 64, 96, 128, 192, 256)


def gpu_short() -> str:
    """``h100``, ``h200``, ... from nvidia-smi's name ("NVIDIA H100 80GB HBM3" -> "h100")."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.splitlines()[0]
        return name.split()[1].lower()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "gpu"


def provenance(**extra) -> dict:
    from .measure import git_state
    from .measure import provenance as _prov

    meta = {k: v for k, v in _prov([], "n/a", git_state()).items()
            if k not in ("ncu_command", "cache_control", "clock_control", "metrics")}
    meta.update(extra)
    return meta


def _write_rows(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` to ``path`` through a temporary name (never a half-written CSV)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def _write_meta(path: Path, meta: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, default=str))
    os.replace(tmp, path)


def _cfg(kernel, n, d, batch, heads, **tiling) -> dict:
    c = {"kernel": kernel, "pass": "fwd", "batch": batch, "heads": heads, "kv_heads": heads, "seq_len_q": n,
         "seq_len_k": n, "head_dim": d, "dtype": "fp16", "causal": False}
    c.update(tiling)
    return c


def fig2_configs() -> list[dict]:
    g = GPT2_MEDIUM
    out = [_cfg("flash1", g["seq_len"], g["head_dim"], g["batch"], g["heads"], sram_bytes=kb * 1024)
           for kb in (8, 16, 32, 64, 128, 192)]
    out += [_cfg("flash2", g["seq_len"], g["head_dim"], g["batch"], g["heads"], block_m=br, block_n=bc)
            for br, bc in ((8, 8), (16, 16), (32, 32), (64, 32))]
    return out


def dsweep_configs() -> list[dict]:
    from kernels.flash2 import default_blocks

    out = [_cfg("flash1", 2048, d, 1, 16, sram_bytes=kb * 1024) for kb in (32, 64) for d in D_SWEEP]
    for d in D_SWEEP:
        br, bc = default_blocks("fwd", np.float16, d)
        out.append(_cfg("flash2", 2048, d, 1, 16, block_m=br, block_n=bc))
    return out


def _event_times(configs: list[dict], repeats: int) -> list[dict]:
    """Each configuration's call (the worker's own) timed with CUDA events, after an L2 flush."""
    from numba import cuda

    from .worker import _warm_up, make_call

    rng = np.random.default_rng(0)
    flush = cuda.device_array(256 * 2**20 // 4, dtype=np.float32)
    rows = []
    for cfg in configs:
        _warm_up(cfg, rng)
        call = make_call(cfg, rng)
        call()
        cuda.synchronize()
        for rep in range(repeats):
            flush[:] = 0.0  # overwrite 256 MiB: nothing of the inputs stays in L2
            cuda.synchronize()
            t0, t1 = cuda.event(timing=True), cuda.event(timing=True)
            t0.record()
            call()
            t1.record()
            t1.synchronize()
            rows.append({"config_id": config_id(cfg), **cfg, "rep": rep, "ms": cuda.event_elapsed_time(t0, t1)})
        ms = [r["ms"] for r in rows[-repeats:]]
        print(f"timed {config_id(cfg)}: median {np.median(ms):.2f} ms (min {min(ms):.2f}, max {max(ms):.2f})",
              file=sys.stderr, flush=True)
    return rows


def run_fig2(root: Path, gpu: str, force: bool = False) -> None:
    from .measure import measure

    out = root / "analysis" / "data" / gpu / "fig2"
    configs = fig2_configs()
    rows = _event_times(configs, REPEATS)  # first: the profiled record is all or nothing
    _write_rows(out / f"fig2_{gpu}.timing.csv", rows)
    _write_meta(out / f"fig2_{gpu}.timing.meta.json",
                provenance(method="CUDA events around the worker's call, after a 256 MiB write (L2 flushed), "
                                  f"{REPEATS} calls per configuration after one untimed call"))
    measure(configs, out, f"fig2_{gpu}", force=force)


def run_dsweep(root: Path, gpu: str, force: bool = False) -> None:
    from .measure import measure

    measure(dsweep_configs(), root / "analysis" / "data" / gpu / "dsweep", f"dsweep_{gpu}", force=force)


# ---------------------------------------------------------------------------------------------
# exactness with spread


def draw(rng, shape, dist: str) -> np.ndarray:
    """float64 inputs of one distribution: ``normal`` N(0, 1); ``uniform`` U(-√3, √3) (unit
    variance); ``large`` N(0, 4²) (logits of standard deviation 16: near one-hot rows);
    ``outlier`` N(0, 1) with one entry in 200 multiplied by 20."""
    if dist == "normal":
        return rng.standard_normal(shape)
    if dist == "uniform":
        return rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), shape)
    if dist == "large":
        return 4.0 * rng.standard_normal(shape)
    if dist == "outlier":
        x = rng.standard_normal(shape)
        return np.where(rng.random(shape) < 1 / 200, 20.0 * x, x)
    raise ValueError(f"dist={dist!r}: must be one of {DISTRIBUTIONS}")


def _reference(torch, q, k, v, lowp: bool, chunk: int | None = None):
    """float64 softmax attention of torch (B, H, N, d) tensors by row chunks (S of ``chunk`` rows
    at a time, by default 4 GiB of float64); ``lowp``: plain fp16 attention instead
    (kernels.reference's ``plain_attention_lowp``: every intermediate rounded to fp16, products
    accumulated in fp32)."""
    chunk = chunk or max(1, 2**32 // (8 * k.shape[0] * k.shape[1] * k.shape[2]))
    scale = q.shape[-1] ** -0.5
    outs = []
    for r0 in range(0, q.shape[2], chunk):
        qc = q[:, :, r0:r0 + chunk]
        if lowp:
            s = (qc.float() @ k.float().transpose(-1, -2)).half()
            s = (s.float() * scale).half()
            p = (s.float() - s.float().amax(-1, keepdim=True)).exp().half()
            p = (p.float() / p.float().sum(-1, keepdim=True).half().float()).half()
            outs.append((p.float() @ v.float()).half().double())
        else:
            s = (qc.double() @ k.double().transpose(-1, -2)) * scale
            outs.append(torch.softmax(s, -1) @ v.double())
    return torch.cat(outs, 2)


def _rel(torch, a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


def run_exact(root: Path, gpu: str) -> None:
    import torch
    from numba import cuda

    import kernels

    torch.backends.cuda.matmul.allow_tf32 = False
    path = root / "kernels" / "data" / f"{gpu}_exactness_spread.csv"
    meta_path = path.with_name(path.stem + ".meta.json")
    meta = provenance(method=__doc__.split("* ``exact``:")[1].split("* ``gpt2``")[0].strip(), torch=torch.__version__,
                      distributions={d: draw.__doc__ for d in DISTRIBUTIONS}, seeds=list(SEEDS),
                      reference="float64 on the GPU (torch), every row")
    rows = []

    def one(dist, seed, n, dt, b=1, h=16, d=64):
        rng = np.random.default_rng(seed)
        q, k, v = (draw(rng, (b, h, n, d), dist).astype(dt) for _ in range(3))
        t0 = time.perf_counter()
        o = kernels.flash_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), impl="reference")
        cuda.synchronize()
        wall = time.perf_counter() - t0
        tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
        got = torch.as_tensor(o, device="cuda")
        want = _reference(torch, tq, tk, tv, lowp=False)
        rec = {"kernel": "flash2", "impl": "reference", "dist": dist, "seed": seed, "batch": b, "heads": h, "n": n,
               "d": d, "dtype": np.dtype(dt).name, "rows_checked": "all", "rel_err": _rel(torch, got, want),
               "max_abs_err": float((got.double() - want).abs().max()), "finite": bool(torch.isfinite(got).all()),
               "wall_s": wall}
        if dt == np.float16:
            rec["plain_fp16_rel_err"] = _rel(torch, _reference(torch, tq, tk, tv, lowp=True), want)
            rec["ratio"] = rec["rel_err"] / rec["plain_fp16_rel_err"]
        rows.append(rec)
        print(f"exact {dist:8s} seed {seed} N={n:6d} {rec['dtype']:8s} rel err {rec['rel_err']:.3e}"
              + (f" ratio {rec['ratio']:.2f}" if "ratio" in rec else ""), file=sys.stderr, flush=True)
        _write_rows(path, rows)
        _write_meta(meta_path, meta)

    for n in (1024, 4096, 16384):
        for dt in (np.float32, np.float16):
            for dist in DISTRIBUTIONS:
                for seed in SEEDS:
                    one(dist, seed, n, dt)
    for seed in SEEDS[:3]:
        one("normal", seed, 32768, np.float32)
    for rec in memory_rows(torch):
        rows.append(rec)
        _write_rows(path, rows)
    _write_meta(meta_path, meta)


def memory_rows(torch, ns=(16384, 32768, 65536, 131072)):
    """O(N) memory: what one forward call (the fast kernels, fp16, B 1, H 16, d 64) allocates on
    the device beyond its inputs, at each N of ``ns``, one record each as it is measured; from
    N = 65,536 on, its output is also checked against float64 on every row."""
    from numba import cuda

    import kernels

    for n in ns:
        rng = np.random.default_rng(0)
        q, k, v = (cuda.to_device(draw(rng, (1, 16, n, 64), "normal").astype(np.float16)) for _ in range(3))
        cuda.synchronize()
        free0, _ = cuda.current_context().get_memory_info()
        o, lse = kernels.flash_attention(q, k, v, return_lse=True)  # impl="auto": the fast kernels
        cuda.synchronize()
        free1, _ = cuda.current_context().get_memory_info()
        rec = {"kernel": "flash2", "impl": "auto", "dist": "memory", "seed": 0, "batch": 1, "heads": 16, "n": n,
               "d": 64, "dtype": "float16", "inputs_bytes": 3 * q.nbytes, "outputs_bytes": o.nbytes + lse.nbytes,
               "device_bytes_allocated_by_call": free0 - free1, "S_would_need_bytes": 16 * n * n * 2}
        if n >= 65536:
            tq, tk, tv = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
            want = _reference(torch, tq, tk, tv, lowp=False)
            rec["rel_err"] = _rel(torch, torch.as_tensor(o, device="cuda"), want)
            rec["plain_fp16_rel_err"] = _rel(torch, _reference(torch, tq, tk, tv, lowp=True), want)
            rec["ratio"] = rec["rel_err"] / rec["plain_fp16_rel_err"]
            rec["rows_checked"] = "all"
            del tq, tk, tv, want
            torch.cuda.empty_cache()
        print(f"memory N={n}: call allocated {(free0 - free1) / 2**20:.0f} MiB; O + L "
              f"{(o.nbytes + lse.nbytes) / 2**20:.0f} MiB; S would need {16 * n * n * 2 / 2**30:.0f} GiB"
              + (f"; every row: rel err {rec['rel_err']:.3e}, ratio {rec['ratio']:.2f}" if "ratio" in rec else ""),
              file=sys.stderr, flush=True)
        del q, k, v, o, lse
        yield rec


def run_long(root: Path, gpu: str) -> None:
    """:func:`memory_rows` alone, into ``kernels/data/<gpu>_exactness_long.csv`` (``exact`` runs it
    last, where its time limit may cut it short)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    path = root / "kernels" / "data" / f"{gpu}_exactness_long.csv"
    meta = provenance(method=memory_rows.__doc__, torch=torch.__version__,
                      reference="float64 on the GPU (torch), every row, by row chunks of 4 GiB")
    rows = []
    for rec in memory_rows(torch):
        rows.append(rec)
        _write_rows(path, rows)
        _write_meta(path.with_name(path.stem + ".meta.json"), meta)


# ---------------------------------------------------------------------------------------------
# GPT-2 medium, attention alone


def _timed(torch, fn, inputs, causal, mode, flush) -> list[float]:
    """``REPS`` calls of ``fn`` (``fwd_bwd``: forward then backward of dO; ``fwd``: the forward
    under no_grad), each timed with CUDA events after a 256 MiB write, after 3 untimed calls."""
    q, k, v, do = inputs

    def call():
        if mode == "fwd":
            with torch.no_grad():
                return fn(q, k, v, causal)
        q.grad = k.grad = v.grad = None
        fn(q, k, v, causal).backward(do)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    out = []
    for _ in range(REPS):
        flush.zero_()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        call()
        t1.record()
        t1.synchronize()
        out.append(t0.elapsed_time(t1))
    return out


def run_gpt2(root: Path, gpu: str) -> None:
    import torch

    from kernels.bench import _torch_fns, bwd_error
    from kernels.torch_op import attention as ours

    g = GPT2_MEDIUM
    b, h, n, d = g["batch"], g["heads"], g["seq_len"], g["head_dim"]
    path = root / "kernels" / "data" / f"gpt2_medium_attention_{gpu}.csv"
    meta = provenance(torch=torch.__version__, shape=g, dtype="fp16", runs=RUNS, reps_per_run=REPS, warmup_per_run=3,
                      method="per run: fresh q, k, v, dO (torch.randn, seed = run); 3 untimed calls, then REPS "
                             "calls each timed with CUDA events after a 256 MiB write (L2 flushed); "
                             "fwd_bwd = o = attention(q, k, v); o.backward(dO); fwd = the forward alone "
                             "under torch.no_grad(); rel_err: worst of dQ, dK, dV of the first head against "
                             "autograd through float64 attention (kernels.bench.bwd_error)",
                      tf32="not applicable: every tensor is fp16",
                      cudnn=torch.backends.cudnn.version())
    peers = _torch_fns(torch)
    fns = {**peers, "ours": lambda q, k, v, causal: ours(q, k, v, causal=causal)}
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    rows = []
    for causal in (True, False):
        for name, fn in fns.items():
            for run in range(RUNS):
                gen = torch.Generator(device="cuda").manual_seed(run)
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=gen).requires_grad_()
                           for _ in range(3))
                do = torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=gen)
                base = {"variant": name, "causal": causal, "batch": b, "heads": h, "n": n, "d": d, "run": run}
                try:
                    err = float("nan")
                    for mode in ("fwd_bwd", "fwd"):
                        ms = _timed(torch, fn, (q, k, v, do), causal, mode, flush)
                        if mode == "fwd_bwd" and run == 0:  # the grads of the last timed call
                            err = bwd_error(torch, (q.grad, k.grad, v.grad), q, k, v, do, causal)
                        rows += [{**base, "mode": mode, "rep": rep, "ms": t, "status": "ok",
                                  "rel_err": err if mode == "fwd_bwd" and run == 0 else ""} for rep, t in enumerate(ms)]
                        print(f"gpt2 {name:12s} causal={causal!s:5s} run {run} {mode:7s} median {np.median(ms):8.3f} ms"
                              f" (IQR {np.percentile(ms, 25):.3f}-{np.percentile(ms, 75):.3f})"
                              + (f" err {err:.1e}" if mode == "fwd_bwd" and run == 0 else ""), file=sys.stderr,
                              flush=True)
                except torch.cuda.OutOfMemoryError:
                    rows.append({**base, "mode": "fwd_bwd", "status": "out of memory"})
                except Exception as e:  # one variant's failure must not stop the others
                    rows.append({**base, "mode": "fwd_bwd", "status": repr(e)[:200]})
                    print(f"gpt2 {name} causal={causal} run {run}: {e!r}", file=sys.stderr, flush=True)
                del q, k, v, do
                torch.cuda.empty_cache()
                _write_rows(path, rows)
                _write_meta(path.with_name(path.stem + ".meta.json"), meta)


STEPS = {"fig2": run_fig2, "dsweep": run_dsweep, "exact": run_exact, "gpt2": run_gpt2, "long": run_long}


def outputs(step: str, root: Path, gpu: str) -> list[Path]:
    """The files ``step`` writes under ``root`` on GPU ``gpu`` (``h100``, ...)."""
    from .measure import record_files

    data, kdata = root / "analysis" / "data" / gpu, root / "kernels" / "data"
    if step == "fig2":
        return [data / "fig2" / n for n in (f"fig2_{gpu}.timing.csv", f"fig2_{gpu}.timing.meta.json",
                                            *record_files(f"fig2_{gpu}"))]
    if step == "dsweep":
        return [data / "dsweep" / n for n in record_files(f"dsweep_{gpu}")]
    stem = {"exact": f"{gpu}_exactness_spread", "long": f"{gpu}_exactness_long",
            "gpt2": f"gpt2_medium_attention_{gpu}"}[step]
    return [kdata / f"{stem}.csv", kdata / f"{stem}.meta.json"]


def check(step: str, root: Path, force: bool) -> str:
    """The GPU's short name once ``step`` can run here: ValueError (one line) where a CUDA GPU, torch
    with CUDA (``exact``, ``long``, ``gpt2``) or ncu (``fig2``, ``dsweep``) is missing, or where the
    step's files are under ``root`` already and ``force`` is false."""
    from kernels.gpucheck import require_gpu

    from .measure import MissingTool, check_environment

    if root.exists() and not root.is_dir():
        raise ValueError(f"--out {str(root)!r}: is a file, not a folder")
    require_gpu(f"analysis.nb_measure {step}")
    if step in ("exact", "long", "gpt2"):
        from kernels.bench import cuda_torch

        cuda_torch(f"analysis.nb_measure {step} needs it")
    else:
        try:
            check_environment()
        except MissingTool as e:
            raise ValueError(str(e)) from None
    gpu = gpu_short()
    there = [str(p) for p in outputs(step, root, gpu) if p.exists()]
    if there and not force:
        raise ValueError(f"--out {str(root)!r}: step {step} would overwrite {', '.join(there)}; "
                         "give --force to overwrite them")
    return gpu


def main(argv: list[str] | None = None) -> int:
    from .measure import MeasureError

    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=list(STEPS))
    ap.add_argument("--out", required=True, help="the root under which files land at their repository paths")
    ap.add_argument("--force", action="store_true", help="overwrite the step's files of an earlier run under --out")
    a = ap.parse_args(argv)
    root = Path(a.out)
    try:
        gpu = check(a.step, root, a.force)
        kw = {"force": a.force} if a.step in ("fig2", "dsweep") else {}  # measure's own refusal, passed on
        STEPS[a.step](root, gpu, **kw)
    except (ValueError, MeasureError) as e:
        print(f"flashsim: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
