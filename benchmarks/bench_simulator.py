"""How fast the simulator counts: vectorised closed forms, scalar closed forms and the walker.

    python benchmarks/bench_simulator.py [--configs 1000000] [--check 300] [--out PATH]

1. Vectorised dense closed forms (:mod:`flashsim.closed_vec`) over ``--configs`` random
   configurations (N, d, M, B, H) per algorithm and pass (forward for all four algorithms,
   backward for standard, flash1 and flash2): configurations per second, and a random sample
   of ``--check`` of them compared entry for entry with the scalar
   :func:`flashsim.api.closed_form_elements` (exact equality; the script exits non-zero on a
   mismatch).
2. The scalar closed form's rate on the same sample, for comparison.
3. The walker (``simulate``: schedule walk plus closed form, checked equal) at N = 65,536,
   d = 128, B·H = 8 (M = an H100's 227 KiB of shared memory in fp16) for every algorithm and
   pass, dense, and causal for flash1 and flash2.

Prints a table; writes it as CSV only when ``--out`` is given.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from flashsim.cmdline import ToolParser

# the flashsim of this checkout, whatever flashsim the environment has installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashsim import closed_vec
from flashsim.algorithms import get_algorithm
from flashsim.api import closed_form_elements, simulate
from flashsim.config import GPUS, Workload
from flashsim.sweep import write_csv


def random_configs(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    d = rng.choice(np.array([16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256]), n)
    # M from 4d to 64·d², log-uniform; N from 1 to 2^17, log-uniform (ragged)
    lo, hi = np.log(4.0 * d), np.log(64.0 * d * d)
    m = np.maximum(4 * d, np.exp(lo + rng.random(n) * (hi - lo)).astype(np.int64))
    nq = np.exp(rng.random(n) * np.log(2.0**17)).astype(np.int64) + 1
    return {"nq": nq, "d": d.astype(np.int64), "m": m, "batch": rng.integers(1, 9, n), "heads": rng.integers(1, 33, n)}


def available(algo: str) -> bool:
    try:
        get_algorithm(algo)
    except ImportError:
        return False
    return True


def bench_vectorised(algo: str, pass_: str, cfg: dict, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        counts = closed_vec.dense(algo, pass_, cfg["nq"], cfg["d"], cfg["m"], cfg["batch"], cfg["heads"])
        closed_vec.totals(counts)
        best = min(best, time.perf_counter() - t0)
    return best


def scalar_counts(algo: str, pass_: str, nq: int, d: int, m: int, b: int, h: int) -> dict:
    w = Workload(batch=b, heads=h, seq_len_q=nq, head_dim=d)
    return closed_form_elements(w, algo, pass_, sram_elems=m)


def check_sample(algo: str, pass_: str, cfg: dict, idx: np.ndarray) -> tuple[int, float]:
    """Compare the vectorised counts with the scalar closed form on ``idx``; (mismatches, seconds)."""
    sub = {k: v[idx] for k, v in cfg.items()}
    vec = closed_vec.dense(algo, pass_, sub["nq"], sub["d"], sub["m"], sub["batch"], sub["heads"])
    bad = 0
    t0 = time.perf_counter()
    for k in range(len(idx)):
        args = [int(sub[x][k]) for x in ("nq", "d", "m", "batch", "heads")]
        want = scalar_counts(algo, pass_, *args)
        got = {key: int(v[k]) for key, v in vec.items() if int(v[k])}
        if got != want:
            bad += 1
            if bad <= 3:
                print(f"MISMATCH {algo} {pass_} {args}: vectorised {got} scalar {want}", file=sys.stderr)
    return bad, time.perf_counter() - t0


def bench_walker(algo: str, pass_: str, n: int, d: int, m: int, causal: bool = False) -> tuple[float, bool]:
    w = Workload(batch=1, heads=8, seq_len_q=n, head_dim=d, causal=causal)
    t0 = time.perf_counter()
    res = simulate(w, algo, pass_, sram_elems=m)
    return time.perf_counter() - t0, res.agrees


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=1_000_000, help="configurations per vectorised run")
    ap.add_argument("--check", type=int, default=300, help="sampled configurations checked against the scalar form")
    ap.add_argument("--seq-len", type=int, default=65536, help="N for the walker timings")
    ap.add_argument("--head-dim", type=int, default=128, help="d for the walker timings")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the table as CSV here (default: print only)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    cfg = random_configs(a.configs, rng)
    rows, failed = [], False
    runs = [(algo, "fwd") for algo in closed_vec.ALGOS] + [(algo, "bwd") for algo in closed_vec.BWD_ALGOS]
    for algo, pass_ in runs:
        if not available(algo):
            print(f"({algo}: module not available, skipped)")
            continue
        secs = bench_vectorised(algo, pass_, cfg)
        idx = rng.choice(a.configs, size=min(a.check, a.configs), replace=False)
        bad, scalar_s = check_sample(algo, pass_, cfg, idx)
        failed |= bad > 0
        rows.append({"what": "closed form, vectorised", "algo": algo, "pass": pass_, "configs": a.configs,
                     "seconds": secs, "configs_per_s": a.configs / secs, "checked": len(idx), "mismatches": bad})
        rows.append({"what": "closed form, scalar", "algo": algo, "pass": pass_, "configs": len(idx),
                     "seconds": scalar_s, "configs_per_s": len(idx) / scalar_s, "checked": "", "mismatches": ""})
    m = GPUS["h100"].sram_elems(2)
    walks = [(algo, pass_, False) for algo in ("standard", "flash1", "flash2", "smallcache")
             for pass_ in ("fwd", "bwd")] + [(algo, pass_, True) for algo in ("flash1", "flash2")
                                            for pass_ in ("fwd", "bwd")]
    for algo, pass_, causal in walks:
        if not available(algo) or pass_ not in get_algorithm(algo).PASSES:
            continue
        secs, agrees = bench_walker(algo, pass_, a.seq_len, a.head_dim, m, causal)
        failed |= not agrees
        what = f"walker N={a.seq_len} d={a.head_dim} M={m}{' causal' if causal else ''}"
        rows.append({"what": what, "algo": algo, "pass": pass_,
                     "configs": 1, "seconds": secs, "configs_per_s": 1 / secs, "checked": 1,
                     "mismatches": 0 if agrees else 1})
    print(f"{'what':<43} {'algo':<11} {'pass':<4} {'configs':>9} {'seconds':>9} {'configs/s':>12} {'checked':>7} "
          f"{'bad':>4}")
    for r in rows:
        print(f"{r['what']:<43} {r['algo']:<11} {r['pass']:<4} {r['configs']:>9} {r['seconds']:>9.4f} "
              f"{r['configs_per_s']:>12,.0f} {r['checked']!s:>7} {r['mismatches']!s:>4}")
    if a.out:
        write_csv(rows, a.out)
        print(f"wrote {a.out}")
    if failed:
        print("FAILED: a vectorised count differs from the scalar closed form, or the walker from it",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
