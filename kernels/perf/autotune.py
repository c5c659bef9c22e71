"""Adaptive tiling: block shapes of the fast kernels chosen per GPU, dtype, head dim, causal and N.

    python -m kernels.perf.autotune --dtypes fp16,bf16 --ds 64 128 --ns 1024 4096 16384 \
        [--causal both] [--passes fwd,bwd] [--top K] [--repeat R] [--out DIR] [--budget S]
        [--cache FILE] [--force] [--plan [--gpu PRESET]] [--merge FILE ...]

Tuned: the fp16 and bf16 tensor-core variants (:data:`TUNABLE`), forward and backward, the ones
``kernels.perf.BEST`` runs for each (pass, dtype, d).  fp32 keeps its ``default_config``.

**Candidates** (:func:`candidates`) are the knobs each version's kernel takes, nothing else:
``fwd_fp16_v3``/``v4`` Bc, warps nw and m-tiles mt (Br = 16·nw·mt) and qreg (Q's fragments in
registers); ``fwd_fp16_v5`` and ``fwd_fp16_v7`` Bc and nw (whole warpgroups: 4 or 8 warps, 64 rows
each; its
warpgroup products read a tile once for 64 rows, which the shared-memory term below takes as a
64-row warp tile); ``bwd_fp16_v1`` bq, bk, nw, mt and reg; ``bwd_fp16_v3`` bq, bk, nw, the m-tiles of
its three phases ma, mb, mc and minb (blocks per SM promised to ptxas), with ``bulkq`` and
``longest_first`` as its default takes them.  None of them has a
pipeline-depth knob: K/V (forward) and Q/dO (backward) are double-buffered by construction.  A
candidate is dropped when its dynamic shared memory exceeds the GPU's opt-in limit per block (the
kernels raise their limit past 48 KB: ``_launch.raise_smem_limit``), when ``bwd_fp16_v3``'s
``layout_v3`` refuses the warp split, or when the register arrays that are live at once (the
accumulators and fragments kept across the main loop plus the largest phase's tiles, a lower
bound) exceed the registers a thread may have (255, less under ``minb``'s launch bound).

**Model** (:func:`predict`), from flashsim's ``fast`` schedule of the variant with this block
shape: its closed-form bytes per tensor and its FLOPs (``flashsim.flops``: the products on the
variant's tiles, causal diagonal blocks whole).  HBM bytes: every tensor once where the re-read
tensors of the heads in flight (the first launch's SMs · blocks per SM over its blocks per head)
fit the preset's effective L2, else the schedule's bytes.  Time = max(max(tensor time, shared-
memory time) + CUDA-core time, HBM bytes / bandwidth), the peaks of
``flashsim.roofline.roofline_from_counts``, the tensor time scaled to the products the variant
computes (flashsim counts 2 forward, 5 backward; bwd_fp16_v1 computes 7).  Shared memory: a
warp's M x N tile of a product reads its B operand (N·k elements) and, unless A is held in
registers, A (M·k) by ldmatrix for 2·M·N·k FLOPs, at 128 bytes per SM per clock against 4,096
tensor FLOPs (sm_90).  Occupancy per launch: blocks per SM = the least of threads (2,048 / block
threads), blocks (32), shared memory ((opt-in limit + 1 KB) / (block's + 1 KB)) and registers
(65,536 / (threads · (the live-register lower bound + 32, rounded up to 8, capped by the launch
bound))); waves = ceil(grid / (SMs · blocks per SM)), the tail efficiency grid / (waves · SMs ·
blocks per SM) and the warp efficiency min(1, resident warps per SM / 8).  Predicted time = that
time / (tail · warp efficiency), the launches weighted by their share of the products
(bwd_fp16_v1: 4/7 dK/dV, 3/7 dQ).  Candidates are ranked by it (ties: fewer schedule bytes, then
the config's JSON); the top ``--top`` (default 4) are timed, and the default config too if the
model left it out (for the speedup).

**Timing** (on a GPU): each timed candidate is first checked against float64 (``kernels.bench``'s
checks: the forward on 32 sampled rows, the backward's gradients on the first head; tolerance
1e-2 fp16, 2e-2 bf16); one that fails or raises is dropped (never cached).  Then CUDA events,
3 untimed calls, the median of ``--repeat`` calls over three rotating input sets with the L2
flushed before each (``kernels.bench._time``).  Shapes: B·H = 16·16,384/N (H = 16), as the grid
of ``kernels.bench``.

**Key** (:func:`cache_key`): GPU name (numba's current device), variant, kernel version (a hash of
the device-code source files, :func:`kernel_version`), pass, dtype, d, causal, N bucket (the
next power of two of max(Nq, Nk), clipped to [512, 65,536]) and whether K/V have fewer heads
than Q (the backward's grid is over kv heads).  **Cache**: JSON at ``$FLASHSIM_TUNE_CACHE``, else
``~/.cache/flashsim/tune.json``; written to a temporary name, then renamed over the old file,
merged with the entries already there.  ``kernels.flash_attention`` and
``flash_attention_backward`` (impl "auto" or "fast") read it once per process and run the
cached config of a matching key, else the variant's ``default_config``; a corrupt or foreign
file is ignored with a warning.

Prints per key the candidates timed, the model's first choice, the timed best, their ratio,
the default's time and best/default (then each timed config: its model rank and time, its time
or error); writes ``DIR/autotune.csv`` (a row per timed config) with its ``.meta.json``
(provenance, the per-key summary) after every key, merges each key's best into the cache file
and ``DIR/tune.json`` as soon as it is timed, and ends with the line "model's first choice within
5% of the timed best on X of Y keys" (Y: the keys where some config passed).  ``--budget``
seconds: no key starts after it; the ones left are listed (and in the .meta.json).  A key where
every config fails, the default included, stops the run (the CUDA context may be unusable).
An ``--out`` that holds an earlier run's files is refused before any timing unless ``--force``.
``--plan``: the model's ranking only, no GPU (``--gpu`` preset, default h100).  ``--merge FILE
...``: merge cache files (several runs' ``DIR/tune.json``) into ``--cache``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import warnings
from functools import cache
from itertools import product
from pathlib import Path

from flashsim.cmdline import ToolParser

#: The variants the tuner knows: their knobs (:func:`knob_grid`) and resources (:func:`launches`).
TUNABLE = ("fwd_fp16_v3", "fwd_fp16_v4", "fwd_fp16_v5", "fwd_fp16_v7", "bwd_fp16_v1", "bwd_fp16_v3")
#: dtype as the CLI and the key name it -> numpy/torch name
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
PASSES = ("fwd", "bwd")
N_MIN, N_MAX = 512, 65536
FORMAT = "flashsim-tune-1"
#: resident warps per SM from which the model counts the tensor cores as fed (2 per sub-partition)
W_SAT = 8
REGISTERS_PER_SM = 65536
MAX_REGS = 255
#: registers a thread needs beyond its live arrays (addresses, indices, loop state), for occupancy
REG_OVERHEAD = 32
#: sm_90 (H100, H200): dense fp16/bf16 tensor-core FLOPs and shared-memory bytes per SM per clock
#: (the clock the model uses is the preset's fp16 rate / (SMs · TC_FLOP_PER_CLK))
TC_FLOP_PER_CLK = 4096
SMEM_BYTES_PER_CLK = 128
#: within this ratio of the timed best, the model's first choice counts as right
WITHIN = 1.05
#: the tensors of the fast schedules that are float32 whatever the inputs' dtype
FLOAT32_TENSORS = ("L", "D", "dQacc")


# --------------------------------------------------------------------------------------- keys


def _check_int(name: str, value, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}={value!r}: must be an integer >= {lo}")
    return value


def n_bucket(nq: int, nk: int | None = None) -> int:
    """The next power of two of max(Nq, Nk), clipped to [512, 65,536]."""
    n = max(_check_int("nq", nq), _check_int("nk", nq if nk is None else nk))
    return min(N_MAX, max(N_MIN, 1 << (n - 1).bit_length()))


def _dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: one of {', '.join(DTYPES)}")
    return dtype


def _pass(pass_: str) -> str:
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r}: one of {', '.join(PASSES)}")
    return pass_


def source_files(name: str) -> list[Path]:
    """The device code of variant ``name``: its module's file and the files of the
    ``kernels.perf`` modules it takes names from (``tc`` with both targets, ``tc_gpu`` and
    ``tc_sim``; ``_tiles``; ``_launch``), sorted."""
    import inspect

    from . import variant

    v = variant(name)
    here = Path(__file__).resolve().parent
    mods = set()
    for fn, _sig in v.SOURCES.values():
        mods.add(getattr(getattr(fn, "func", fn), "__module__", None))
    for mod_name in list(mods):
        mod = sys.modules[mod_name]
        for x in vars(mod).values():
            m = x.__name__ if inspect.ismodule(x) else getattr(x, "__module__", None)
            if isinstance(m, str) and m.startswith(__package__ + "."):
                mods.add(m)
    files = {here / (m.rsplit(".", 1)[1] + ".py") for m in mods if m}
    if here / "tc.py" in files:
        files |= {here / "tc_gpu.py", here / "tc_sim.py"}
    return sorted(files)


def hash_files(paths) -> str:
    """sha256 (first 16 hex digits) of the files' names and bytes, in the order given."""
    h = hashlib.sha256()
    for p in paths:
        p = Path(p)
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@cache
def kernel_version(name: str) -> str:
    """The kernel version of variant ``name`` in the cache key: :func:`hash_files` of its
    :func:`source_files` and its name, so that any change of its device code gives a new key."""
    return hash_files(source_files(name)) + "-" + name


