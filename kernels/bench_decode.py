"""Benchmark of decoding: our fast decode kernel beside a device-to-device copy of the same K/V
bytes and torch SDPA's backends, in one run.

    python -m kernels.bench_decode [--quick] [--out kernels/data/bench_decode_h100.csv]

Groups of configurations (fp16, d = 128, Hkv = 8; GQA 8:1 is Hq = 64, 1:1 is Hq = 8):

* ``main``: Nq = 1, Nk = 4,096 … 1,048,576 with B = max(1, 262,144 / Nk) (so that K and V hold at
  least 1 GiB: far beyond the L2), both GQA ratios; ours with its default splits
  (``kernels.perf.decode.default_splits``), the copy, and SDPA's flash, memory-efficient, cuDNN and
  math backends (``enable_gqa=True``; a backend that refuses the shape is recorded with its error);
  also two tunings of ours: ``ours_fast_t32b8`` (32-key tiles, registers for 8 blocks per SM) and
  ``ours_fast_b5`` (the default tile, registers for 5 blocks per SM), and ``ours_fast_tc`` (v3,
  the products on the tensor cores; also in the pages and nq groups) where it applies;
* ``splits``: num_splits swept 1, 2, 4, … 64 (those the longest sequence allows) at Nk = 65,536
  (B = 4) and Nk = 1,048,576 (B = 1), GQA 8:1; the default is marked (``default_splits``), and so
  is the simulator's choice where ``flashsim.decode_splits`` exists (column ``model_splits``);
* ``pages``: a paged cache with page sizes 16 … 256 (pages shuffled in the pool) at Nk = 65,536,
  B = 4, GQA 8:1, beside the contiguous cache;
* ``nq``: Nq = 1, 2, 4 (speculative decoding; ``causal=False`` for ours and SDPA alike, since
  SDPA's ``is_causal`` aligns top-left) at Nk = 65,536, B = 4, GQA 8:1.

Every variant is first checked against float64 attention on the GPU (the first sequence, all
heads; rel err < 5e-3 for fp16) and then timed with CUDA events: 2 warm-up calls, then ``--trials``
trials (default 7) of ``--inner`` back-to-back calls (default 5) between two events; a trial's
time is its mean per call; the CSV holds the median over trials (``ms``) and the fastest and
slowest trial (``ms_min``, ``ms_max``).  Ours is timed through its launcher with the inputs
validated once beforehand (``kernels.decode.plan``): the check of the block table and lengths,
which copies them to the host, is outside the timing; allocating O, L and the partials and the
launches are inside.

Bandwidth: ``gbps`` is the bytes a variant must move over its time: for decoding, K and V read
once plus Q read and O written (the compulsory traffic); for the copy, the K and V bytes read
plus the same written (how copy bandwidth is quoted).  ``x_copy`` = ours' GB/s over the copy's in
the same run (the issue's 80% target), ``x_sdpa_best`` = the fastest SDPA backend's ms over ours.
The CSV is rewritten after every configuration with a ``.meta.json`` of provenance beside it.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import numpy as np

from flashsim.cmdline import ToolParser

D = 128
HKV = 8
SPLITS = (1, 2, 4, 8, 16, 32, 64)
PAGES = (16, 32, 64, 128, 256)
SDPA = ("sdpa_flash", "sdpa_mem_eff", "sdpa_cudnn", "sdpa_math")


def configs(quick: bool) -> list[dict]:
    nks = (4096, 65536, 1048576) if quick else (4096, 16384, 65536, 262144, 1048576)
    out = []
    for g in (8, 1):
        for nk in nks:
            out.append(dict(group="main", g=g, nk=nk, batch=max(1, 262144 // nk), nq=1, page=None, splits=None))
    for nk in ((65536,) if quick else (65536, 1048576)):
        for s in SPLITS:
            out.append(dict(group="splits", g=8, nk=nk, batch=max(1, 262144 // nk), nq=1, page=None, splits=s))
    for p in (None, *((16, 256) if quick else PAGES)):
        out.append(dict(group="pages", g=8, nk=65536, batch=4, nq=1, page=p, splits=None))
    for nq in ((2,) if quick else (2, 4)):
        out.append(dict(group="nq", g=8, nk=65536, batch=4, nq=nq, page=None, splits=None))
    return out


def _time(torch, fn, trials, inner):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(trials):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / inner)
    return float(np.median(per)), float(min(per)), float(max(per))


def _model_splits(cfg, hq, tile):
    """The simulator's split choice (``flashsim.decode_splits.propose`` on the H100 preset) for
    this configuration with the kernel's key tile as Bc; None (and a printed reason) if it refuses."""
    from flashsim import Tiling, Workload
    from flashsim.decode_splits import propose

    w = Workload(batch=cfg["batch"], heads=hq, kv_heads=HKV, seq_len_q=cfg["nq"], seq_len_k=cfg["nk"],
                 head_dim=D, dtype="fp16")
    try:
        return propose(w, "h100", Tiling(1, tile), **({"page_size": cfg["page"]} if cfg["page"] else {})).num_splits
    except ValueError as e:
        print(f"model splits: {e}", flush=True)
        return None


