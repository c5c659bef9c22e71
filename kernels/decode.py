"""Decoding against a KV cache: split-KV (flash-decoding) with a combine, paged KV through a block
table, variable-length batches, GQA packing and sliding windows; the readable reference kernel.

The schedule (the one ``flashsim.algorithms.decode`` walks; with ``count=True`` the kernels add
every tile transfer to the traffic counters, in elements, and the totals equal its formulas):

* Workload: batch B, Hq query heads, Hkv kv heads (g = Hq/Hkv), Nq query rows per sequence, head
  dim d, cache lengths L_b (Nq <= L_b <= Nk_max).  Query row i of sequence b sits at position
  pos = L_b - Nq + i and sees keys j <= pos (causal, bottom-right); with a window (left, right)
  also pos - left <= j <= pos + right (left or right < 0: unbounded on that side).
* Main launch, grid (S, B·Hkv): one thread block per (split s, sequence b, kv head h), holding
  the g·Nq query rows of kv head h (GQA packing: K and V are read once for the g query heads).
  Visible keys lo_b = max(0, L_b - Nq - left) with a window (else 0) .. hi_b = L_b; key blocks
  j = lo_b//Bc .. (hi_b-1)//Bc (nblk_b of them); bps_b = ceil(nblk_b/S); split s takes blocks
  [s·bps_b, min(nblk_b, (s+1)·bps_b)) of that list, maybe none.
* Every block, an empty split's too, first reads its sequence's length L_b: one int32 of the
  lengths (tensor Lens), loaded by thread 0 into shared memory for the others.
* Reads of a block with at least one key block: Q (g·Nq·d) once; per key block j, K rows
  [j·Bc, min((j+1)·Bc, L_b)) x d and V the same (rows before lo_b are read and masked); paged,
  per key block the block-table entries of pages (j·Bc)//P .. (min((j+1)·Bc, L_b)-1)//P, one int32
  each (tensor BT).  An empty split reads nothing more.
* Writes: S = 1: O (g·Nq·d) and L (float32 logsumexp, g·Nq), no second launch.  S > 1: every
  block, empty ones too (zeros and -inf), writes Op (float32, g·Nq·d) and Lp (float32, g·Nq);
  then the combine launch, one block per (b, query head, query row), reads the S values of Lp and
  the S·d of Op and writes O (d) and L (1) (no length).

Layouts: lengths (B,) int32; Q, O (B, Hq, Nq, d); contiguous K, V (B, Hkv, Nk_max, d); paged K,
V (num_pages, P, Hkv, d) with a block table (B, max_pages_per_seq) int32 (vLLM's and
flash-attention's ``k_cache``); Op (S, B, Hq, Nq, d), Lp (S, B, Hq, Nq), L (B, Hq, Nq).

Precisions: float32, float16 and bfloat16.  Numba has no bfloat16 arrays, so a bf16 tensor is
viewed as int16 (its bits) and the kernels widen each element to float32 themselves (the 16 bits
shifted to the top of a float32 word) and round the output back to bf16 (to nearest even).  The
bit casts are ``libdevice.int_as_float``/``float_as_int`` on the GPU and numpy views under the
CUDA simulator (its libdevice functions are stubs).

Threads (readable first; ``kernels/perf/decode.py`` is the fast one): 128 per block, element-
strided loops as in ``kernels/flash2.py``; Q, K_j, V_j tiles in shared memory in the input
precision, scores, accumulators and row statistics in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
from numba import config, cuda, float32, int16, int32, types

from ._bf16 import cvt_bf16, cvt_plain, ld_bf16, ld_plain  # bf16 through its bits
from .counters import INDEX, READ, WRITE, device_counters

SIM = bool(config.ENABLE_CUDASIM)
#: Static shared memory one block may use without opting in (bytes).
SMEM_LIMIT = 48 * 1024
NT = 128
#: Most splits a call may ask for (the combine keeps one weight per split in shared memory).
MAX_SPLITS = 256
NEG_INF = float32(-math.inf)
ZERO = float32(0.0)
DTYPES = ("fp32", "fp16", "bf16")
_ST = {"fp32": float32, "fp16": types.float16, "bf16": int16}
_EB = {"fp32": 4, "fp16": 2, "bf16": 2}

IQ, IK, IV, IO, IL = INDEX["Q"], INDEX["K"], INDEX["V"], INDEX["O"], INDEX["L"]
IOP, ILP, IBT, ILENS = INDEX["Op"], INDEX["Lp"], INDEX["BT"], INDEX["Lens"]

def loader(dt: str):
    return ld_bf16 if dt == "bf16" else ld_plain


def storer(dt: str):
    return cvt_bf16 if dt == "bf16" else cvt_plain


def padded_head_dim(d: int) -> int:
    return -(-d // 16) * 16


def smem_bytes(dt: str, d: int, rows: int, bc: int, page_size: int) -> int:
    """Static shared memory of the reference main kernel: Q (rows x DP), K_j and V_j (Bc x DP+pad)
    in the input precision; S (rows x Bc+1), acc (rows x DP), m, l, alpha in float32; the page
    numbers of one key block; the sequence's length."""
    dp = padded_head_dim(d)
    eb = _EB[dt]
    kp = dp + 4 // eb
    pages = bc // page_size + 2 if page_size else 1
    return eb * (rows * dp + 2 * bc * kp) + 4 * (rows * (bc + 1) + rows * dp + 3 * rows + pages + 1)