def gpu_name() -> str:
    """The current device's name as numba reports it ("cudasim" under the simulator)."""
    from numba import cuda

    name = getattr(cuda.get_current_device(), "name", "cudasim")
    return name.decode() if isinstance(name, bytes) else str(name)


def cache_key(gpu: str, name: str, pass_: str, dtype: str, d: int, causal: bool, nq: int, nk: int,
              gqa: bool = False) -> str:
    """The cache's key of a call: ``gpu|variant|version|pass|dtype|d<d>|causal or full|n<bucket>|mha or gqa``."""
    if not isinstance(gpu, str) or not gpu:
        raise ValueError(f"gpu={gpu!r}: must be a non-empty string")
    if name not in TUNABLE:
        raise ValueError(f"variant={name!r}: one of {', '.join(TUNABLE)}")
    _check_int("d", d)
    return "|".join((gpu, name, kernel_version(name), _pass(pass_), _dtype(dtype), f"d{d}",
                     "causal" if causal else "full", f"n{n_bucket(nq, nk)}", "gqa" if gqa else "mha"))


# -------------------------------------------------------------------------------------- cache


def cache_path() -> Path:
    """``$FLASHSIM_TUNE_CACHE``, else ``~/.cache/flashsim/tune.json``."""
    env = os.environ.get("FLASHSIM_TUNE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "flashsim" / "tune.json"


def read_cache(path) -> dict:
    """The entries of the cache file at ``path`` ({} if there is none); a file that is not JSON,
    or not this format, is ignored with a warning."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        warnings.warn(f"flashsim tune cache {path}: unreadable ({e}); ignored", stacklevel=2)
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        warnings.warn(f"flashsim tune cache {path}: not JSON ({e}); ignored", stacklevel=2)
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        warnings.warn(f"flashsim tune cache {path}: not a {FORMAT} file; ignored", stacklevel=2)
        return {}
    return {k: e for k, e in data["entries"].items() if isinstance(e, dict) and isinstance(e.get("config"), dict)}


def write_cache(entries: dict, path) -> Path:
    """Merge ``entries`` into the cache file at ``path`` (the new ones win) and write it to a
    temporary name in the same folder, then rename it over the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a corrupt old file is replaced, not merged
        merged = read_cache(path)
    merged.update(entries)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "entries": merged}, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