def _reference_error(torch, o, q, k, v, nq, causal):
    """rel err of O of the first sequence against float64 attention on the GPU (GQA expanded)."""
    g = q.shape[1] // k.shape[1]
    qd = q[0].double()
    kd = k[0].double().repeat_interleave(g, dim=0)
    vd = v[0].double().repeat_interleave(g, dim=0)
    s = qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal and nq > 1:
        nk = kd.shape[1]
        j = torch.arange(nk, device=q.device)[None, :]
        i = torch.arange(nq, device=q.device)[:, None]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    want = torch.softmax(s, -1) @ vd
    got = o[0].double()
    return float((got - want).norm() / want.norm())


def _to_paged(torch, k, v, page, gen):
    """(k_pages, v_pages, block_table) holding the contiguous (B, Hkv, Nk, d) cache in shuffled pages."""
    b, hkv, nk, d = k.shape
    per = nk // page
    perm = torch.randperm(b * per, device=k.device, generator=gen)
    table = perm.view(b, per).to(torch.int32)
    kp = torch.empty(b * per, page, hkv, d, dtype=k.dtype, device=k.device)
    vp = torch.empty_like(kp)
    kp[perm] = k.view(b, hkv, per, page, d).permute(0, 2, 3, 1, 4).reshape(b * per, page, hkv, d)
    vp[perm] = v.view(b, hkv, per, page, d).permute(0, 2, 3, 1, 4).reshape(b * per, page, hkv, d)
    return kp, vp, table.cpu().numpy()


