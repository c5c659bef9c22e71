"""The program Nsight Compute profiles: runs each configuration's kernel call once.

    python -m analysis.worker CONFIGS.json MANIFEST.json

For each configuration it prepares the inputs (and, for a backward pass, the forward's O and
L) with the profiler stopped, then starts the profiler (cuProfilerStart; ncu runs with
``--profile-from-start off``), makes the measured call, synchronises, stops the profiler and
launches a marker kernel (profiled, so the launches can be split per configuration; the marker
moves 4 bytes).  Kernels are compiled by a warm-up call at a tiny size first so JIT time never
falls inside the profiled region.  The manifest records each configuration with its wall-clock
time and the counter-free kernel call it made.

An internal entry point: ``flashsim measure`` (:mod:`analysis.measure`) and
``scripts/device/l2_policy.py`` run it under ncu with a configurations file they wrote and a
manifest path of their own scratch folder (replaced if there, as a re-run of theirs needs; written
to a temporary name and renamed).  ``--help`` says so; missing arguments, a configurations file
that cannot be read, and a machine without a GPU end in one ``flashsim: error:`` line, exit
status 2, with no manifest written.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

from .configs import config_id, tiling_of
from .fast_set import FAST_KERNELS
from .torch_set import TORCH_KERNELS
from .torch_set import make_call as torch_call


@cuda.jit
def flashsim_marker(x, k):
    x[0] = k


def _inputs(cfg: dict, rng):
    dt = np.float16 if cfg["dtype"] == "fp16" else np.float32
    b, h, hkv = cfg["batch"], cfg["heads"], cfg.get("kv_heads") or cfg["heads"]
    nq, nk, d = cfg["seq_len_q"], cfg.get("seq_len_k") or cfg["seq_len_q"], cfg["head_dim"]
    q = rng.standard_normal((b, h, nq, d), dtype=np.float32).astype(dt)
    k = rng.standard_normal((b, hkv, nk, d), dtype=np.float32).astype(dt)
    v = rng.standard_normal((b, hkv, nk, d), dtype=np.float32).astype(dt)
    do = rng.standard_normal((b, h, nq, d), dtype=np.float32).astype(dt)
    return tuple(cuda.to_device(x) for x in (q, k, v, do))


def _decode_call(cfg: dict, rng):
    """A decode configuration's call: every sequence fills its cache of Nk rows (contiguous, or
    paged with its pages shuffled in the pool), the reference kernel with the configuration's key
    block and splits.  The block table and lengths are checked on the host once, here, so the
    measured call makes the kernel launches and no copy of them."""
    import kernels
    from kernels.decode import plan

    dt = np.float16 if cfg["dtype"] == "fp16" else np.float32
    b, h, hkv = cfg["batch"], cfg["heads"], cfg["kv_heads"]
    nq, nk, d, page = cfg["seq_len_q"], cfg["seq_len_k"], cfg["head_dim"], cfg.get("page_size") or 0
    q = cuda.to_device(rng.standard_normal((b, h, nq, d), dtype=np.float32).astype(dt))
    if page:
        per = -(-nk // page)
        shape = (b * per, page, hkv, d)
        table = rng.permutation(b * per).reshape(b, per).astype(np.int32)
    else:
        shape, table = (b, hkv, nk, d), None
    k, v = (cuda.to_device(rng.standard_normal(shape, dtype=np.float32).astype(dt)) for _ in range(2))
    lens = np.full(b, nk, dtype=np.int32)
    plan(q, k, v, cache_seqlens=lens, block_table=table)  # bad input fails here, not under ncu
    return lambda: kernels.decode_attention(q, k, v, cache_seqlens=lens, block_table=table,
                                            num_splits=cfg["num_splits"], block_n=cfg["block_n"],
                                            impl="reference")


def make_call(cfg: dict, rng):
    """Prepare a configuration; return the zero-argument call to be measured."""
    # imported here, not at the top: analysis.calibrate imports this module for its marker
    # kernel, and the CPU-side tests that read calibrate's constants should not load the kernels
    import kernels

    if cfg["kernel"] == "decode":
        return _decode_call(cfg, rng)
    if cfg["kernel"] in TORCH_KERNELS:  # PyTorch's own attention (analysis/torch_set.py)
        return torch_call(cfg)
    q, k, v, do = _inputs(cfg, rng)
    if cfg["kernel"] in FAST_KERNELS:
        from .fast_set import make_call as fast_call

        return fast_call(cfg, q, k, v, do)
    causal = bool(cfg.get("causal"))
    if cfg["kernel"] == "flash2":
        t = tiling_of(cfg)
        kw = dict(causal=causal, block_m=t.block_m, block_n=t.block_n)
        if cfg["pass"] == "fwd":
            return lambda: kernels.flash_attention(q, k, v, **kw)
        o, lse = kernels.flash_attention(q, k, v, return_lse=True, **kw)
        return lambda: kernels.flash_attention_backward(q, k, v, o, lse, do, **kw)
    if cfg["kernel"] == "flash1":
        if cfg["pass"] != "fwd":
            raise ValueError("flash1 has a forward kernel only")
        return lambda: kernels.flash1_attention(q, k, v, causal=causal, sram_bytes=cfg["sram_bytes"])
    if cfg["kernel"] == "standard":
        kw = dict(causal=causal, gemm_block=cfg["gemm_block"])
        if cfg["pass"] == "fwd":
            return lambda: kernels.standard_attention(q, k, v, **kw)
        # The backward reads the forward's P (Algorithm 3); passing it keeps the measured call to
        # exactly the five backward launches the simulator models.
        o, _, p = kernels.standard_attention(q, k, v, return_intermediates=True, **kw)
        return lambda: kernels.standard_attention_backward(q, k, v, o, do, p=p, **kw)
    raise ValueError(f"kernel={cfg['kernel']!r}: unknown")


def _warm_up(cfg: dict, rng) -> None:
    """Compile the kernels this configuration uses by running it once at a small size."""
    group = cfg["heads"] // (cfg.get("kv_heads") or cfg["heads"])
    nk = cfg.get("seq_len_k") or cfg["seq_len_q"]
    small = dict(cfg, batch=1, heads=group, kv_heads=1, seq_len_q=min(cfg["seq_len_q"], 256), seq_len_k=min(nk, 256))
    if cfg["kernel"] == "decode":  # the same kernels (splits, pages, rows per block) on a short cache
        unit = max(cfg["block_n"], cfg.get("page_size") or 1)
        small.update(seq_len_q=cfg["seq_len_q"], seq_len_k=min(nk, cfg["num_splits"] * unit))
    make_call(small, rng)()
    cuda.synchronize()


def _configs(path: str) -> list[dict]:
    """The configurations file: a JSON list of objects (ValueError naming the file otherwise)."""
    try:
        with open(path) as f:
            configs = json.load(f)
    except OSError as e:
        raise ValueError(f"configs={path!r}: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"configs={path!r}: not JSON ({e})") from None
    if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
        raise ValueError(f"configs={path!r}: not a JSON list of configurations (objects)")
    return configs


def main(argv: list[str] | None = None) -> int:
    from flashsim.cmdline import ToolParser
    from flashsim.output import atomic_write
    from kernels.gpucheck import require_gpu

    ap = ToolParser(
        prog="python -m analysis.worker", description=__doc__.splitlines()[0],
        epilog="An internal entry point: flashsim measure runs it under Nsight Compute (ncu); run that instead.")
    ap.add_argument("configs", metavar="CONFIGS.json", help="a JSON list of configurations (analysis.configs)")
    ap.add_argument("manifest", metavar="MANIFEST.json", help="where to write the manifest (replaced if there)")
    ap.error = lambda message: ap.exit(2, f"flashsim: error: {message} (see 'python -m analysis.worker --help')\n")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if Path(a.manifest).is_dir():
            raise ValueError(f"manifest={a.manifest!r}: is a folder, not a file name")
        configs = _configs(a.configs)
        require_gpu("analysis.worker (the program ncu profiles)")
    except ValueError as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    manifest = []
    rng = np.random.default_rng(0)
    mark = cuda.to_device(np.zeros(1, dtype=np.int32))
    for i, cfg in enumerate(configs):
        _warm_up(cfg, rng)
        call = make_call(cfg, rng)
        cuda.synchronize()
        cuda.profile_start()
        t0 = time.perf_counter()
        call()
        cuda.synchronize()
        wall = time.perf_counter() - t0
        cuda.profile_stop()
        # The marker must be profiled to split launches: start, launch it, stop.
        cuda.profile_start()
        flashsim_marker[1, 1](mark, i)
        cuda.synchronize()
        cuda.profile_stop()
        manifest.append({"index": i, "id": config_id(cfg), "config": cfg, "wall_s": wall})
        print(f"[{i + 1}/{len(configs)}] {config_id(cfg)} {wall * 1e3:.2f} ms", file=sys.stderr, flush=True)
    atomic_write(a.manifest, lambda f: json.dump(manifest, f, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