_LOADED: dict = {}


def reset() -> None:
    """Forget the cache read by :func:`lookup` (the next lookup reads the file again)."""
    _LOADED.clear()


def _entries() -> dict:
    if "entries" not in _LOADED:
        _LOADED["entries"] = read_cache(cache_path())
    return _LOADED["entries"]


def lookup(pass_: str, name: str, dtype: str, d: int, causal: bool, nq: int, nk: int, gqa: bool = False):
    """The cached config of this call's key, or None (no file, no entry, not a tunable variant)."""
    entries = _entries()
    if not entries or name not in TUNABLE:
        return None
    if "gpu" not in _LOADED:
        try:
            _LOADED["gpu"] = gpu_name()
        except Exception as e:  # noqa: BLE001 - no device to key on: the defaults
            warnings.warn(f"flashsim tune cache: no GPU name ({e!r}); default configs", stacklevel=2)
            _LOADED["gpu"] = None
    if _LOADED["gpu"] is None:
        return None
    e = entries.get(cache_key(_LOADED["gpu"], name, pass_, dtype, d, causal, nq, nk, gqa))
    return None if e is None else dict(e["config"])


def tuned_config(pass_: str, mod, q, k, causal) -> dict:
    """The config ``kernels.flash_attention`` passes to variant ``mod`` for inputs q, k: the cached
    one of their key when the cache holds one whose keys are the variant's, else {} (its
    ``default_config``).  Never raises: a problem here leaves the default."""
    try:
        if not _entries() or getattr(mod, "name", None) not in TUNABLE:
            return {}
        import numpy as np

        from .._arrays import dtype_name

        if not isinstance(causal, (bool, np.bool_)):
            return {}  # the launcher says what is wrong with it
        causal = bool(causal)
        dt = {v: k_ for k_, v in DTYPES.items()}.get(dtype_name(q.dtype))
        if dt is None:
            return {}
        nb, nh, nq, d = (int(x) for x in q.shape)
        nhk, nk = int(k.shape[1]), int(k.shape[2])
        cfg = lookup(pass_, mod.name, dt, d, causal, nq, nk, nhk != nh)
        if cfg is None or not cfg or not set(cfg) <= set(mod.default_config(d)):
            return {}  # (a knob the entry leaves out keeps the variant's default)
        return {key: val for key, val in cfg.items() if key not in RULED}  # (an entry made before held lpt)
    except Exception as e:  # noqa: BLE001 - the tuner must never break an attention call
        warnings.warn(f"flashsim tune cache: lookup failed ({e!r}); default config", stacklevel=2)
        return {}


# --------------------------------------------------------------------------------- candidates

#: Knobs that ``flashsim.algorithms.fast.fit_to_grid`` sets by rule from B·H and the SM count
#: (fwd_fp16_v5/v7: ``lpt``, the causal block order; ``splits``, split-KV), which the cache key
#: does not hold: the tuner's candidates leave them out, and :func:`tuned_config` drops them from
#: a cached entry, since a knob the caller passes is one the rules leave alone.
RULED = ("lpt", "splits")


def knob_grid(name: str, d: int) -> list[dict]:
    """Every combination of the knob values tried for variant ``name`` at head dim ``d`` (before
    :func:`candidates` drops those that do not fit)."""
    if name in ("fwd_fp16_v3", "fwd_fp16_v4"):
        grid = product((16, 32, 64, 128), (2, 4, 8), (1, 2, 4), (True, False))
        return [dict(bc=bc, nw=nw, mt=mt, qreg=qr) for bc, nw, mt, qr in grid if 16 * nw * mt <= 256]
    if name in ("fwd_fp16_v5", "fwd_fp16_v7"):  # whole warpgroups of 64 rows; Q in shared memory (wgmma reads it)
        # lpt (the causal block order) and splits (split-KV) left out (RULED): a cached entry
        # leaves them to fit_to_grid's rules, which depend on B·H, not in the cache key
        return [dict(bc=bc, nw=nw, mt=1, qreg=False) for bc, nw in product((32, 48, 64, 96, 128, 160, 192), (4, 8))]
    if name == "bwd_fp16_v1":
        grid = product((16, 32, 64, 128), (16, 32, 64, 128), (2, 4, 8), (1, 2), (True, False))
        return [dict(bq=bq, bk=bk, nw=nw, mt=mt, reg=r) for bq, bk, nw, mt, r in grid if 16 * nw * mt <= 128]
    if name == "bwd_fp16_v3":
        grid = product((32, 64, 128), (64, 128), (4, 8), (1, 2, 4), (1, 2, 4), (1, 2, 4), (1, 2))
        from .bwd_fp16 import bulk_fits, default_config_v3

        # as the default: its Q/dO buffers, and dQ by bulk reductions where the default has them
        # and the tile fits beside the block's; causal key blocks longest first
        base = default_config_v3(d)
        q1, bulk = base["qbuf"], base["bulkq"]
        return [dict(bq=bq, bk=bk, nw=nw, ma=ma, mb=mb, mc=mc, minb=mi, bulkq=bulk and bulk_fits(d, bq, bk, q1),
                     longest_first=True, qbuf=q1) for bq, bk, nw, ma, mb, mc, mi in grid]
    raise ValueError(f"variant={name!r}: one of {', '.join(TUNABLE)}")