def default_block_n(dt: str, d: int, rows: int, page_size: int = 0) -> int:
    """The key block Bc of the reference kernel: the largest of 64, 32, 16, 8 that fits 48 KB."""
    for bc in (64, 32, 16, 8):
        if smem_bytes(dt, d, rows, bc, page_size) <= SMEM_LIMIT:
            return bc
    raise ValueError(f"head_dim={d}, rows={rows} (query heads per kv head x Nq): too large for "
                     f"{SMEM_LIMIT} bytes of shared memory even with Bc = 8")


# ---------------------------------------------------------------------------------------------
# The schedule's ranges, shared by the kernels (inlined) and the host (counters, checks).


def visible_blocks(length: int, nq: int, bc: int, left: int) -> tuple[int, int]:
    """(first key block, number of key blocks) a sequence of cache length ``length`` reads."""
    lo = max(0, length - nq - left) if left >= 0 else 0
    j0 = lo // bc
    return j0, (length - 1) // bc - j0 + 1


def split_blocks(nblk: int, splits: int, s: int) -> tuple[int, int]:
    """[first, end) of the key blocks (indices into the sequence's visible list) split s takes."""
    bps = -(-nblk // splits)
    return min(nblk, s * bps), min(nblk, (s + 1) * bps)


def expected_counts(lengths, *, heads: int, kv_heads: int, nq: int, d: int, bc: int, splits: int = 1,
                    page_size: int = 0, window=None) -> dict[tuple[str, str], int]:
    """The schedule's element counts per (tensor, direction), from the formulas alone (the
    module docstring): what the counting kernels must add up to."""
    g = heads // kv_heads
    left = -1 if window is None else int(window[0])
    c: dict[tuple[str, str], int] = {}

    def add(key, n):
        if n:
            c[key] = c.get(key, 0) + int(n)

    for length in (int(x) for x in lengths):
        j0, nblk = visible_blocks(length, nq, bc, left)
        for s in range(splits):
            a, e = split_blocks(nblk, splits, s)
            add(("Lens", "read"), kv_heads)  # every block (s, b, h) reads L_b, an empty split's too
            if e > a:
                add(("Q", "read"), kv_heads * g * nq * d)
            for jj in range(a, e):
                j = j0 + jj
                rows = min((j + 1) * bc, length) - j * bc
                add(("K", "read"), kv_heads * rows * d)
                add(("V", "read"), kv_heads * rows * d)
                if page_size:
                    add(("BT", "read"), kv_heads * ((min((j + 1) * bc, length) - 1) // page_size
                                                     - (j * bc) // page_size + 1))
            if splits > 1:
                add(("Op", "write"), kv_heads * g * nq * d)
                add(("Lp", "write"), kv_heads * g * nq)
        if splits == 1:
            add(("O", "write"), heads * nq * d)
            add(("L", "write"), heads * nq)
        else:
            add(("Lp", "read"), heads * nq * splits)
            add(("Op", "read"), heads * nq * splits * d)
            add(("O", "write"), heads * nq * d)
            add(("L", "write"), heads * nq)
    return dict(sorted(c.items()))


# ---------------------------------------------------------------------------------------------
# Kernel sources.  Compile-time: the precision, DP, Bc, G (query heads per kv head), NQ, whether
# paged, split (S > 1), windowed, causal, counting.


def _main_source(dt, DP, BC, G, NQ, PAGED, SPLIT, WINDOW, CAUSAL, COUNT, PSZ):
    ST = _ST[dt]
    LD = loader(dt)
    CV = storer(dt)
    ROWS = G * NQ
    KP = DP + 4 // _EB[dt]
    SC = BC + 1
    NPG = BC // PSZ + 2 if PAGED else 1  # pages one key block can touch

    def decode_main(q, k, v, bt, lens, o, lse, op, lp, scale, wl, wr, counters):
        # Grid (S, B·Hkv): block (s, b·Hkv + h) runs split s of kv head h of sequence b for the
        # G·NQ query rows of its query heads h·G .. h·G + G - 1 (packed row r: head h·G + r // NQ,
        # query row r % NQ).
        s = cuda.blockIdx.x
        nsplit = cuda.gridDim.x
        bh = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        hkv = v.shape[2] if PAGED else v.shape[1]
        b = bh // hkv
        h = bh % hkv
        d = q.shape[3]
        sLen = cuda.shared.array(1, int32)
        if tid == 0:  # one load of the length per block (not one per warp), shared with the others
            sLen[0] = lens[b]
            if COUNT:
                cuda.atomic.add(counters, (ILENS, READ), 1)
        cuda.syncthreads()
        length = sLen[0]
        lo = max(0, length - NQ - wl) if WINDOW and wl >= 0 else 0
        j0 = lo // BC
        nblk = (length - 1) // BC - j0 + 1
        bps = (nblk + nsplit - 1) // nsplit
        a = min(nblk, s * bps)
        e = min(nblk, (s + 1) * bps)
        sQ = cuda.shared.array((ROWS, DP), ST)
        sK = cuda.shared.array((BC, KP), ST)
        sV = cuda.shared.array((BC, KP), ST)
        sS = cuda.shared.array((ROWS, SC), float32)
        sAcc = cuda.shared.array((ROWS, DP), float32)
        sM = cuda.shared.array(ROWS, float32)
        sL = cuda.shared.array(ROWS, float32)
        sAlpha = cuda.shared.array(ROWS, float32)
        sPage = cuda.shared.array(NPG, int32)

        for r in range(tid, ROWS, NT):
            sM[r] = NEG_INF
            sL[r] = ZERO
        for x in range(tid, ROWS * DP, NT):
            sAcc[x // DP, x % DP] = ZERO
        if e > a:
            for x in range(tid, ROWS * DP, NT):
                r = x // DP
                c = x % DP
                if c < d:  # (the padding columns past d are never read)
                    sQ[r, c] = q[b, h * G + r // NQ, r % NQ, c]
            if COUNT and tid == 0:
                cuda.atomic.add(counters, (IQ, READ), ROWS * d)
        for jj in range(a, e):
            c0 = (j0 + jj) * BC
            cols = min(BC, length - c0)
            if PAGED:
                p0 = c0 // PSZ
                npages = (c0 + cols - 1) // PSZ - p0 + 1
                for t in range(tid, npages, NT):
                    sPage[t] = bt[b, p0 + t]
                if COUNT and tid == 0:
                    cuda.atomic.add(counters, (IBT, READ), npages)
                cuda.syncthreads()  # the page numbers are in before the rows are gathered
            for x in range(tid, BC * DP, NT):
                c = x // DP
                t = x % DP
                if c < cols and t < d:
                    if PAGED:
                        jrow = c0 + c
                        page = sPage[jrow // PSZ - p0]
                        sK[c, t] = k[page, jrow % PSZ, h, t]
                        sV[c, t] = v[page, jrow % PSZ, h, t]
                    else:
                        sK[c, t] = k[b, h, c0 + c, t]
                        sV[c, t] = v[b, h, c0 + c, t]
            if COUNT and tid == 0:
                cuda.atomic.add(counters, (IK, READ), cols * d)
                cuda.atomic.add(counters, (IV, READ), cols * d)
            cuda.syncthreads()  # Q (first time), K_j, V_j loaded before S reads them
            # S_rc = τ Q_r · K_c, -inf where the key is masked for the row (or past the cache).
            for x in range(tid, ROWS * BC, NT):
                r = x // BC
                c = x % BC
                j = c0 + c
                pos = length - NQ + r % NQ
                ok = c < cols
                if CAUSAL:
                    ok = ok and j <= pos
                if WINDOW:
                    ok = ok and (wl < 0 or j >= pos - wl) and (wr < 0 or j <= pos + wr)
                sc = NEG_INF
                if ok:
                    acc = ZERO
                    for t in range(d):
                        acc += LD(sQ[r, t]) * LD(sK[c, t])
                    sc = acc * scale
                sS[r, c] = sc
            cuda.syncthreads()  # S complete before the row statistics
            # Online softmax (as kernels/flash2.py): m_new = max(m, max_c S), P̃ = exp(S - m_new),
            # α = exp(m - m_new), ℓ = α ℓ + Σ P̃; while m_new is -inf subtract 0 instead.
            for r in range(tid, ROWS, NT):
                m_old = sM[r]
                m_new = m_old
                for c in range(BC):
                    if sS[r, c] > m_new:
                        m_new = sS[r, c]
                m_use = m_new if m_new != NEG_INF else ZERO
                alpha = math.exp(m_old - m_use)
                lsum = ZERO
                for c in range(BC):
                    p = math.exp(sS[r, c] - m_use)
                    sS[r, c] = p
                    lsum += p
                sL[r] = sL[r] * alpha + lsum
                sM[r] = m_new
                sAlpha[r] = alpha
            cuda.syncthreads()  # P̃ and α ready
            for x in range(tid, ROWS * DP, NT):
                r = x // DP
                t = x % DP
                if t < d:
                    acc = sAcc[r, t] * sAlpha[r]
                    for c in range(cols):
                        acc += sS[r, c] * LD(sV[c, t])
                    sAcc[r, t] = acc
            cuda.syncthreads()  # acc done with P̃, V_j before the next block overwrites them
        cuda.syncthreads()
        # Epilogue: O_r = acc_r / ℓ_r, L_r = m_r + log ℓ_r (0 and -inf for a row that saw nothing).
        for x in range(tid, ROWS * d, NT):
            r = x // d
            t = x % d
            l_r = sL[r]
            val = ZERO if l_r == ZERO else sAcc[r, t] / l_r
            if SPLIT:
                op[s, b, h * G + r // NQ, r % NQ, t] = val
            else:
                o[b, h * G + r // NQ, r % NQ, t] = CV(val)
        for r in range(tid, ROWS, NT):
            l_r = sL[r]
            val = NEG_INF if l_r == ZERO else sM[r] + math.log(l_r)
            if SPLIT:
                lp[s, b, h * G + r // NQ, r % NQ] = val
            else:
                lse[b, h * G + r // NQ, r % NQ] = val
        if COUNT and tid == 0:
            if SPLIT:
                cuda.atomic.add(counters, (IOP, WRITE), ROWS * d)
                cuda.atomic.add(counters, (ILP, WRITE), ROWS)
            else:
                cuda.atomic.add(counters, (IO, WRITE), ROWS * d)
                cuda.atomic.add(counters, (IL, WRITE), ROWS)

    return decode_main


def _combine_source(dt, COUNT):
    CV = storer(dt)

    def decode_combine(op, lp, o, lse, counters):
        # Grid (B·Hq·Nq): block x combines the S partial results of one query row:
        # m = max_s Lp_s, w_s = exp(Lp_s - m), O = Σ_s w_s Op_s / Σ_s w_s, L = m + log Σ_s w_s.
        x = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nsplit = op.shape[0]
        nh = o.shape[1]
        nq = o.shape[2]
        d = o.shape[3]
        b = x // (nh * nq)
        hq = (x // nq) % nh
        i = x % nq
        sW = cuda.shared.array(MAX_SPLITS, float32)
        sTot = cuda.shared.array(2, float32)
        for s in range(tid, nsplit, NT):
            sW[s] = lp[s, b, hq, i]
        if COUNT and tid == 0:
            cuda.atomic.add(counters, (ILP, READ), nsplit)
            cuda.atomic.add(counters, (IOP, READ), nsplit * d)
            cuda.atomic.add(counters, (IO, WRITE), d)
            cuda.atomic.add(counters, (IL, WRITE), 1)
        cuda.syncthreads()  # every split's Lp is in
        if tid == 0:
            m = NEG_INF
            for s in range(nsplit):
                if sW[s] > m:
                    m = sW[s]
            m_use = m if m != NEG_INF else ZERO
            tot = ZERO
            for s in range(nsplit):
                w = math.exp(sW[s] - m_use)
                sW[s] = w
                tot += w
            sTot[0] = tot
            sTot[1] = m_use
        cuda.syncthreads()  # weights and their sum are ready
        tot = sTot[0]
        for t in range(tid, d, NT):
            acc = ZERO
            for s in range(nsplit):
                w = sW[s]
                if w != ZERO:
                    acc += w * op[s, b, hq, i, t]
            o[b, hq, i, t] = CV(ZERO if tot == ZERO else acc / tot)
        if tid == 0:
            lse[b, hq, i] = NEG_INF if tot == ZERO else sTot[1] + math.log(tot)

    return decode_combine


@cache
def main_kernel(dt, dp, bc, g, nq, paged, split, window, causal, count, psz):
    return cuda.jit(_main_source(dt, dp, bc, g, nq, paged, split, window, causal, count, psz))


@cache
def combine_kernel(dt, count):
    return cuda.jit(_combine_source(dt, count))


# ---------------------------------------------------------------------------------------------
# Inputs: numpy, torch (CPU or CUDA, bf16 included), Numba device arrays, CUDA array objects.


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _dt_name(dtype) -> str | None:
    s = str(dtype).replace("torch.", "")
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(s)


@dataclass
class Plan:
    """Everything a launch needs, validated: device arrays, sizes, options."""

    q: object
    k: object
    v: object
    bt: object  # device int32 (B, max_pages), or a (1, 1) dummy when contiguous
    lens: object  # device int32 (B,)
    lengths: np.ndarray  # host int64 (B,)
    dt: str
    kind: str  # "numpy" | "torch-cpu" | "torch" | "device" | "cupy"
    stream: object
    b: int
    hq: int
    hkv: int
    nq: int
    d: int
    nk_max: int
    page_size: int  # 0: contiguous
    left: int
    right: int
    windowed: bool
    causal: bool
    scale: float

    @property
    def group(self) -> int:
        return self.hq // self.hkv

    def empty(self, shape, dt):
        """A device array for a result (``dt`` a precision name or a numpy dtype); from torch's
        allocator for torch CUDA inputs.  Returns (the array the kernel writes, the result)."""
        if self.kind == "torch":
            import torch

            tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(dt, None)
            if tdt is None:
                tdt = getattr(torch, np.dtype(dt).name)
            t = torch.empty(tuple(shape), dtype=tdt, device=f"cuda:{torch.cuda.current_device()}")
            from ._arrays import as_device_array

            return as_device_array(t.view(torch.int16) if dt == "bf16" else t, sync=False), t
        npdt = {"fp32": np.float32, "fp16": np.float16, "bf16": np.int16}.get(dt, dt)
        a = cuda.device_array(tuple(shape), dtype=npdt, stream=self.stream)
        return a, a

    def out(self, res, dt):
        """A result in the caller's kind."""
        if self.kind == "torch":
            return res
        if self.kind in ("numpy", "torch-cpu"):
            host = res.copy_to_host(stream=self.stream)
            self.stream.synchronize()
            if self.kind == "numpy":
                if dt == "bf16":
                    raise AssertionError("bf16 results need torch")
                return host
            import torch

            t = torch.from_numpy(np.ascontiguousarray(host))
            return t.view(torch.bfloat16) if dt == "bf16" else t
        if self.kind == "cupy":
            import cupy

            return cupy.asarray(res)
        return res


def _wrap_float(name, x, stream, explicit_stream):
    """(device array, precision name, kind) of a float input (bf16 as its int16 bits)."""
    from ._arrays import _kind, as_device_array

    if x is None:
        raise ValueError(f"{name}=None: must be an array")
    if _is_torch(x):
        import torch

        dt = _dt_name(x.dtype)
        if dt is None:
            raise ValueError(f"{name}.dtype={x.dtype}: must be float32, float16 or bfloat16")
        bits = (x.view(torch.int16) if dt == "bf16" else x).detach()  # (no interface on grad-requiring tensors)
        if x.device.type == "cuda":
            if not x.is_contiguous():
                raise ValueError(f"{name}: device array must be C-contiguous (got strides {tuple(x.stride())})")
            return as_device_array(bits, sync=explicit_stream), dt, "torch"
        return cuda.to_device(np.ascontiguousarray(bits.detach().numpy()), stream=stream), dt, "torch-cpu"
    kind = _kind(x)
    if kind == "other":
        if not hasattr(x, "__array__"):
            raise ValueError(f"{name}: type {type(x).__name__} is neither a numpy array nor a CUDA array")
        x, kind = np.asarray(x), "numpy"
    if kind == "numpy":
        dt = _dt_name(x.dtype)
        if dt not in ("fp32", "fp16"):
            raise ValueError(f"{name}.dtype={x.dtype}: must be float32 or float16 (bfloat16: pass torch tensors)")
        return cuda.to_device(np.ascontiguousarray(x), stream=stream), dt, "numpy"
    dev = as_device_array(x)
    dt = _dt_name(np.dtype(dev.dtype))
    if dt not in ("fp32", "fp16"):
        raise ValueError(f"{name}.dtype={dev.dtype}: must be float32 or float16")
    if not dev.is_c_contiguous():
        raise ValueError(f"{name}: device array must be C-contiguous (got strides {dev.strides})")
    return dev, dt, kind


def _host_ints(name, x) -> np.ndarray:
    """A 1-D or 2-D integer array on the host (device arrays are copied back)."""
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    elif hasattr(x, "copy_to_host"):
        x = x.copy_to_host()
    elif hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        x = cuda.as_cuda_array(x).copy_to_host()
    try:
        a = np.asarray(x)
    except Exception as e:  # pragma: no cover - exotic objects
        raise ValueError(f"{name}: not an integer array ({e})") from e
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name}.dtype={a.dtype}: must be an integer array")
    return a.astype(np.int64)


def _int_opt(name, x, lo=None):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"{name}={x!r}: must be an integer")
    x = int(x)
    if lo is not None and x < lo:
        raise ValueError(f"{name}={x}: must be >= {lo}")
    return x


def plan(q, k_cache, v_cache, *, cache_seqlens=None, cu_seqlens_k=None, block_table=None, page_size=None,
         window=None, causal=True, scale=None, stream=None) -> Plan:
    """Validate a decode call and move its inputs to the device (see :func:`kernels.decode_attention`)."""
    from ._arrays import check_options, launch_stream

    check_options(causal, scale, False)
    if q is None:
        raise ValueError("q=None: must be an array")
    explicit = stream is not None
    st = launch_stream(stream, q)
    qd, dt, kind = _wrap_float("q", q, st, explicit)
    kd, dtk, kindk = _wrap_float("k_cache", k_cache, st, explicit)
    vd, dtv, kindv = _wrap_float("v_cache", v_cache, st, explicit)
    if len({dt, dtk, dtv}) > 1:
        raise ValueError(f"dtypes={sorted({dt, dtk, dtv})}: q, k_cache and v_cache must share one dtype")
    host = {kk in ("numpy", "torch-cpu") for kk in (kind, kindk, kindv)}
    if len(host) > 1:
        raise ValueError("inputs mix host (numpy) and device arrays: pass all on the host or all on the device")
    if len(qd.shape) != 4:
        raise ValueError(f"q.shape={tuple(qd.shape)}: must be 4-D (batch, heads, Nq, head_dim)")
    b, hq, nq, d = (int(x) for x in qd.shape)
    if min(b, hq, nq, d) <= 0:
        raise ValueError(f"q.shape={tuple(qd.shape)}: every size must be positive")
    if tuple(kd.shape) != tuple(vd.shape):
        raise ValueError(f"k_cache.shape={tuple(kd.shape)}, v_cache.shape={tuple(vd.shape)}: must be equal")
    paged = block_table is not None
    if page_size is not None:
        page_size = _int_opt("page_size", page_size, 1)
        if not paged:
            raise ValueError(f"page_size={page_size}: a paged cache needs block_table")
    if paged:
        if len(kd.shape) == 3:  # (num_pages · P, Hkv, d): pages of page_size rows
            if page_size is None:
                raise ValueError(f"k_cache.shape={tuple(kd.shape)}: a 3-D paged cache needs page_size")
            if kd.shape[0] % page_size:
                raise ValueError(f"page_size={page_size}: does not divide the cache's {kd.shape[0]} rows "
                                 f"(k_cache.shape={tuple(kd.shape)})")
            shape = (kd.shape[0] // page_size, page_size, kd.shape[1], kd.shape[2])
            kd, vd = kd.reshape(shape), vd.reshape(shape)
        if len(kd.shape) != 4:
            raise ValueError(f"k_cache.shape={tuple(kd.shape)}: a paged cache is (num_pages, page_size, kv_heads, "
                             "head_dim)")
        npages, psz, hkv, dk = (int(x) for x in kd.shape)
        if page_size is not None and page_size != psz:
            raise ValueError(f"page_size={page_size}: must equal k_cache.shape[1]={psz}")
        table = _host_ints("block_table", block_table)
        if table.ndim != 2 or table.shape[0] != b or table.shape[1] == 0:
            raise ValueError(f"block_table.shape={table.shape}: must be (batch={b}, max_pages_per_seq >= 1)")
        nk_max = table.shape[1] * psz
    else:
        if len(kd.shape) != 4:
            raise ValueError(f"k_cache.shape={tuple(kd.shape)}: must be 4-D (batch, kv_heads, Nk_max, head_dim)")
        bk, hkv, nk_max, dk = (int(x) for x in kd.shape)
        psz, npages = 0, 0
        if bk != b:
            raise ValueError(f"k_cache.shape[0]={bk}: batch must equal q.shape[0]={b}")
    if dk != d:
        raise ValueError(f"k_cache head_dim={dk}: must equal q.shape[3]={d}")
    if hkv <= 0 or hq % hkv:
        raise ValueError(f"kv_heads={hkv}: must divide the query heads q.shape[1]={hq}")
    if min(nk_max, hkv, d) <= 0:
        raise ValueError(f"k_cache.shape={tuple(kd.shape)}: every size must be positive")
    # lengths
    if cache_seqlens is not None and cu_seqlens_k is not None:
        raise ValueError("cache_seqlens and cu_seqlens_k: give one of them, not both")
    if cu_seqlens_k is not None:
        cu = _host_ints("cu_seqlens_k", cu_seqlens_k)
        if cu.ndim != 1 or cu.shape[0] != b + 1:
            raise ValueError(f"cu_seqlens_k.shape={cu.shape}: must be (batch + 1,) = ({b + 1},)")
        if cu[0] != 0 or np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens_k={cu.tolist()[:8]}...: must start at 0 and never decrease")
        lengths = np.diff(cu)
        src = "cu_seqlens_k"
    elif cache_seqlens is not None:
        lengths = _host_ints("cache_seqlens", cache_seqlens)
        if lengths.ndim == 0:
            lengths = np.full(b, int(lengths), dtype=np.int64)
        if lengths.ndim != 1 or lengths.shape[0] != b:
            raise ValueError(f"cache_seqlens.shape={lengths.shape}: must be (batch,) = ({b},)")
        src = "cache_seqlens"
    else:
        lengths = np.full(b, nk_max, dtype=np.int64)
        src = "cache_seqlens"
    if np.any(lengths > nk_max):
        bad = int(np.argmax(lengths > nk_max))
        raise ValueError(f"{src}: length {int(lengths[bad])} of sequence {bad} exceeds the cache's Nk_max={nk_max}")
    if np.any(lengths < nq):
        bad = int(np.argmin(lengths))
        raise ValueError(f"{src}: length {int(lengths[bad])} of sequence {bad} is below Nq={nq} (each query row "
                         "needs its own key)")
    if paged:
        for bb in range(b):
            used = table[bb, : -(-int(lengths[bb]) // psz)]
            if used.size and (used.min() < 0 or used.max() >= npages):
                i = int(np.argmax((used < 0) | (used >= npages)))
                raise ValueError(f"block_table[{bb}, {i}]={int(used[i])}: out of range for {npages} pages")
    # window
    left, right, windowed = -1, -1, window is not None
    if windowed:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"window={window!r}: must be a pair (left, right); -1 means unbounded")
        left = _int_opt("window[0]", window[0], -1)
        right = _int_opt("window[1]", window[1], -1)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    bt = cuda.to_device(np.ascontiguousarray(table.astype(np.int32)) if paged else np.zeros((1, 1), np.int32),
                        stream=st)
    lens = cuda.to_device(lengths.astype(np.int32), stream=st)
    return Plan(qd, kd, vd, bt, lens, lengths, dt, kind, st, b, hq, hkv, nq, d, nk_max, psz, left, right,
                windowed, bool(causal), float(scale))


def check_splits(p: Plan, num_splits, bc: int) -> int:
    """The number of splits, checked against the longest sequence's key blocks."""
    most = max(visible_blocks(int(n), p.nq, bc, p.left)[1] for n in p.lengths)
    if num_splits is None:
        return 1
    s = _int_opt("num_splits", num_splits, 1)
    if s > most:
        raise ValueError(f"num_splits={s}: more than the {most} key blocks (Bc = {bc}) of the longest sequence")
    if s > MAX_SPLITS:
        raise ValueError(f"num_splits={s}: at most {MAX_SPLITS}")
    return s


def run_combine(p: Plan, op, lp, o, lse, splits: int, cnt, count: bool):
    kern = combine_kernel(p.dt, count)
    kern[p.b * p.hq * p.nq, NT, p.stream](op, lp, o, lse, cnt)


def forward(q, k_cache, v_cache, *, cache_seqlens=None, cu_seqlens_k=None, block_table=None, page_size=None,
            num_splits=None, window=None, causal=True, scale=None, block_n=None, counters=None, stream=None,
            _plan=None):
    """The reference decode kernel: see :func:`kernels.decode_attention` (``_plan``: the inputs
    already checked by :func:`plan`)."""
    p = _plan or plan(q, k_cache, v_cache, cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k,
                      block_table=block_table, page_size=page_size, window=window, causal=causal, scale=scale,
                      stream=stream)
    rows = p.group * p.nq
    if block_n is None:
        bc = default_block_n(p.dt, p.d, rows, p.page_size)
    else:
        bc = _int_opt("block_n", block_n, 1)
        need = smem_bytes(p.dt, p.d, rows, bc, p.page_size)
        if need > SMEM_LIMIT:
            raise ValueError(f"block_n={bc}: the decode kernel needs {need} bytes of shared memory, over "
                             f"{SMEM_LIMIT}")
    splits = check_splits(p, num_splits, bc)
    if p.b * p.hkv > 65535:
        raise ValueError(f"batch*kv_heads={p.b * p.hkv}: at most 65535")
    cnt, back = device_counters(counters, p.stream)
    count = counters is not None
    o, o_res = p.empty((p.b, p.hq, p.nq, p.d), p.dt)
    lse, lse_res = p.empty((p.b, p.hq, p.nq), np.float32)
    split = splits > 1
    if split:
        op, _ = p.empty((splits, p.b, p.hq, p.nq, p.d), np.float32)
        lp, _ = p.empty((splits, p.b, p.hq, p.nq), np.float32)
    else:
        op = cuda.device_array((1, 1, 1, 1, 1), np.float32, stream=p.stream)
        lp = cuda.device_array((1, 1, 1, 1), np.float32, stream=p.stream)
    kern = main_kernel(p.dt, padded_head_dim(p.d), bc, p.group, p.nq, p.page_size > 0, split, p.windowed,
                       p.causal, count, max(p.page_size, 1))
    kern[(splits, p.b * p.hkv), NT, p.stream](p.q, p.k, p.v, p.bt, p.lens, o, lse, op, lp, float32(p.scale),
                                               p.left, p.right, cnt)
    if split:
        run_combine(p, op, lp, o, lse, splits, cnt, count)
    back(cnt)
    return p.out(o_res, p.dt), p.out(lse_res, "fp32")
