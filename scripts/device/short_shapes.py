"""Why the warpgroup forward falls short of SDPA flash on some shapes: timings of block shapes, and
Nsight Compute's launch statistics, ours beside flash's.

The bench record (kernels/data/bench_fwd_v5_20cf9ec) leaves fwd_fp16_v5 at 0.44-0.72x SDPA's
flash backend on small grids (B·H = 1, 4), Nq != Nk, causal at N <= 1,024, and 0.88-0.97x at
N = 1,024.  On the GPU machine, from the repository root::

    python3 scripts/device/short_shapes.py time --rounds 5 --out "$OUT/short_shapes.csv"
    python3 scripts/device/short_shapes.py time --set grid --dtypes fp16,bf16 --out "$OUT/grid.csv"
    ncu --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight \\
        --csv --page details python3 scripts/device/short_shapes.py ncu > "$OUT/short_shapes.ncu.csv"

``time``: each shape's candidates (SDPA flash, v5's default and other block shapes, v6; ``--set
grid``: the bench grid, in ``--dtypes``) in the same rounds, the order rotated each round
(``kernels.bench.run_rounds``), after the bench's 256 MiB L2 flush; the CSV has each candidate's
median over rounds, quartiles, and its ratio to flash per round (median and quartiles).
``ncu``: one call of flash and of v5's default per short shape after two warm-up calls, marked
by ``profile_start``/``profile_stop`` (ncu's ``--profile-from-start off`` profiles those only).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: (name, batch, heads, Nq, Nk, d, causal)
SHAPES = (("bh1_n8192_d128", 1, 1, 8192, 8192, 128, False),
          ("bh4_n4096_d64", 1, 4, 4096, 4096, 64, False),
          ("nq512_nk4096_d128", 4, 16, 512, 4096, 128, False),
          ("nq4096_nk512_d128", 4, 16, 4096, 512, 128, False),
          ("causal_n512_d64", 32, 16, 512, 512, 64, True),
          ("causal_n1024_d128", 16, 16, 1024, 1024, 128, True),
          ("n1024_d64", 16, 16, 1024, 1024, 64, False),
          ("n1024_d128", 16, 16, 1024, 1024, 128, False),
          ("n4096_d64", 4, 16, 4096, 4096, 64, False),
          ("n4096_d128", 4, 16, 4096, 4096, 128, False))


#: --cands: {"<d>": {name: [variant, config]}} in place of :func:`candidates`' own.
CANDS: dict = {}


def candidates(d: int) -> dict:
    """name -> (variant, config) of ours."""
    if str(d) in CANDS:
        return {name: (var, dict(cfg)) for name, (var, cfg) in CANDS[str(d)].items()}
    c = {"v5": ("fwd_fp16_v5", {}), "v5_nw4": ("fwd_fp16_v5", {"nw": 4}),
         "v5_nw4_bc64": ("fwd_fp16_v5", {"nw": 4, "bc": 64})}
    if d == 128:
        c["v5_bc64"] = ("fwd_fp16_v5", {"bc": 64})
        # (fwd_fp16_v6's candidates "v6", "v6_nw4_bc64" of the 532db74 record: v6 left the tree
        # after cf26650)
    else:
        c["v5_bc128"] = ("fwd_fp16_v5", {"bc": 128})
    return c


def grid(ns=(1024, 2048, 4096, 8192, 16384)) -> tuple:
    """The bench grid at d = 64 and 128 (kernels.bench.grid_shapes) at these N, as SHAPES rows."""
    from kernels.bench import grid_shapes

    return tuple((f"grid_n{s['n']}_d{s['d']}{'_causal' if s['causal'] else ''}", s["batch"], s["heads"], s["n"],
                  s["nk"], s["d"], s["causal"]) for s in grid_shapes(ns=tuple(ns)))


def _inputs(torch, b, h, nq, nk, d, dtype="fp16"):
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    q = torch.randn(b, h, nq, d, device="cuda", dtype=dt, generator=g)
    k = torch.randn(b, h, nk, d, device="cuda", dtype=dt, generator=g)
    v = torch.randn(b, h, nk, d, device="cuda", dtype=dt, generator=g)
    return q, k, v


def _fns(torch, d):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernels.perf import variant

    def flash(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, k, v, is_causal=causal)

    fns = {"sdpa_flash": flash}
    for name, (var, cfg) in candidates(d).items():
        mod = variant(var)
        fns[name] = (lambda m, c: lambda q, k, v, causal: m.forward(q, k, v, causal=causal, **c))(mod, cfg)
    return fns


def time_all(rounds: int, repeat: int, out: Path, shapes=SHAPES, dtypes=("fp16",)) -> None:
    import torch

    from kernels.bench import _calls, ratio_columns, run_rounds, stats

    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    rows = []
    for (sname, b, h, nq, nk, d, causal), dtype in ((s, dt) for dt in dtypes for s in shapes):
        q, k, v = _inputs(torch, b, h, nq, nk, d, dtype)
        fns = _fns(torch, d)
        ref = fns["sdpa_flash"](q, k, v, causal).float()
        errs = {}
        for name, fn in fns.items():
            try:
                out_ = fn(q, k, v, causal).float()
                errs[name] = float((out_ - ref).norm() / ref.norm())
            except Exception as e:  # noqa: BLE001 - a config the kernel refuses is a row, not a stop
                errs[name] = repr(e)[:120]
        names = [n for n in fns if isinstance(errs[n], float) and errs[n] < 1e-2]
        inputs = [(q, k, v, causal)]

        def one_round(n, fns=fns, inputs=inputs):
            return _calls(torch, fns[n], inputs, repeat, flush, 3)

        times, failed = run_rounds(names, one_round, rounds)
        for name in fns:
            rec = {"shape": sname, "dtype": dtype, "batch": b, "heads": h, "nq": nq, "nk": nk, "d": d, "causal": causal,
                   "candidate": name, "err_vs_flash": errs[name] if isinstance(errs[name], float) else "",
                   "error": failed.get(name, "" if isinstance(errs[name], float) else errs[name])}
            if name in times:
                rec.update(stats(times[name]))
                rec.update(ratio_columns("sdpa_flash", times["sdpa_flash"], times[name]))
            rows.append(rec)
            print(f"{sname:<20} {dtype} {name:<12} {rec.get('ms', float('nan')):8.4f} ms  x flash "
                  f"{rec.get('x_sdpa_flash', float('nan')):.3f} [{rec.get('x_sdpa_flash_q1', float('nan')):.3f}, "
                  f"{rec.get('x_sdpa_flash_q3', float('nan')):.3f}] {rec['error']}", flush=True)
        del q, k, v, inputs, fns
        torch.cuda.empty_cache()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    tmp.rename(out)
    from kernels.gpucheck import provenance

    meta = {**provenance(), "torch": torch.__version__, "rounds": rounds, "repeat": repeat,
            "shapes": shapes, "dtypes": dtypes, "candidates": {d: candidates(d) for d in (64, 128)}}
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=1, default=str))


def ncu_all() -> None:
    import torch
    from numba import cuda

    for sname, b, h, nq, nk, d, causal in SHAPES:
        q, k, v = _inputs(torch, b, h, nq, nk, d)
        fns = _fns(torch, d)
        for name in ("sdpa_flash", "v5"):
            for _ in range(2):
                fns[name](q, k, v, causal)
            torch.cuda.synchronize()
            cuda.profile_start()
            fns[name](q, k, v, causal)
            torch.cuda.synchronize()
            cuda.profile_stop()
            print(f"ncu: {sname} {name}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("time", "ncu"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("short_shapes.csv"))
    ap.add_argument("--set", choices=("short", "grid"), default="short",
                    help="the short shapes above, or the bench grid (N 1,024-16,384, d 64 and 128)")
    ap.add_argument("--dtypes", default="fp16", help="comma-separated, of fp16 and bf16")
    ap.add_argument("--ns", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384], help="--set grid's N")
    ap.add_argument("--cands", default=None,
                    help='JSON {"<d>": {name: [variant, config]}}: the candidates of ours at that head dim')
    a = ap.parse_args(argv)
    if a.cands:
        try:
            cands = json.loads(a.cands)
            if not isinstance(cands, dict) or not all(isinstance(c, dict) and all(
                    isinstance(v, list) and len(v) == 2 and isinstance(v[1], dict) for v in c.values())
                    for c in cands.values()):
                raise ValueError("not {\"<d>\": {name: [variant, config]}}")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            ap.error(f"--cands: {e}")
        CANDS.update(cands)
    if a.mode == "time":
        time_all(a.rounds, a.repeat, a.out, SHAPES if a.set == "short" else grid(a.ns), tuple(a.dtypes.split(",")))
    else:
        ncu_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
