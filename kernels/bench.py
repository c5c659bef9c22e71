"""Benchmark: our kernels beside torch's naive attention and each SDPA backend, in one run.

    python -m kernels.bench [--shapes grid|offgrid|all] [--dtypes fp16,bf16,fp32] [--rounds 5]
                            [--out kernels/data/bench_h100.csv]

Configurations (``--shapes``): ``grid`` is B·H = 16·(16,384/N) (B·H = 16 from N = 16,384), H = 16,
N = Nq = Nk in ``--ns``, d in ``--ds`` (64 and 128), causal or not (``--causal``), the backward
to N = 16,384; ``offgrid`` is a fixed list of shapes the
grid does not hold (head dims 40-256, grouped-query 8:1 and multi-query, causal at N = 512 and
1,024, Nq != Nk, B·H = 1-4 and 256: :data:`OFFGRID`) plus ``--sample K`` shapes drawn with
``--seed S`` (head dim 32-256 in steps of 8, N 512-8,192, causal or not, query heads per kv head
1, 2, 4 or 8: :func:`sample_shapes`); ``all`` is both.  Each shape runs forward and backward in
every dtype of ``--dtypes``.

For every configuration it first checks each variant against the float64 reference (the
forward on a sample of query rows, the backward's dQ, dK, dV on the first kv head's group of
query heads against autograd through float64 attention; variants that fail are reported and not
timed).  A variant that does not take the configuration is reported as ``n/a`` with the reason
and never timed as something else: SDPA's flash and cuDNN backends for fp32, SDPA's backends
for causal attention with Nq != Nk (their ``is_causal`` is aligned top-left, ours and naive's
bottom-right), a backend that torch refuses for the shape (each runs alone under
``sdpa_kernel``; torch's reasons are kept), one of ours whose ``supports(dtype, d)`` is false
or whose launcher raises ValueError for the inputs (bf16 among them until a kernel takes it).

Then it times every variant that passed with CUDA events in ``--rounds`` rounds: within a round
each variant in turn (the order rotated by one every round, so that drift hits all alike) makes
one untimed call and ``--repeat`` timed ones, each on one of three rotating input sets and after
a 256 MiB write that flushes the L2 (3 untimed calls before the first round).  A backward peer
keeps one autograd graph (with its N x N P for naive) per input set; where three do not fit in
the GPU's memory it rotates fewer (one fewer than fit, leaving room for the other variants'
calls, which run between its own; the ``inputs`` column).  Per variant: ``ms`` the median of the
rounds' medians, ``ms_q1``/``ms_q3`` their quartiles, ``ms_min``/``ms_max`` their range,
``ms_std`` the standard deviation of every timed call; per peer P (naive, SDPA flash, cuDNN and
mem-efficient), ``x_P`` the median over the rounds of that round's ratio P's median / this
variant's median, and ``x_P_q1``/``x_P_q3`` those ratios' quartiles.  It prints one aligned line
per (variant, configuration) with ms, TFLOP/s and the ratios to naive and to SDPA flash as
median ± half the interquartile range, and rewrites the CSV, with the provenance (GPU, driver,
versions, date, commit) in a ``.meta.json`` beside it, after every configuration (to a temporary
name, then renamed), so that a run stopped early keeps what it measured; ``--budget`` seconds
stops it before a configuration that would start later, listing what was not run.

FLOPs: forward 4·B·H·d·(Nq·Nk visible pairs) (the two matrix products), the causal triangle
counted as half a square (Nq·Nk - Nq²/2 for Nk >= Nq, Nk²/2 for Nk < Nq); backward 2.5x the
forward (five products instead of two), the convention of flash-attention's benchmarks.  Our
kernels get torch tensors through ``__cuda_array_interface__``, so no copy is timed.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np

from flashsim.cmdline import ToolParser

from . import reference as ref

#: torch's attention, timed beside ours; every x_* ratio is to one of these.  Ours are by default
#: the shipped variants of the pass (kernels.perf.BEST, :func:`shipped`); the readable reference
#: kernels (ours_flash2, ours_standard) and the other numbered variants in the tree
#: (ours_fwd_fp16_v3) run when named with --variants.
PEERS = ("naive", "sdpa_flash", "sdpa_mem_eff", "sdpa_cudnn")
DTYPES = ("fp16", "bf16", "fp32")
#: the numpy/``BEST`` name of each dtype
DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
#: grid batch size: B·H = 16·(16,384/N) below N = 16,384, else 16
GRID_TOKENS = 16384


class NotApplicable(Exception):
    """A variant that does not take this configuration (reported "n/a" with the reason)."""


# --------------------------------------------------------------------------- configurations

def flops(b, h, n, d, causal, pass_, nk=None):
    """FLOPs of one call: 4·B·H·d per visible (query, key) pair, the causal triangle taken as
    half a square; the backward 2.5x the forward."""
    nk = n if nk is None else nk
    pairs = (n * nk - n * n / 2 if nk >= n else nk * nk / 2) if causal else n * nk
    f = 4.0 * b * h * pairs * d
    return f if pass_ == "fwd" else 2.5 * f


def tag(cfg: dict) -> str:
    """The configuration's name: the grid's ``fwd-fp16-d64-full-n4096`` (as in the committed
    records), then ``-nk<Nk>`` where Nk != Nq and ``-b<B>h<H>[kv<Hkv>]`` off the grid."""
    t = f"{cfg['pass']}-{cfg['dtype']}-d{cfg['d']}-{'causal' if cfg['causal'] else 'full'}-n{cfg['n']}"
    if cfg.get("nk", cfg["n"]) != cfg["n"]:
        t += f"-nk{cfg['nk']}"
    if cfg.get("set", "grid") != "grid":
        t += f"-b{cfg['batch']}h{cfg['heads']}"
        if cfg.get("kv_heads", cfg["heads"]) != cfg["heads"]:
            t += f"kv{cfg['kv_heads']}"
    return t


def _shape(b, h, n, d, causal=False, hkv=None, nk=None, note=""):
    return {"batch": b, "heads": h, "kv_heads": h if hkv is None else hkv, "n": n, "nk": n if nk is None else nk,
            "d": d, "causal": causal, "note": note}


#: The fixed off-grid shapes: what the grid (H = 16, Hkv = H, Nq = Nk, d 64 and 128) does not hold.
OFFGRID = (
    *(_shape(4, 16, 4096, d, note="head dim") for d in (40, 80, 96, 112, 160, 192, 256)),
    _shape(2, 32, 4096, 128, hkv=4, note="GQA 8:1"),
    _shape(4, 16, 4096, 128, hkv=1, note="MQA"),
    _shape(32, 16, 512, 64, causal=True, note="causal, short"),
    _shape(16, 16, 1024, 128, causal=True, note="causal, short"),
    _shape(4, 16, 512, 128, nk=4096, note="Nq < Nk"),
    _shape(4, 16, 4096, 128, nk=512, note="Nq > Nk"),
    _shape(1, 1, 8192, 128, note="B·H = 1"),
    _shape(1, 4, 4096, 64, note="B·H = 4"),
    _shape(16, 16, 2048, 128, note="B·H = 256"),
)


def sample_shapes(k: int, seed: int) -> list[dict]:
    """``k`` shapes drawn with numpy's generator seeded ``seed`` (the same list for the same seed):
    head dim 8·U{4..32} (32-256 in steps of 8), N = Nq = Nk 64·round(2^U(9, 13) / 64) (512-8,192,
    log-uniform), causal with probability 1/2, H = 16 query heads over 16/g kv heads with g from
    {1, 2, 4, 8}, B = max(1, round(16,384 / N)) (the grid's tokens per head)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        d = 8 * int(rng.integers(4, 33))
        n = 64 * int(round(2.0 ** rng.uniform(9, 13) / 64))
        causal = bool(rng.integers(0, 2))
        g = int(rng.choice([1, 2, 4, 8]))
        out.append(_shape(max(1, round(GRID_TOKENS / n)), 16, n, d, causal=causal, hkv=16 // g,
                          note=f"sample (seed {seed})"))
    return out


def grid_shapes(quick: bool = False, ns=None, ds=(64, 128), causals=(False, True)) -> list[dict]:
    ns = ns or ((1024, 4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384, 32768))
    return [_shape(max(1, GRID_TOKENS // n) if n < GRID_TOKENS else 1, 16, n, d, causal=c)
            for d in ds for c in causals for n in ns]


def configs(quick: bool = False, ns=None, *, shapes: str = "grid", dtypes=("fp16", "fp32"), sample: int = 0,
            seed: int = 0, ds=(64, 128), causals=(False, True)) -> list[dict]:
    """Every configuration to run, forward first: each shape in each dtype.  ``shapes``: "grid",
    "offgrid" (:data:`OFFGRID` and ``sample`` shapes of :func:`sample_shapes`) or "all".  The
    backward skips N > 16,384 on the grid (naive's N x N graphs)."""
    if shapes not in ("grid", "offgrid", "all"):
        raise ValueError(f"shapes={shapes!r}: must be 'grid', 'offgrid' or 'all'")
    bad = [t for t in dtypes if t not in DTYPES]
    if bad:
        raise ValueError(f"dtypes={bad}: each must be one of {', '.join(DTYPES)}")
    sets = []
    if shapes in ("grid", "all"):
        sets.append(("grid", grid_shapes(quick, ns, ds, causals)))
    if shapes in ("offgrid", "all"):
        sets.append(("offgrid", list(OFFGRID)))
        sets.append(("sample", sample_shapes(sample, seed)))
    out, seen = [], set()
    for pass_ in ("fwd", "bwd"):
        for dtype in dtypes:
            for set_, shs in sets:
                for sh in shs:
                    if set_ == "grid" and pass_ == "bwd" and sh["n"] > 16384:
                        continue
                    cfg = dict(sh, set=set_, dtype=dtype, **{"pass": pass_})
                    cfg["config"] = tag(cfg)
                    if cfg["config"] not in seen:  # a sampled shape may repeat another
                        seen.add(cfg["config"])
                        out.append(cfg)
    return out


# --------------------------------------------------------------------------- which variants run

def shipped(pass_: str) -> list[str]:
    """Our shipped variants of a pass, every dtype (``kernels.perf.BEST``), as ``ours_<name>``."""
    from . import perf

    names = [name for (p, _), entries in perf.BEST.items() if p == pass_ for name, _, _ in entries]
    return [f"ours_{n}" for n in dict.fromkeys(names)]


def best_variant(pass_: str, dtype: str, d: int) -> str | None:
    """The variant ``kernels.flash_attention(impl="auto")`` picks (``kernels.perf.BEST``), as
    ``ours_<name>``; bf16 with no entry of its own falls back to fp16's (then reported n/a
    if it refuses bf16)."""
    from . import perf

    entries = perf.BEST.get((pass_, DTYPE_NAMES[dtype])) or (
        perf.BEST.get((pass_, "float16"), ()) if dtype == "bf16" else ())
    for name, lo, hi in entries:
        if lo <= d <= hi and _supports(_module(name), dtype, d) is not False:
            return f"ours_{name}"
    return None


def _module(name: str):
    """A numbered variant's interface (``kernels.perf.variant``; a module of its own in trees
    before the restructuring, which the A/B bench runs this file against)."""
    from . import perf

    if hasattr(perf, "variant"):
        return perf.variant(name)
    import importlib

    return importlib.import_module(f"{perf.__name__}.{name}")


def _supports(mod, dtype: str, d: int):
    """``mod.supports(dtype, d)``: True, False, or None where the question cannot be put (numpy has
    no bfloat16 unless a kernel registers one): the launcher then answers, by running or by a
    ValueError."""
    try:
        return bool(mod.supports(np.dtype(DTYPE_NAMES[dtype]), d))
    except TypeError:
        return None


def variant_dtype(var: str) -> str | None:
    """The dtype a numbered variant's name gives (``ours_fwd_fp16_v4`` -> fp16), else None."""
    parts = var.split("_")
    return parts[2] if len(parts) >= 4 and parts[2] in DTYPES else None


def candidates(cfg: dict, chosen=None) -> list[str]:
    """The variants tried on a configuration: the peers, then ours: those named in ``chosen``
    (``best`` stands for :func:`best_variant`), else the shipped ones of the pass.  A numbered
    variant of ours is tried on its own dtype and, for bf16, the fp16 ones too (the bf16 kernels
    may be the fp16 ones taking bf16: each is asked)."""
    p, t = cfg["pass"], cfg["dtype"]
    names = list(PEERS) if chosen is None else [v for v in PEERS if v in chosen]
    want_ours = chosen is None or any(v == "best" or v.startswith("ours_") for v in chosen)
    if chosen is None:
        ours = shipped(p)
    else:
        ours = []
        for v in chosen:
            if v == "best":
                v = best_variant(p, t, cfg["d"]) or "ours"
            if (v == "ours" or v.startswith("ours_")) and v not in ours:
                ours.append(v)
    for v in ours:
        vt = variant_dtype(v)
        if v == "ours":
            names.append(v)
        elif vt is None:  # ours_flash2, ours_standard: every pass and dtype
            names.append(v)
        elif v.split("_")[1] == p and (vt == t or (t == "bf16" and vt == "fp16")):
            names.append(v)
    if want_ours and not any(v.startswith("ours") for v in names):
        names.append("ours")
    return names


def na_reason(var: str, cfg: dict) -> str | None:
    """Why ``var`` does not take ``cfg`` (known before running anything), or None."""
    t, d = cfg["dtype"], cfg["d"]
    if var == "ours":
        return f"no {cfg['pass']} kernel of ours among the variants run takes {t} at d = {d}"
    if var in ("sdpa_flash", "sdpa_cudnn") and t == "fp32":
        return "SDPA's flash and cuDNN backends take fp16/bf16 only"
    if var.startswith("sdpa") and cfg["causal"] and cfg.get("nk", cfg["n"]) != cfg["n"]:
        return "SDPA's is_causal is aligned top-left, ours bottom-right: they differ when Nq != Nk"
    if variant_dtype(var) is not None:
        ok = _supports(_module(var[len("ours_"):]), t, d)
        if ok is False:
            return f"supports({DTYPE_NAMES[t]}, d={d}) is false"
    return None


# --------------------------------------------------------------------------- rounds and their statistics

def rotation(names: list, r: int) -> list:
    """The order of round ``r``: ``names`` rotated left by r."""
    if not names:
        return []
    k = r % len(names)
    return list(names[k:]) + list(names[:k])


def run_rounds(names: list[str], time_round, rounds: int, log=None) -> tuple[dict, dict]:
    """Times each variant in ``rounds`` rounds, the order rotated every round.

    ``time_round(name)`` gives the call times (ms) of one round of one variant; an exception
    drops that variant from the later rounds.  Returns (times, errors): times[name] is a list
    over the rounds (None for a round it did not run) of lists of ms; errors[name] the
    exception's repr."""
    times = {n: [None] * rounds for n in names}
    errors: dict[str, str] = {}
    for r in range(rounds):
        for name in rotation(names, r):
            if name in errors:
                continue
            try:
                times[name][r] = list(time_round(name))
            except Exception as e:  # noqa: BLE001 - one variant's failure must not stop the others
                errors[name] = _err(e)
                if log:
                    log(f"{name}: round {r + 1}: {errors[name]}")
    return times, errors


def _err(e: BaseException) -> str:
    if type(e).__name__ == "OutOfMemoryError":
        return "out of memory"
    return repr(e)[:200]


def _quartiles(xs) -> tuple[float, float, float]:
    q1, med, q3 = np.percentile(np.asarray(xs, dtype=float), [25, 50, 75])
    return float(med), float(q1), float(q3)


def round_medians(rounds_times: list) -> list:
    """Each round's median (None for a round without times)."""
    return [float(np.median(t)) if t else None for t in rounds_times]


def stats(rounds_times: list) -> dict:
    """ms (median of the rounds' medians), ms_q1, ms_q3, ms_min, ms_max (of the rounds' medians),
    ms_std (of every call), rounds (the rounds that ran)."""
    meds = [m for m in round_medians(rounds_times) if m is not None]
    if not meds:
        return {}
    ms, q1, q3 = _quartiles(meds)
    calls = [x for t in rounds_times if t for x in t]
    return {"ms": ms, "ms_q1": q1, "ms_q3": q3, "ms_min": min(meds), "ms_max": max(meds),
            "ms_std": float(np.std(calls)), "rounds": len(meds)}


def round_ratios(peer_times: list, times: list) -> list[float]:
    """Per round in which both ran: the peer's median over this variant's."""
    return [p / m for p, m in zip(round_medians(peer_times), round_medians(times))
            if p is not None and m is not None and m > 0]


def ratio_columns(peer: str, peer_times: list, times: list) -> dict:
    """x_<peer> (median of the per-round ratios), x_<peer>_q1, x_<peer>_q3."""
    rs = round_ratios(peer_times, times)
    if not rs:
        return {}
    med, q1, q3 = _quartiles(rs)
    return {f"x_{peer}": med, f"x_{peer}_q1": q1, f"x_{peer}_q3": q3}


def pm(rec: dict, key: str, width: int = 5) -> str:
    """``median±half-IQR`` of a ratio column, or "-" where the row has none."""
    x = rec.get(key)
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return f"{'-':>{width + 5}s}"
    half = (rec.get(f"{key}_q3", x) - rec.get(f"{key}_q1", x)) / 2
    return f"{x:{width}.2f}±{half:<4.2f}"


def summarize(cfg: dict, times: dict, errors: dict, extra: dict) -> dict[str, dict]:
    """The CSV row of each variant of one configuration from its rounds' times (ratios to every
    peer that ran), its error, or ``extra[name]`` (check errors, n/a reasons, rel_err, inputs)."""
    rows = {}
    for name in extra:
        rec = dict(cfg)
        rec.update(variant=name, **extra[name])
        if name in times and name not in errors:
            st = stats(times[name])
            if st:
                rec.update(st)
                rec["tflops"] = flops(cfg["batch"], cfg["heads"], cfg["n"], cfg["d"], cfg["causal"], cfg["pass"],
                                      cfg.get("nk")) / st["ms"] / 1e9
                for peer in PEERS:
                    if peer in times and peer not in errors:
                        rec.update(ratio_columns(peer, times[peer], times[name]))
        if name in errors:
            rec["error"] = errors[name]
        rows[name] = rec
    return rows


def line(rec: dict) -> str:
    """One printed line of a variant on a configuration."""
    head = f"{rec['variant']:18s} {rec['config']:40s} B={rec['batch']:<3d}"
    if rec.get("na"):
        return f"{head} n/a: {rec['na']}"
    if "ms" not in rec:
        return f"{head} {rec.get('error', '')}"
    iqr = (rec["ms_q3"] - rec["ms_q1"]) / 2
    return (f"{head} {rec['ms']:9.3f}±{iqr:<6.3f} ms {rec['tflops']:7.1f} TFLOP/s  x naive {pm(rec, 'x_naive')}"
            f"  x flash {pm(rec, 'x_sdpa_flash')}  err {rec.get('rel_err', math.nan):.1e}")


# --------------------------------------------------------------------------- the GPU side

def _torch_fns(torch):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def naive(q, k, v, causal):
        g = q.shape[1] // k.shape[1]
        if g > 1:  # grouped-query: each kv head serves g query heads
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = (q * (q.shape[-1] ** -0.5)) @ k.transpose(-1, -2)
        if causal:
            n, m = s.shape[-2], s.shape[-1]
            mask = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
            s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    def sdpa(backend):
        def fn(q, k, v, causal):
            gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
        return fn

    return {"naive": naive, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
            "sdpa_mem_eff": sdpa(SDPBackend.EFFICIENT_ATTENTION), "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}


def _ours(name, torch):
    """(fwd, bwd, save) of one of our variants; bwd and save are None for forward-only ones."""
    import kernels

    if name == "ours_flash2":
        def fwd(q, k, v, causal):
            return torch.as_tensor(kernels.flash_attention(q, k, v, causal=causal, impl="reference"), device="cuda")

        def bwd(q, k, v, do, causal, saved):
            o, lse = saved
            return kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal, impl="reference")

        def save(q, k, v, causal):
            return kernels.flash_attention(q, k, v, causal=causal, return_lse=True, impl="reference")
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
    mod = _module(name[len("ours_"):])
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


def _calls(torch, fn, inputs, repeat, flush, warmup):
    """``warmup`` untimed calls, then ``repeat`` timed ones (ms), each after the L2 flush."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(warmup):
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
    return times


def _time(torch, fn, inputs, repeat, flush):
    """(median, std) of ``repeat`` calls after 3 untimed ones (one round; kernels.perf.tune)."""
    times = _calls(torch, fn, inputs, repeat, flush, 3)
    return float(np.median(times)), float(np.std(times))


def _expand_kv(x, g):
    return x.repeat_interleave(g, dim=1) if g > 1 else x


def _check_fwd(torch, out, q, k, v, causal, rng):
    """Relative error of O on 32 sampled query rows (all rows if N is small), against softmax
    attention in float64 on the GPU (the rows' scores against every key: B·H·32·Nk numbers)."""
    n, nk, g = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    rows = torch.as_tensor(np.sort(rng.choice(n, size=min(n, 32), replace=False)), device=q.device)
    s = (q[:, :, rows].double() @ _expand_kv(k.double(), g).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:  # bottom-right aligned: row r sees keys <= r + Nk - Nq
        s = s.masked_fill(torch.arange(nk, device=q.device)[None, :] > rows[:, None] + (nk - n), float("-inf"))
    want = torch.softmax(s, -1) @ _expand_kv(v.double(), g)
    got = torch.as_tensor(out, device=q.device)[:, :, rows].double()
    return ref.rel_error(got.cpu().numpy(), want.cpu().numpy())


def bwd_error(torch, grads, q, k, v, do, causal) -> float:
    """Worst relative error of (dQ, dK, dV) against autograd through float64 attention, on the
    first kv head of the first batch and the query heads that share it (heads are independent
    otherwise; one group keeps the float64 S small)."""
    g = q.shape[1] // k.shape[1]
    dq, dk, dv = (torch.as_tensor(x, device=q.device) for x in grads)
    grads = [dq[:1, :g], dk[:1, :1], dv[:1, :1]]
    q, do = (x.detach()[:1, :g] for x in (q, do))
    k, v = (x.detach()[:1, :1] for x in (k, v))
    leaf = [x.double().requires_grad_(True) for x in (q, k, v)]
    s = (leaf[0] @ _expand_kv(leaf[1], g).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n, m = s.shape[-2], s.shape[-1]
        s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n), float("-inf"))
    (torch.softmax(s, -1) @ _expand_kv(leaf[2], g)).backward(do.double())
    return max(float((gr.double() - x.grad).norm() / x.grad.norm()) for gr, x in zip(grads, leaf))


def _graph(torch, fwd, inp, causal):
    q, k, v, do = inp
    leaf = [x.clone().requires_grad_(True) for x in (q, k, v)]
    return fwd(*leaf, causal), do, leaf


def peer_backward_graphs(torch, fwd, inputs, causal, check):
    """(graphs, rel err) for timing autograd's backward through a torch peer.

    One graph (the forward's saved tensors, N x N P among them for the naive code) per input set,
    as many as leave room for the backward's own N x N temporaries: the first one is checked
    (``check(grads)`` gives its error), then more are built until one does not fit."""
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
    return graphs, err


def _backward(o, do):
    o.backward(do, retain_graph=True)


def time_peer_backward(torch, fwd, inputs, causal, repeat, flush, check):
    """(ms, std, rel err, input sets rotated) of autograd's backward through a torch peer, in one
    round (:func:`peer_backward_graphs`), dropping a graph if the timed calls run out of memory."""
    graphs, err = peer_backward_graphs(torch, fwd, inputs, causal, check)
    while True:
        try:
            ms, sd = _time(torch, _backward, [(o, do) for o, do, _ in graphs], repeat, flush)
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
    return {"fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2}[dtype]


def _sdpa_refusal(torch, call):
    """``call()``, with torch's refusal of an SDPA backend for the shape turned into NotApplicable
    (its warnings, which say why, as the reason)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return call()
        except RuntimeError as e:
            if "No available kernel" not in str(e) and "No viable backend" not in str(e):
                raise
            why = "; ".join(dict.fromkeys(" ".join(str(w.message).split()) for w in caught)) or str(e)
            raise NotApplicable(f"torch: {why}"[:300]) from None


class _State:
    """One variant of one configuration ready to time: ``fn(*inputs[i])`` is one call."""

    def __init__(self, fn, inputs, shrinkable=False):
        self.fn, self.inputs, self.shrinkable = fn, inputs, shrinkable


def _setup(torch, var, cfg, inputs, peers, rng):
    """Check ``var`` on ``cfg`` against float64 and make it ready to time: (state, rel err).
    NotApplicable where it does not take the configuration; AssertionError where it fails."""
    causal, tol = cfg["causal"], _tolerance(cfg["dtype"])
    if var.startswith("ours"):
        try:
            fwd, bwd, save = _ours(var, torch)
            if cfg["pass"] == "fwd":
                q, k, v, _ = inputs[0]
                out = fwd(q, k, v, causal)
            else:
                saved = [save(q, k, v, causal) for q, k, v, _ in inputs]
                fn_inputs = [(q, k, v, do, s) for (q, k, v, do), s in zip(inputs, saved)]
                grads = bwd(*fn_inputs[0][:4], causal, fn_inputs[0][4])
        except ValueError as e:  # the launcher refuses the inputs (dtype, head dim, ...)
            raise NotApplicable(f"ValueError: {e}"[:300]) from None
        if cfg["pass"] == "fwd":
            err = _check_fwd(torch, out, q, k, v, causal, rng)
            if not err < tol:
                raise AssertionError(f"failed the check against float64: rel err {err:.2e}")
            return _State(lambda q, k, v, do, f=fwd: f(q, k, v, causal), inputs), err
        err = _checked_bwd_error(torch, inputs[0], causal, tol, grads)
        return _State(lambda q, k, v, do, s, f=bwd: f(q, k, v, do, causal, s), fn_inputs), err
    fwd = peers[var]
    if cfg["pass"] == "fwd":
        q, k, v, _ = inputs[0]
        out = _sdpa_refusal(torch, lambda: fwd(q, k, v, causal)) if var.startswith("sdpa") else fwd(q, k, v, causal)
        err = _check_fwd(torch, out, q, k, v, causal, rng)
        if not err < tol:
            raise AssertionError(f"failed the check against float64: rel err {err:.2e}")
        return _State(lambda q, k, v, do, f=fwd: f(q, k, v, causal), inputs), err
    check = partial(_checked_bwd_error, torch, inputs[0], causal, tol)
    build = partial(peer_backward_graphs, torch, fwd, inputs, causal, check)
    graphs, err = _sdpa_refusal(torch, build) if var.startswith("sdpa") else build()
    return _State(_backward, [(o, do) for o, do, _ in graphs], shrinkable=True), err


def _with_shrink(torch, st, call):
    """``call()``; where a backward peer runs out of memory, one of its graphs is dropped and
    ``call()`` runs again."""
    while True:
        try:
            return call()
        except torch.cuda.OutOfMemoryError:
            if not st.shrinkable or len(st.inputs) == 1:
                raise
            st.inputs.pop()
            torch.cuda.empty_cache()


def _round_timer(torch, states, repeat, flush):
    """``time_round(name)`` for :func:`run_rounds`: one untimed and ``repeat`` timed calls."""
    def time_round(name):
        st = states[name]
        return _with_shrink(torch, st, lambda: _calls(torch, st.fn, st.inputs, repeat, flush, 1))
    return time_round


def run_config(torch, cfg, variants, peers, rng, flush, rounds, repeat) -> list[dict]:
    """The CSV rows of one configuration: every variant checked, then timed in rounds."""
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[cfg["dtype"]]
    b, h, hkv, n, nk, d = (cfg[x] for x in ("batch", "heads", "kv_heads", "n", "nk", "d"))
    shapes = ((b, h, n, d), (b, hkv, nk, d), (b, hkv, nk, d), (b, h, n, d))
    inputs = [tuple(torch.randn(*s, device="cuda", dtype=tdt) for s in shapes) for _ in range(3)]
    extra, states = {}, {}
    # naive's backward last: its graphs (N x N P each) take what memory the others leave
    order = sorted(variants, key=lambda v: cfg["pass"] == "bwd" and v == "naive")
    for var in order:
        why = na_reason(var, cfg)
        if why:
            extra[var] = {"na": why}
            continue
        try:
            st, err = _setup(torch, var, cfg, inputs, peers, rng)
            if st.shrinkable and 1 < len(st.inputs) < len(inputs):
                st.inputs.pop()  # memory ran out building its graphs: leave room for the others' calls
            _with_shrink(torch, st, lambda st=st: _calls(torch, st.fn, st.inputs, 0, flush, 3))
            states[var], extra[var] = st, {"rel_err": err}
        except NotApplicable as e:
            extra[var] = {"na": str(e)}
        except torch.cuda.OutOfMemoryError:
            extra[var] = {"error": "out of memory"}
        except Exception as e:  # noqa: BLE001 - one variant's failure must not stop the table
            extra[var] = {"error": repr(e)[:200]}
        torch.cuda.empty_cache()
    names = [v for v in variants if v in states]
    times, errors = run_rounds(names, _round_timer(torch, states, repeat, flush), rounds)
    for v in names:
        extra[v]["inputs"] = len(states[v].inputs)
    rows = summarize(cfg, times, errors, {v: extra[v] for v in variants if v in extra})
    for r in rows.values():
        r["repeat"] = repeat
    del states, inputs
    torch.cuda.empty_cache()
    return list(rows.values())


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="grid N = 1,024, 4,096, 16,384")
    ap.add_argument("--shapes", default="grid", choices=["grid", "offgrid", "all"])
    ap.add_argument("--dtypes", default="fp16,bf16,fp32", help="comma-separated, of fp16, bf16, fp32")
    ap.add_argument("--ns", nargs="*", type=int, default=None, help="grid sequence lengths (default: 1,024-32,768)")
    ap.add_argument("--ds", nargs="*", type=int, default=[64, 128], help="grid head dims")
    ap.add_argument("--causal", default="both", choices=["no", "yes", "both"], help="grid: causal, full or both")
    ap.add_argument("--sample", type=int, default=6, help="random off-grid shapes (with --shapes offgrid/all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random off-grid shapes")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per configuration (variants interleaved)")
    ap.add_argument("--repeat", type=int, default=5, help="timed calls per variant per round")
    ap.add_argument("--only", nargs="*", default=None,
                    help="configurations whose name holds one of these, e.g. fwd-fp16-d64")
    ap.add_argument("--variants", nargs="*", default=None,
                    help="run only these variants (peers included; 'best': the shipped one for the pass, dtype and d)")
    ap.add_argument("--budget", type=float, default=None, help="seconds: start no configuration after this")
    ap.add_argument("--out", default=None)
    ap.add_argument("--force", action="store_true", help="overwrite an existing --out")
    args = ap.parse_args(argv)
    dtypes = tuple(t.strip() for t in args.dtypes.split(",") if t.strip())
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    try:
        if args.rounds < 1 or args.repeat < 1:
            raise ValueError(f"rounds={args.rounds}, repeat={args.repeat}: each must be >= 1")
        if args.sample < 0:
            raise ValueError(f"sample={args.sample}: must be >= 0")
        todo = configs(args.quick, args.ns, shapes=args.shapes, dtypes=dtypes, sample=args.sample, seed=args.seed,
                       ds=tuple(args.ds), causals=causals)
    except ValueError as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    if args.out and Path(args.out).exists() and not args.force:
        print(f"flashsim: error: out={args.out!r} exists (give --force to overwrite it)", file=sys.stderr)
        return 2
    todo = [c for c in todo if not args.only or any(s in c["config"] for s in args.only)]
    try:
        torch = cuda_torch("the peers (naive, SDPA) need it")
    except ValueError as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(0)
    peers = _torch_fns(torch)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    rows, meta = [], {}
    if args.out:
        from .gpucheck import provenance

        meta = dict(provenance(), torch=torch.__version__, method=__doc__, tf32="off", rounds=args.rounds,
                    repeat=args.repeat, shapes=args.shapes, dtypes=list(dtypes),
                    sample=args.sample if args.shapes != "grid" else 0, seed=args.seed,
                    argv=list(sys.argv[1:] if argv is None else argv))
    start = time.monotonic()
    for i, cfg in enumerate(todo):
        if args.budget is not None and time.monotonic() - start > args.budget:
            left = [c["config"] for c in todo[i:]]
            print(f"budget of {args.budget:.0f} s spent: {len(left)} configurations not run: {' '.join(left)}")
            meta["not_run"] = left
            break
        variants = candidates(cfg, args.variants)
        for rec in run_config(torch, cfg, variants, peers, rng, flush, args.rounds, args.repeat):
            print(line(rec), flush=True)
            rows.append(rec)
        if args.out:
            write(args.out, rows, meta)
    if args.out:
        write(args.out, rows, meta)
        print(f"wrote {args.out}")
    return 0


def cuda_torch(why: str):
    """torch, with a CUDA GPU visible; else a ValueError saying which is missing (``why``: what
    needs torch), for a command line's one error line."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"torch is not installed: {why}") from None
    if not torch.cuda.is_available():
        raise ValueError("no CUDA GPU visible")
    return torch


def write(out, rows: list[dict], meta: dict | list) -> None:
    """The CSV (every row so far; the columns of all rows) and its ``.meta.json``, each written to
    a temporary name and renamed over the old one (also kernels.bench_table's merge and
    kernels.bench_ab's pack)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = sorted({k for r in rows for k in r})
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)
    mpath = path.with_name(path.stem + ".meta.json")
    mtmp = mpath.with_name(mpath.name + ".tmp")
    mtmp.write_text(json.dumps(meta, indent=1))
    os.replace(mtmp, mpath)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