def _reg_cap(threads: int, minb: int) -> int:
    """Registers a thread may have under launch bounds (threads, minb): ptxas's budget."""
    return min(MAX_REGS, (REGISTERS_PER_SM // (threads * minb)) // 8 * 8)


def launches(name: str, d: int, cfg: dict) -> list[dict]:
    """The launches of variant ``name`` with config ``cfg`` as the model sees them: per launch
    threads, dynamic shared memory, the lower bound of live registers, the register cap, the
    grid as a function of (B, H, Hkv, Nq, Nk), and its share of the products.  ValueError when the
    warps cannot split the tiles (bwd_fp16_v3's ``layout_v3``)."""
    from ..flash2 import padded_head_dim
    from . import variant

    v = variant(name)
    dp = padded_head_dim(d)
    no, kt = dp // 8, dp // 16
    nt = 32 * cfg["nw"]
    if name in ("fwd_fp16_v3", "fwd_fp16_v4"):
        mt, br = cfg["mt"], 16 * cfg["nw"] * cfg["mt"]
        regs = 4 * no * mt + (4 * kt * mt if cfg["qreg"] else 4 * mt) + 4 * mt + 4 * (cfg["bc"] // 8) * mt
        return [dict(launch="fwd", threads=nt, smem=v.smem_bytes(dp, br, cfg["bc"]), regs=regs, cap=_reg_cap(nt, 1),
                     grid=lambda b, h, hk, nq, nk, br=br: -(-nq // br) * b * h, share=1.0)]
    if name in ("fwd_fp16_v5", "fwd_fp16_v7"):  # O (whole swizzle atoms) and S accumulators, P's fragments, stats
        br, bc = 16 * cfg["nw"], cfg["bc"]
        from .fwd_fp16 import atom_width

        regs = atom_width(d) // 2 + 4 * (bc // 8) + bc // 4 + 4
        return [dict(launch="fwd", threads=nt, smem=v.smem_bytes(dp, br, bc), regs=regs, cap=_reg_cap(nt, 1),
                     grid=lambda b, h, hk, nq, nk, br=br: -(-nq // br) * b * h, share=1.0)]
    if name == "bwd_fp16_v1":
        mt, rows = cfg["mt"], 16 * cfg["nw"] * cfg["mt"]
        frag = 4 * kt * mt if cfg["reg"] else 4 * mt
        r1 = 2 * 4 * no * mt + 2 * frag + 2 * 4 * (cfg["bq"] // 8) * mt
        r2 = 4 * no * mt + 2 * frag + 4 * mt + 2 * 4 * (cfg["bk"] // 8) * mt
        cap = _reg_cap(nt, 1)
        return [dict(launch="dkdv", threads=nt, smem=v.smem_bytes_dkdv(d, rows, cfg["bq"]), regs=r1, cap=cap,
                     grid=lambda b, h, hk, nq, nk: -(-nk // rows) * b * hk, share=4 / 7),
                dict(launch="dq", threads=nt, smem=v.smem_bytes_dq(d, rows, cfg["bk"]), regs=r2, cap=cap,
                     grid=lambda b, h, hk, nq, nk: -(-nq // rows) * b * h, share=3 / 7)]
    if name == "bwd_fp16_v3":
        lay = layout_for(d, cfg)
        ma, mb, mc = cfg["ma"], cfg["mb"], cfg["mc"]
        phase_a = 2 * 4 * ma * lay["na"] + 4 * ma + 2 * lay["na"]
        phase_b = 2 * 4 * mb + 4
        phase_c = 4 * mc + 4 * mc * lay["nc"]
        regs = 2 * 4 * mb * lay["nb"] + max(phase_a, phase_b, phase_c)
        bk = cfg["bk"]
        return [dict(launch="bwd", threads=nt, smem=v.smem_bytes(d, cfg["bq"], bk, cfg.get("bulkq", False),
                                                                 cfg.get("qbuf", 2)), regs=regs,
                     cap=_reg_cap(nt, cfg["minb"]), grid=lambda b, h, hk, nq, nk: -(-nk // bk) * b * hk, share=1.0)]
    raise ValueError(f"variant={name!r}: one of {', '.join(TUNABLE)}")


def products(name: str, d: int, cfg: dict) -> list[tuple[int, int, int, int]]:
    """The matrix products of a variant as (M, N, A from shared memory (1) or registers (0), how
    many such products): a warp's tile is M x N (16·m-tiles rows, N columns), its B operand (and
    A where it is not in registers) read from shared memory by ldmatrix at every k-step."""
    from ..flash2 import padded_head_dim

    dp = padded_head_dim(d)
    if name in ("fwd_fp16_v3", "fwd_fp16_v4"):
        m = 16 * cfg["mt"]
        return [(m, cfg["bc"], int(not cfg["qreg"]), 1), (m, dp, 0, 1)]  # S = Q Kᵀ, O += P V
    if name in ("fwd_fp16_v5", "fwd_fp16_v7"):  # a warpgroup's 64 rows read each operand tile once: Q and K, then V
        from .fwd_fp16 import atom_width

        return [(64, cfg["bc"], 1, 1), (64, atom_width(d), 0, 1)]  # P·V over V's whole atoms
    if name == "bwd_fp16_v1":
        m, a = 16 * cfg["mt"], int(not cfg["reg"])
        # dK/dV kernel: Sᵀ, dPᵀ (K, V as A), dV, dK (Pᵀ, dSᵀ from registers); dQ kernel: S, dP, dQ
        return [(m, cfg["bq"], a, 2), (m, dp, 0, 2), (m, cfg["bk"], a, 2), (m, dp, 0, 1)]
    if name == "bwd_fp16_v3":
        lay = layout_for(d, cfg)
        # phase A: Sᵀ, dPᵀ; B: dV, dK; C: dQ; every A operand from shared memory
        return [(16 * cfg["ma"], 8 * lay["na"], 1, 2), (16 * cfg["mb"], 8 * lay["nb"], 1, 2),
                (16 * cfg["mc"], 8 * lay["nc"], 1, 1)]
    raise ValueError(f"variant={name!r}: one of {', '.join(TUNABLE)}")


def layout_for(d: int, cfg: dict) -> dict:
    """bwd_fp16_v3's warp split of ``cfg`` (``layout_v3``; ValueError if the warps cannot split it)."""
    from . import variant

    return variant("bwd_fp16_v3").layout(d, cfg["bq"], cfg["bk"], cfg["nw"], cfg["ma"], cfg["mb"], cfg["mc"])


def blocks_per_sm(ln: dict, gpu) -> int:
    """Resident blocks of launch ``ln`` per SM (0: it does not fit): the least of the thread,
    block, shared-memory (1 KB reserved per block) and register limits."""
    regs = min(ln["cap"], -(-(ln["regs"] + REG_OVERHEAD) // 8) * 8)
    return min(gpu.max_threads_per_sm // ln["threads"], gpu.max_blocks_per_sm,
               (gpu.max_shared_bytes_per_block + 1024) // (ln["smem"] + 1024),
               REGISTERS_PER_SM // (ln["threads"] * regs))


def _hardware(gpu):
    """A flashsim Hardware: ``gpu`` itself, or the preset it names."""
    from flashsim.config import Hardware, get_gpu

    return gpu if isinstance(gpu, Hardware) else get_gpu(gpu)


def candidates(name: str, d: int, gpu="h100") -> tuple[list[dict], list[tuple[dict, str]]]:
    """(kept, dropped): the configs of :func:`knob_grid` that fit ``gpu`` (a flashsim preset name
    or Hardware), and the others with the reason."""
    g = _hardware(gpu)
    kept, dropped = [], []
    for cfg in knob_grid(name, d):
        try:
            lns = launches(name, d, cfg)
        except ValueError as e:
            dropped.append((cfg, f"layout: {e}"))
            continue
        why = None
        for ln in lns:
            if ln["smem"] > g.max_shared_bytes_per_block:
                why = f"shared memory: {ln['launch']} {ln['smem']} > {g.max_shared_bytes_per_block} bytes"
            elif ln["regs"] > ln["cap"]:
                why = f"registers: {ln['launch']} at least {ln['regs']} live > {ln['cap']}"
            elif blocks_per_sm(ln, g) < 1:
                why = f"occupancy: {ln['launch']} fits no block on an SM"
            if why:
                break
        (dropped.append((cfg, why)) if why else kept.append(cfg))
    return kept, dropped


# -------------------------------------------------------------------------------------- model


#: The schedule flashsim models for a variant (fwd_fp16_v3 has v4's tiles, loads and stores).
SIM_NAMES = {"fwd_fp16_v3": "fwd_fp16_v4"}


def predict(name: str, shape: dict, cfg: dict, gpu="h100") -> dict:
    """The model's time of variant ``name`` with config ``cfg`` on ``shape`` (a dict with pass,
    dtype, d, causal, n, nk, batch, heads, kv_heads): ``time_s`` and its parts."""
    from flashsim.api import closed_form_elements
    from flashsim.config import STAT_BYTES, Workload
    from flashsim.flops import flops
    from flashsim.roofline import roofline_from_counts

    g = _hardware(gpu)
    w = Workload(batch=shape["batch"], heads=shape["heads"], kv_heads=shape["kv_heads"], seq_len_q=shape["n"],
                 seq_len_k=shape["nk"], head_dim=shape["d"], dtype=shape["dtype"], causal=shape["causal"])
    sim = SIM_NAMES.get(name, name)
    el = closed_form_elements(w, "fast", shape["pass"], kernel=sim, config=cfg)
    size = {"L": w.bh * w.nq, "D": w.bh * w.nq, "K": w.batch * w.hkv * w.nk * w.d}
    size.update(dict.fromkeys(("V", "dK", "dV"), size["K"]))

    def nbytes(t, n):
        return n * (STAT_BYTES if t in FLOAT32_TENSORS else w.elem_bytes)

    sched = sum(nbytes(t, n) for (t, _), n in el.items())
    once = sum(nbytes(t, min(n, size.get(t, w.bh * w.nq * w.d))) for (t, _), n in el.items())
    reread = sum(nbytes(t, size.get(t, w.bh * w.nq * w.d)) for t in {t for (t, _), n in el.items()
                                                                      if n > size.get(t, w.bh * w.nq * w.d)})
    lns = launches(name, shape["d"], cfg)
    grids = [ln["grid"](w.batch, w.heads, w.hkv, w.nq, w.nk) for ln in lns]
    bps = [blocks_per_sm(ln, g) for ln in lns]
    units = w.bh if shape["pass"] == "fwd" else w.batch * w.hkv  # heads the first launch's grid covers
    in_flight = min(units, -(-g.num_sms * bps[0] // max(1, grids[0] // units)))
    fits = in_flight * reread / units <= g.l2_effective_bytes
    hbm = once if fits else sched
    f = flops(w, shape["pass"], algo="fast", kernel=sim, config=cfg)
    roof = roofline_from_counts(f["matmul"], f["nonmatmul"], hbm, g, shape["dtype"])
    # flashsim counts 2 products (forward) or 5 (backward); bwd_fp16_v1 computes 7.  Shared memory:
    # a warp tile M x N over k reads N·k (B) and, where A is not in registers, M·k elements for
    # 2·M·N·k FLOPs, so bytes = FLOPs · (N + M·a) / (M·N).
    prods = products(name, shape["d"], cfg)
    per_product = f["matmul"] / (2 if shape["pass"] == "fwd" else 5)
    matmul_s = roof["matmul_s"] * sum(k for *_, k in prods) / (2 if shape["pass"] == "fwd" else 5)
    smem_bytes = sum(k * per_product * (n + m * a) / (m * n) for m, n, a, k in prods)
    smem_s = smem_bytes * TC_FLOP_PER_CLK / (SMEM_BYTES_PER_CLK * g.matmul_flops[shape["dtype"]])
    compute_s = max(matmul_s, smem_s) + roof["nonmatmul_s"]
    base = max(compute_s, roof["memory_s"])
    slow, per = 0.0, []
    for ln, grid, b in zip(lns, grids, bps):
        slots = g.num_sms * b
        waves = -(-grid // slots)
        tail = grid / (waves * slots)
        warps = ln["threads"] // 32 * min(b, -(-grid // g.num_sms))
        eff = tail * min(1.0, warps / W_SAT)
        slow += ln["share"] / eff
        per.append(dict(launch=ln["launch"], grid=grid, blocks_per_sm=b, waves=waves, tail=tail, eff=eff))
    bound = "memory" if roof["memory_s"] >= compute_s else ("shared" if smem_s > matmul_s else "compute")
    return dict(time_s=base * slow, roofline_s=roof["time_s"], smem_s=smem_s, bound=bound, hbm_bytes=hbm,
                schedule_bytes=sched, l2_fits=fits, launches=per)


def _cfg_text(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True)


def rank(name: str, shape: dict, cfgs: list[dict], gpu="h100") -> list[tuple[float, dict]]:
    """(predicted seconds, config) of every config, fastest first; ties go to fewer schedule bytes
    (what the SMs move through L2), then to the config's JSON."""
    scored = []
    for c in cfgs:
        p = predict(name, shape, c, gpu)
        scored.append((p["time_s"], p["schedule_bytes"], _cfg_text(c), c))
    return [(x[0], x[3]) for x in sorted(scored, key=lambda x: x[:3])]


# --------------------------------------------------------------------------------- the tuning


def tune_key(ranked: list[tuple[float, dict]], default: dict, measure, top: int = 4) -> dict:
    """Time the model's ``top`` configs (and ``default`` if they leave it out) with
    ``measure(cfg) -> (ms, rel_err)`` (which raises for a config that fails its check).

    Returns ``timed`` (a record per config: model rank, predicted ms, ms or error), ``first`` (the
    model's first choice's record), ``best`` (the fastest that passed, None if none did),
    ``default``, ``ratio`` (first's ms / best's, inf if first failed) and ``within`` (ratio <=
    1.05)."""
    _check_int("top", top)
    if not ranked:
        raise ValueError("ranked: no candidate")
    order = {_cfg_text(c): i for i, (_, c) in enumerate(ranked)}
    pick = [c for _, c in ranked[:top]]
    if _cfg_text(default) not in {_cfg_text(c) for c in pick}:
        pick.append(default)
    pred = {_cfg_text(c): t for t, c in ranked}
    timed = []
    for cfg in pick:
        key = _cfg_text(cfg)
        rec = dict(config=cfg, model_rank=order.get(key, -1) + 1,
                   model_ms=pred[key] * 1e3 if key in pred else float("nan"), default=key == _cfg_text(default))
        try:
            ms, err = measure(cfg)
            rec.update(ms=float(ms), rel_err=float(err))
        except Exception as e:  # noqa: BLE001 - a failing candidate is dropped, the others go on
            rec["error"] = repr(e)[:300]
        timed.append(rec)
    ok = [r for r in timed if "ms" in r]
    best = min(ok, key=lambda r: (r["ms"], _cfg_text(r["config"]))) if ok else None
    first = timed[0]
    ratio = first["ms"] / best["ms"] if best is not None and "ms" in first else math.inf
    dflt = next(r for r in timed if r["default"])
    return dict(timed=timed, first=first, best=best, default=dflt, ratio=ratio, within=ratio <= WITHIN)


def summary(results: list[dict]) -> tuple[int, int]:
    """(keys where the model's first choice was within 5% of the timed best, keys with a best)."""
    keyed = [r for r in results if r["best"] is not None]
    return sum(r["within"] for r in keyed), len(keyed)


def summary_line(results: list[dict]) -> str:
    x, y = summary(results)
    return f"model's first choice within 5% of the timed best on {x} of {y} keys"


def keys(dtypes, ds, ns, causals, passes=PASSES) -> list[dict]:
    """The shapes to tune, as ``kernels.bench``'s grid (B·H = 16·16,384/N, H = 16): for each pass,
    d, causal, dtype and N, in that order (N innermost: a config's compiled kernel serves every N)."""
    from ..bench import grid_shapes

    out = []
    for pass_ in passes:
        for d in ds:
            for causal in causals:
                for dtype in dtypes:
                    for sh in grid_shapes(ns=tuple(ns), ds=(d,), causals=(causal,)):
                        out.append(dict(sh, dtype=dtype, **{"pass": pass_}))
    return out


def _variant_for(shape: dict):
    """The variant ``kernels.flash_attention`` runs for the shape (kernels.perf.best), or a
    ValueError when it is not one the tuner knows."""
    from . import best

    v = best(shape["pass"], DTYPES[_dtype(shape["dtype"])], shape["d"])
    if v is None or v.name not in TUNABLE:
        raise ValueError(f"d={shape['d']}: no tunable fast {shape['pass']} kernel for {shape['dtype']} "
                         f"(the tensor-core kernels take d % 8 == 0 up to 256)")
    return v


def _label(shape: dict) -> str:
    from ..bench import tag

    return tag(dict(shape, config=None))


def _gpu_measure(torch, v, shape, flush, repeat, rng):
    """``measure(cfg)`` of :func:`tune_key` on the GPU for variant ``v`` and ``shape``: checked
    against float64, then timed (:func:`kernels.bench._time`)."""
    from ..bench import _check_fwd, _time, _tolerance, bwd_error

    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[shape["dtype"]]
    b, h, hk, n, nk, d, c = (shape[x] for x in ("batch", "heads", "kv_heads", "n", "nk", "d", "causal"))
    tol = _tolerance(shape["dtype"])
    sets = [tuple(torch.randn(*s, device="cuda", dtype=tdt) for s in ((b, h, n, d), (b, hk, nk, d), (b, hk, nk, d)))
            for _ in range(3)]
    if shape["pass"] == "bwd":
        sets = [(q, k, vv, *v.saved_forward(q, k, vv, causal=c), torch.randn_like(q)) for q, k, vv in sets]

    def measure(cfg):
        if shape["pass"] == "fwd":
            def fn(q, k, vv):
                return v.forward(q, k, vv, causal=c, **cfg)
            q, k, vv = sets[0]
            err = _check_fwd(torch, fn(q, k, vv), q, k, vv, c, rng)
        else:
            def fn(q, k, vv, o, lse, do):
                return v.backward(q, k, vv, o, lse, do, causal=c, **cfg)
            q, k, vv, _, _, do = sets[0]
            err = bwd_error(torch, fn(*sets[0]), q, k, vv, do, c)
        if not err < tol:
            raise AssertionError(f"failed the check against float64: rel err {err:.2e}")
        ms, _ = _time(torch, fn, sets, repeat, flush)
        return ms, err

    return measure


def _preset_for(name: str) -> str:
    """The flashsim preset of a GPU name (h100 if none matches, with a warning)."""
    from flashsim.config import preset_of

    preset = preset_of(name)
    if preset is None:
        warnings.warn(f"GPU {name!r}: no flashsim preset; the model uses the H100's", stacklevel=2)
        return "h100"
    return preset


def _row(shape, v, key, rec, res) -> dict:
    out = {"key": key, "pass": shape["pass"], "dtype": shape["dtype"], "d": shape["d"], "causal": shape["causal"],
           "n": shape["n"], "batch": shape["batch"], "heads": shape["heads"], "variant": v.name,
           "config": _cfg_text(rec["config"]), "model_rank": rec["model_rank"], "model_ms": rec["model_ms"],
           "default": rec["default"], "best": res["best"] is rec}
    out.update({k: rec[k] for k in ("ms", "rel_err", "error") if k in rec})
    return out


def _fmt(x, spec="8.3f") -> str:
    return format(x, spec) if isinstance(x, float) and math.isfinite(x) else "-"


def _key_line(label: str, res: dict, n_cands: int) -> str:
    first, best, dflt = res["first"], res["best"], res["default"]
    fm = first.get("ms", math.nan)
    bm = best["ms"] if best else math.nan
    dm = dflt.get("ms", math.nan)
    return (f"{label:34s} {len(res['timed']):2d}/{n_cands:<4d} first {_cfg_text(first['config'])} {_fmt(fm)} ms  "
            f"best {_cfg_text(best['config']) if best else '-'} {_fmt(bm)} ms  "
            f"first/best {_fmt(res['ratio'], '5.3f')}  "
            f"default {_fmt(dm)} ms  best/default x{_fmt(dm / bm if best else math.nan, '5.3f')}")


def main(argv=None) -> int:
    ap = ToolParser(prog="python -m kernels.perf.autotune", description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp16,bf16", help="comma-separated, of fp16, bf16")
    ap.add_argument("--ds", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--ns", nargs="+", type=int, default=[1024, 4096, 16384])
    ap.add_argument("--causal", default="both", choices=["no", "yes", "both"])
    ap.add_argument("--passes", default="fwd,bwd", help="comma-separated, of fwd, bwd")
    ap.add_argument("--top", type=int, default=4, help="configs timed per key, best by the model first")
    ap.add_argument("--repeat", type=int, default=10, help="timed calls per config (their median)")
    ap.add_argument("--budget", type=float, default=None, help="seconds: start no key after this")
    ap.add_argument("--out", default=None, help="folder for autotune.csv, .meta.json and tune.json")
    ap.add_argument("--cache", default=None, help="cache file to merge into (default $FLASHSIM_TUNE_CACHE "
                                                   "or ~/.cache/flashsim/tune.json)")
    ap.add_argument("--plan", action="store_true", help="print the model's ranking only (no GPU)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="FILE",
                    help="merge these cache files (e.g. several runs' DIR/tune.json) into --cache and exit")
    ap.add_argument("--gpu", default="h100", help="flashsim GPU preset of --plan's model")
    ap.add_argument("--force", action="store_true",
                    help="overwrite an earlier run's files in --out (refused without it)")
    args = ap.parse_args(argv)
    if args.merge:
        try:
            n = merge(args.merge, args.cache or cache_path())
        except ValueError as e:
            print(f"flashsim: error: {e}", file=sys.stderr)
            return 2
        print(f"merged {n} entries into {args.cache or cache_path()}")
        return 0
    try:
        dtypes = [_dtype(t.strip()) for t in args.dtypes.split(",") if t.strip()]
        passes = [_pass(p.strip()) for p in args.passes.split(",") if p.strip()]
        if not dtypes or not passes:
            raise ValueError(f"dtypes={args.dtypes!r}, passes={args.passes!r}: name at least one of each")
        for n in args.ns:
            _check_int("n", n)
        _check_int("top", args.top)
        _check_int("repeat", args.repeat)
        if args.budget is not None and not args.budget >= 0:
            raise ValueError(f"budget={args.budget}: must be >= 0 seconds")
        causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
        todo = keys(dtypes, args.ds, args.ns, causals, passes)
        for shape in todo:
            _check_int("d", shape["d"])
            _variant_for(shape)
        if args.plan:
            from flashsim.config import get_gpu

            get_gpu(args.gpu)
        elif args.out:  # before any timing: a refusal comes first, not last
            from flashsim.output import check_overwrite

            check_overwrite(args.out, ("autotune.csv", "autotune.meta.json", "tune.json"), args.force,
                            "an earlier tuning run")
    except ValueError as e:
        hint = "; --force overwrites it" if "earlier tuning run" in str(e) else ""
        print(f"flashsim: error: {e}{hint}", file=sys.stderr)
        return 2
    if args.plan:
        return _plan(todo, args.top, args.gpu)
    from ..bench import cuda_torch

    try:
        torch = cuda_torch("the timing needs it")
    except ValueError as e:
        print(f"flashsim: error: {e}", file=sys.stderr)
        return 2
    return _tune(torch, todo, args, argv)


def _plan(todo, top, gpu) -> int:
    for shape in todo:
        v = _variant_for(shape)
        kept, dropped = candidates(v.name, shape["d"], gpu)
        ranked = rank(v.name, shape, kept, gpu)
        dflt = _cfg_text(v.default_config(shape["d"]))
        where = next((i + 1 for i, (_, c) in enumerate(ranked) if _cfg_text(c) == dflt), None)
        print(f"{_label(shape)} {v.name}: {len(kept)} candidates ({len(dropped)} dropped), default ranked {where}")
        for t, c in ranked[:top]:
            print(f"    {t * 1e3:8.3f} ms  {_cfg_text(c)}")
    return 0


def _tune(torch, todo, args, argv) -> int:
    import numpy as np

    from ..bench import write

    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = gpu_name()
    preset = _preset_for(gpu)
    rng = np.random.default_rng(0)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    rows, results, entries, keyinfo = [], [], {}, []
    meta = {}
    if args.out:
        from ..gpucheck import provenance

        meta = dict(provenance(), torch=torch.__version__, method=__doc__, tf32="off", preset=preset,
                    top=args.top, repeat=args.repeat, argv=list(sys.argv[1:] if argv is None else argv))
    out = Path(args.out) if args.out else None
    start = time.monotonic()
    print(f"GPU {gpu} (model: flashsim preset {preset}); columns: timed/candidates, the model's first choice, "
          "the timed best, first/best, the default, best/default", flush=True)
    for i, shape in enumerate(todo):
        if args.budget is not None and time.monotonic() - start > args.budget:
            left = [_label(s) for s in todo[i:]]
            print(f"budget of {args.budget:.0f} s spent: {len(left)} keys not run: {' '.join(left)}")
            meta["not_run"] = left
            break
        v = _variant_for(shape)
        key = cache_key(gpu, v.name, shape["pass"], shape["dtype"], shape["d"], shape["causal"], shape["n"],
                        shape["nk"], shape["kv_heads"] != shape["heads"])
        kept, _ = candidates(v.name, shape["d"], preset)
        ranked = rank(v.name, shape, kept, preset)
        try:
            measure = _gpu_measure(torch, v, shape, flush, args.repeat, rng)
            res = tune_key(ranked, v.default_config(shape["d"]), measure, args.top)
        except Exception as e:  # noqa: BLE001 - inputs or the saved forward failed: stop, keep what ran
            meta["stopped"] = f"{_label(shape)}: {e!r}"[:500]
            print(f"stopping at {_label(shape)}: setting up its inputs failed: {e!r}"[:500], flush=True)
            break
        finally:
            measure = None
            torch.cuda.empty_cache()
        results.append(res)
        rows += [_row(shape, v, key, rec, res) for rec in res["timed"]]
        print(_key_line(_label(shape), res, len(kept)), flush=True)
        for rec in res["timed"]:
            got = f"{rec['ms']:8.3f} ms" if "ms" in rec else rec["error"][:160]
            print(f"    model #{rec['model_rank']:<3d} {_fmt(rec['model_ms'])} ms  {_cfg_text(rec['config'])}  {got}")
        info = dict(key=key, label=_label(shape), candidates=len(kept), timed=len(res["timed"]),
                    first=_cfg_text(res["first"]["config"]), ratio=res["ratio"], within=res["within"])
        if res["best"] is not None:
            b = res["best"]
            entry = dict(config=b["config"], ms=b["ms"], default_ms=res["default"].get("ms"), shape=_label(shape),
                         date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            entries[key] = entry
            info.update(best=_cfg_text(b["config"]), best_ms=b["ms"], default_ms=res["default"].get("ms"))
            write_cache({key: entry}, args.cache or cache_path())  # after every key: a run cut short keeps it
            if out is not None:
                write_cache({key: entry}, out / "tune.json")
        keyinfo.append(info)
        if out is not None:
            meta.update(keys=keyinfo, summary=summary_line(results))
            write(out / "autotune.csv", rows, meta)
        if res["best"] is None:  # the default failed too: most likely the CUDA context is gone
            meta["stopped"] = f"{_label(shape)}: every config failed, the default included"
            print(f"stopping at {_label(shape)}: every config failed, the default included", flush=True)
            break
    line = summary_line(results)
    print(line)
    if entries:
        print(f"wrote {len(entries)} entries to {args.cache or cache_path()}"
              + (f" and {out / 'tune.json'}" if out is not None else ""))
    if out is not None:
        meta.update(keys=keyinfo, summary=line)
        write(out / "autotune.csv", rows, meta)
        print(f"wrote {out / 'autotune.csv'}")
    return 0


def merge(paths, into) -> int:
    """Merge the entries of the cache files ``paths`` (in order: a later file's entry wins) into
    the cache file ``into``; returns how many entries were merged."""
    entries = {}
    for p in paths:
        if not Path(p).is_file():
            raise ValueError(f"merge: {p}: no such file")
        entries.update(read_cache(p))
    write_cache(entries, into)
    return len(entries)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