def run_config(torch, cfg, trials, inner, sdpa_fns) -> list[dict]:
    from kernels import decode as ref_decode
    from kernels.perf import decode as fast

    g, nk, b, nq = cfg["g"], cfg["nk"], cfg["batch"], cfg["nq"]
    hq = g * HKV
    causal = nq == 1  # Nq = 1 sees every key either way
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, nq, D, device="cuda", dtype=torch.float16, generator=gen)
    k = torch.randn(b, HKV, nk, D, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(b, HKV, nk, D, device="cuda", dtype=torch.float16, generator=gen)
    kv_bytes = 2 * k.numel() * 2
    io_bytes = kv_bytes + 2 * q.numel() * 2
    lens = np.full(b, nk, dtype=np.int32)
    base = dict(group=cfg["group"], dtype="fp16", batch=b, heads=hq, kv_heads=HKV, nq=nq, nk=nk, d=D,
                page_size=cfg["page"] or 0, causal=causal, kv_bytes=kv_bytes)
    rows = []
    # the copy of the same K and V bytes
    k2, v2 = torch.empty_like(k), torch.empty_like(v)

    def copy():
        k2.copy_(k)
        v2.copy_(v)

    ms, lo, hi = _time(torch, copy, trials, inner)
    rows.append(dict(base, variant="copy", ms=ms, ms_min=lo, ms_max=hi, gbps=2 * kv_bytes / ms / 1e6))
    k2 = v2 = None  # (the closure shares these names: this frees the buffers)
    # ours
    if cfg["page"]:
        kc, vc, table = _to_paged(torch, k, v, cfg["page"], gen)
    else:
        kc, vc, table = k, v, None
    p = ref_decode.plan(q, kc, vc, cache_seqlens=lens, block_table=table, causal=causal)
    # ours with its defaults, and (main group) the tuning variants: a 32-key tile with registers for
    # 8 blocks per SM (more blocks in flight), and the default tile limited to 5 blocks' registers
    tunings = [("ours_fast", None, 0)]
    if cfg["group"] == "main":
        tunings += [("ours_fast_t32b8", 32, 8), ("ours_fast_b5", None, 5)]
    if cfg["group"] in ("main", "pages", "nq") and fast.tc_supports(p.dt, D, g * nq):
        tunings.append(("ours_fast_tc", 64, -1))  # v3, the tensor-core variant (min_blocks -1 marks it)
    for name, tile, minb in tunings:
        t = tile or fast.tile_keys(p.dt, D, g * nq, p.page_size)
        longest = ref_decode.visible_blocks(nk, nq, t, -1)[1]
        default = fast.default_splits(b, HKV, longest)
        splits = cfg["splits"] or default
        rec = dict(base, variant=name, num_splits=splits, default_splits=default,
                   model_splits=_model_splits(cfg, hq, t), tile_keys=t)
        fn = fast.forward_tc if minb < 0 else fast.forward
        kw = dict(num_splits=splits, _plan=p) if minb < 0 else dict(num_splits=splits, tile=tile, min_blocks=minb,
                                                                     _plan=p)
        try:
            if splits > longest:
                raise ValueError(f"num_splits={splits} > {longest} key blocks")
            o, _ = fn(q, kc, vc, **kw)
            rec["rel_err"] = _reference_error(torch, o, q, k, v, nq, causal)
            if not rec["rel_err"] < 5e-3:
                raise AssertionError(f"failed the check against float64: rel err {rec['rel_err']:.2e}")
            ms, lo, hi = _time(torch, lambda fn=fn, kw=kw: fn(q, kc, vc, **kw), trials, inner)
            rec.update(ms=ms, ms_min=lo, ms_max=hi, gbps=io_bytes / ms / 1e6)
        except Exception as e:
            rec["error"] = repr(e)[:200]
        rows.append(rec)
    kc = vc = p = None
    # SDPA's backends (main and nq groups)
    if cfg["group"] in ("main", "nq"):
        for name in SDPA:
            r = dict(base, variant=name)
            try:
                fn = sdpa_fns[name]
                o = fn(q, k, v)
                r["rel_err"] = _reference_error(torch, o, q, k, v, nq, causal)
                if not r["rel_err"] < 5e-3:
                    raise AssertionError(f"failed the check against float64: rel err {r['rel_err']:.2e}")
                ms, lo, hi = _time(torch, lambda f=fn: f(q, k, v), trials, inner)
                r.update(ms=ms, ms_min=lo, ms_max=hi, gbps=io_bytes / ms / 1e6)
            except torch.cuda.OutOfMemoryError:
                r["error"] = "out of memory"
            except Exception as e:
                r["error"] = repr(e)[:200]
            torch.cuda.empty_cache()
            rows.append(r)
    copy_gbps = rows[0]["gbps"]
    best = min((r["ms"] for r in rows if r["variant"].startswith("sdpa") and "ms" in r), default=None)
    for r in rows:
        if "gbps" in r and r["variant"] != "copy":
            r["x_copy"] = r["gbps"] / copy_gbps
        if r["variant"].startswith("ours_fast") and "ms" in r and best is not None:
            r["x_sdpa_best"] = best / r["ms"]
    return rows


def _sdpa_fns(torch):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def make(backend):
        def fn(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return fn

    return {"sdpa_flash": make(SDPBackend.FLASH_ATTENTION), "sdpa_mem_eff": make(SDPBackend.EFFICIENT_ATTENTION),
            "sdpa_cudnn": make(SDPBackend.CUDNN_ATTENTION), "sdpa_math": make(SDPBackend.MATH)}


def write(out, rows: list[dict], meta: dict) -> None:
    """The CSV (every row so far) and its ``.meta.json``, each written to a temporary name first."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = ["group", "variant", "dtype", "batch", "heads", "kv_heads", "nq", "nk", "d", "page_size", "causal",
              "num_splits", "default_splits", "model_splits", "tile_keys", "kv_bytes", "ms", "ms_min", "ms_max",
              "gbps", "x_copy", "x_sdpa_best", "rel_err", "error"]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)
    mpath = path.with_name(path.stem + ".meta.json")
    mtmp = mpath.with_name(mpath.name + ".tmp")
    mtmp.write_text(json.dumps(meta, indent=1))
    mtmp.replace(mpath)


def _line(r) -> str:
    tag = (f"{r['group']:6s} g={r['heads'] // r['kv_heads']} B={r['batch']:<3d} Nq={r['nq']} Nk={r['nk']:<8d} "
           f"P={r['page_size']:<3d}")
    if "ms" not in r:
        return f"{r['variant']:13s} {tag} {r.get('error', '')}"
    extra = ""
    if r["variant"].startswith("ours_fast"):
        extra = (f" S={r['num_splits']:<3d}{'*' if r['num_splits'] == r['default_splits'] else ' '}"
                 f" x copy {r.get('x_copy', float('nan')):5.2f} x sdpa {r.get('x_sdpa_best', float('nan')):5.2f}")
    return (f"{r['variant']:13s} {tag} {r['ms']:8.3f} ms [{r['ms_min']:.3f}-{r['ms_max']:.3f}] "
            f"{r['gbps']:7.0f} GB/s{extra}")


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer lengths, splits and page sizes")
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--only", default=None, help="one group: main, splits, pages or nq")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_decode: torch is not installed: the peers (SDPA, the copy) need it", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_decode: no CUDA GPU visible", file=sys.stderr)
        return 2
    meta = {}
    if args.out:
        from .gpucheck import provenance

        meta = dict(provenance(), torch=torch.__version__, method=__doc__, argv=sys.argv[1:] if argv is None else argv)
    fns = _sdpa_fns(torch)
    rows = []
    print("* marks our default split count; x copy = our GB/s over the copy's; x sdpa = best SDPA ms over ours")
    for cfg in configs(args.quick):
        if args.only and cfg["group"] != args.only:
            continue
        try:
            got = run_config(torch, cfg, args.trials, args.inner, fns)
        except torch.cuda.OutOfMemoryError:
            got = [dict(group=cfg["group"], variant="all", batch=cfg["batch"], nk=cfg["nk"], error="out of memory")]
        torch.cuda.empty_cache()
        for r in got:
            if "heads" in r:
                print(_line(r), flush=True)
            rows.append(r)
        if args.out:
            write(args.out, rows, meta)
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
