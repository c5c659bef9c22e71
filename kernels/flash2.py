"""FlashAttention-2 in Numba CUDA: the forward and the three-kernel deterministic backward.

The kernels follow ``flashsim.algorithms.flash2`` transfer for transfer: with ``count=True``
one thread per block adds every tile transfer to the traffic counters, and in the CUDA
simulator those totals equal the walker's exactly (tests/test_flash2_kernel.py).

Thread organisation (readable first; issue 6 makes them fast).  A block of ``NT`` threads
(``_threads(Br, Bc)``, 32..128) works on one query block (forward, dQ) or one key block (dK/dV).
Tiles of Q, K, V and dO sit in shared memory in the input precision, zero-padded to Br (or Bc)
rows and to the compile-time head dimension ``DP`` (d rounded up to a multiple of 16); the
score tile S/P/dS (Br x Bc) and the accumulators (O, dQ, dK, dV) sit in shared memory in
float32.  Every matrix product is an element-strided loop: thread ``tid`` computes the entries
``tid, tid + NT, ...`` of the result tile, each a dot product over d (or over Br, Bc).  Row
statistics (m_i, ℓ_i) are updated by one thread per row.  Nothing lives in per-thread local
arrays, so the sm_90 PTX has no ``.local`` memory (checked by :func:`ptx` and the tests).

Masking.  ``causal=True`` is aligned to the bottom-right corner of the Nq x Nk score matrix, as
flash-attention >= 2.1: query row i sees key column j iff j <= i + (Nk - Nq).  PyTorch's
``scaled_dot_product_attention(is_causal=True)`` aligns to the top-left corner (j <= i); the two
agree only when Nq == Nk.  Key blocks that a query block cannot see at all are skipped (never
loaded); a :class:`flashsim.config.BlockMask` skips the blocks it zeroes.  A row that sees no key
(causal with Nq > Nk, or a block mask with an all-zero row) gets O = 0 and L = -inf, and adds
nothing to any gradient (its dQ row is 0).

Kernels are compiled by a cached factory keyed on (dtype, DP, Br, Bc, causal, has_mask, count),
so every shared array has a compile-time shape and the counting code is compiled out when
``count`` is False.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, int16, int64, types, uint8

from ._bf16 import cvt_bf16, ld_bf16
from .counters import INDEX, READ, WRITE, device_counters

#: Static shared memory one block may use without opting in (bytes).
SMEM_LIMIT = 48 * 1024
#: Block sizes tried, best first, when the caller gives none.
_CANDIDATES = ((64, 64), (64, 32), (32, 64), (32, 32), (32, 16), (16, 32), (16, 16), (16, 8), (8, 16), (8, 8))
#: Element types of the tiles by dtype name; bfloat16 is held as its int16 bits (``kernels/_bf16.py``).
_NUMBA_DTYPES = {"float32": float32, "float16": types.float16, "bfloat16": int16}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
NEG_INF = float32(-math.inf)
ZERO = float32(0.0)


def _name(dtype) -> str:
    """The dtype's name ('float32', 'float16', 'bfloat16'); ValueError for any other."""
    from ._arrays import dtype_name

    name = dtype_name(dtype)
    if name not in _ITEMSIZE:
        raise ValueError(f"dtype={dtype}: must be float32, float16 or bfloat16")
    return name


def _widen_store(dtype):
    """(LD, CV): a stored element to float32, a float32 to a storable value.  bfloat16 goes through
    its bits (``ld_bf16``, ``cvt_bf16``, rounding to nearest even); fp16 and fp32 through float32
    (Numba converts on the store)."""
    if _name(dtype) == "bfloat16":
        return ld_bf16, cvt_bf16
    return float32, float32


def padded_head_dim(d: int) -> int:
    """The compile-time head dimension DP: d rounded up to a multiple of 16."""
    return -(-d // 16) * 16


def _kv_stride(dtype, dp: int) -> int:
    """Row length of the K_j, V_j tiles in shared memory: DP plus one 4-byte word.  The score
    loops have consecutive threads read consecutive rows of K_j (V_j) at the same column; with a
    row of DP elements (a multiple of 32 words) they would all hit one bank, with an odd number
    of words per row they hit 32 different ones."""
    return dp + (2 if _ITEMSIZE[_name(dtype)] == 2 else 1)


def _threads(br: int, bc: int) -> int:
    return min(128, max(32, br * bc // 4))


def smem_bytes(kind: str, elem_bytes: int, d: int, br: int, bc: int) -> int:
    """Static shared memory of one block of kernel ``kind`` ("fwd", "dkdv", "dq", "bwd")."""
    dp = padded_head_dim(d)
    kp = dp + 4 // elem_bytes  # K_j, V_j rows padded by one word (see _kv_stride)
    if kind == "fwd":  # Q_i, K_j, V_j; S (f32, rows padded by one), acc (f32), m, l, alpha (f32)
        return elem_bytes * (br * dp + 2 * bc * kp) + 4 * (br * (bc + 1) + br * dp + 3 * br)
    if kind == "dkdv":  # K_j, V_j, Q_i, dO_i; L_i, D_i; P/dS; dK_j, dV_j (f32)
        return elem_bytes * (2 * bc * kp + 2 * br * dp) + 4 * (2 * br + br * bc + 2 * bc * dp)
    if kind == "dq":  # Q_i, dO_i, K_j, V_j; L_i, D_i; dS; dQ_i (f32)
        return elem_bytes * (2 * br * dp + 2 * bc * kp) + 4 * (2 * br + br * bc + br * dp)
    if kind == "bwd":
        return max(smem_bytes("dkdv", elem_bytes, d, br, bc), smem_bytes("dq", elem_bytes, d, br, bc))
    if kind == "preprocess":
        return 0
    raise ValueError(f"kind={kind!r}")


def default_blocks(pass_: str, dtype, d: int) -> tuple[int, int]:
    """The largest (Br, Bc) of ``_CANDIDATES`` whose kernels fit 48 KB of static shared memory.

    fp16: d <= 64 gives (64, 32), d = 128 gives (32, 32); fp32 d = 128 gives (16, 16).
    """
    eb = _ITEMSIZE[_name(dtype)]
    for br, bc in _CANDIDATES:
        if smem_bytes(pass_, eb, d, br, bc) <= SMEM_LIMIT:
            return br, bc
    raise ValueError(f"head_dim={d}: too large for {SMEM_LIMIT} bytes of shared memory even with 8x8 blocks")


def check_blocks(pass_: str, dtype, d: int, br: int, bc: int) -> None:
    for name, v in (("block_m", br), ("block_n", bc)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{name}={v!r}: must be a positive integer")
    need = smem_bytes(pass_, _ITEMSIZE[_name(dtype)], d, br, bc)
    if need > SMEM_LIMIT:
        raise ValueError(f"block_m={br}, block_n={bc}: the {pass_} kernels need {need} bytes of shared memory "
                         f"for head_dim={d} {_name(dtype)}, over the {SMEM_LIMIT}-byte static limit")


# ---------------------------------------------------------------------------------------------
# Kernel sources.  Each factory returns a plain Python function; ``_jit`` caches its cuda.jit.

IQ, IK, IV, IO, IL, ID = INDEX["Q"], INDEX["K"], INDEX["V"], INDEX["O"], INDEX["L"], INDEX["D"]
IDO, IDQ, IDK, IDV = INDEX["dO"], INDEX["dQ"], INDEX["dK"], INDEX["dV"]


def _fwd_source(dtype, DP, BR, BC, CAUSAL, HAS_MASK, COUNT):
    ST = _NUMBA_DTYPES[_name(dtype)]
    LD, CV = _widen_store(dtype)
    NT = _threads(BR, BC)
    KP = _kv_stride(dtype, DP)
    SC = BC + 1

    def flash2_fwd(q, k, v, o, lse, scale, mask, counters):
        # Grid (Tr, B·H): block (i, b·H + h) computes O_i and L_i of query head h.
        i = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        nh = q.shape[1]
        b = bh // nh
        h = bh % nh
        hk = h // (nh // k.shape[1])  # grouped-query attention: kv head of query head h
        nq = q.shape[2]
        nk = k.shape[2]
        d = q.shape[3]
        tc = (nk + BC - 1) // BC
        r0 = i * BR
        rows = min(BR, nq - r0)
        shift = nk - nq  # causal: row r sees columns c <= r + shift
        sQ = cuda.shared.array((BR, DP), ST)
        sK = cuda.shared.array((BC, KP), ST)
        sV = cuda.shared.array((BC, KP), ST)
        sS = cuda.shared.array((BR, SC), float32)  # SC = Bc + 1: one thread walks each row
        sAcc = cuda.shared.array((BR, DP), float32)
        sM = cuda.shared.array(BR, float32)
        sL = cuda.shared.array(BR, float32)
        sAlpha = cuda.shared.array(BR, float32)

        for e in range(tid, BR * DP, NT):
            r = e // DP
            x = e % DP
            if r < rows and x < d:
                sQ[r, x] = q[b, h, r0 + r, x]
            else:
                sQ[r, x] = ZERO
            sAcc[r, x] = ZERO
        for r in range(tid, BR, NT):
            sM[r] = NEG_INF
            sL[r] = ZERO
        if COUNT and tid == 0:
            cuda.atomic.add(counters, (IQ, READ), rows * d)
        # Online softmax over the visible key blocks j (the paper's Algorithm 1, FA2 form), per row r:
        #   S_rc   = τ · Q_r · K_c                               (-inf where masked or c >= Nk)
        #   m_new  = max(m_r, max_c S_rc)
        #   P̃_rc   = exp(S_rc - m_new),  α_r = exp(m_r - m_new)
        #   ℓ_r    = α_r ℓ_r + Σ_c P̃_rc
        #   acc_r  = α_r acc_r + Σ_c P̃_rc V_c
        # and after the last block O_r = acc_r / ℓ_r, L_r = m_r + log ℓ_r.  While m_new is -inf (no
        # visible entry yet) we subtract 0 instead, so exp never sees (-inf) - (-inf).  Every
        # exponent is S - (running max) <= 0: scores of 1e4 stay finite and exact.
        last_col = min(r0 + BR, nq) - 1 + shift  # the last column the block's last row sees
        for j in range(tc):
            c0 = j * BC
            if CAUSAL and c0 > last_col:
                break  # columns only grow with j: every later block is masked too
            if HAS_MASK and mask[i, j] == 0:
                continue
            cols = min(BC, nk - c0)
            # The syncthreads at the end of the previous iteration (or after Q's load) protects
            # these writes: nobody still reads the old K_j, V_j, S.
            for e in range(tid, BC * DP, NT):
                c = e // DP
                x = e % DP
                if c < cols and x < d:
                    sK[c, x] = k[b, hk, c0 + c, x]
                    sV[c, x] = v[b, hk, c0 + c, x]
                else:
                    sK[c, x] = ZERO
                    sV[c, x] = ZERO
            if COUNT and tid == 0:
                cuda.atomic.add(counters, (IK, READ), cols * d)
                cuda.atomic.add(counters, (IV, READ), cols * d)
            cuda.syncthreads()  # Q_i (first time), K_j, V_j are in shared memory before S reads them
            for e in range(tid, BR * BC, NT):
                r = e // BC
                c = e % BC
                s = NEG_INF
                if c < cols and (not CAUSAL or c0 + c <= r0 + r + shift):
                    acc = ZERO
                    for x in range(d):
                        acc += LD(sQ[r, x]) * LD(sK[c, x])
                    s = acc * scale
                sS[r, c] = s
            cuda.syncthreads()  # the whole S tile is written before the row statistics read it
            for r in range(tid, BR, NT):
                m_old = sM[r]
                m_new = m_old
                for c in range(BC):
                    if sS[r, c] > m_new:  # NaN never wins: it then poisons P̃, ℓ and O of row r
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
            cuda.syncthreads()  # P̃ and α are ready before acc uses them
            for e in range(tid, BR * DP, NT):
                r = e // DP
                x = e % DP
                if x < d:
                    acc = sAcc[r, x] * sAlpha[r]
                    for c in range(BC):
                        acc += sS[r, c] * LD(sV[c, x])
                    sAcc[r, x] = acc
            cuda.syncthreads()  # acc is done reading P̃ and V_j before the next tile overwrites them
        cuda.syncthreads()  # (no visible block at all) sM, sL, sAcc initialised before the epilogue
        for e in range(tid, rows * d, NT):
            r = e // d
            x = e % d
            l_r = sL[r]
            o[b, h, r0 + r, x] = CV(ZERO if l_r == ZERO else sAcc[r, x] / l_r)
        for r in range(tid, rows, NT):
            l_r = sL[r]
            lse[b, h, r0 + r] = NEG_INF if l_r == ZERO else sM[r] + math.log(l_r)
        if COUNT and tid == 0:
            cuda.atomic.add(counters, (IO, WRITE), rows * d)
            cuda.atomic.add(counters, (IL, WRITE), rows)

    return flash2_fwd, NT


def _preprocess_source(dtype, DP, BR, BC, CAUSAL, HAS_MASK, COUNT):
    LD, _ = _widen_store(dtype)
    NT = 128  # a multiple of G, whatever the blocks
    G = 16  # threads per row: a warp reads 2 rows x 16 consecutive elements, whole sectors
    RG = NT // G  # rows in flight per step

    def flash2_bwd_preprocess(o, do, dvec, counters):
        # Grid (Tr, B·H): D_r = Σ_x dO_rx O_rx in float32 for the rows of query block i.
        # G threads share a row and stride along it, so each warp's loads are contiguous (one
        # thread per row would make every load of a warp touch 32 different rows: measured on
        # the H100 as 16x the useful bytes at the LSU).  The G partial sums meet in shared memory.
        part = cuda.shared.array(NT, float32)
        dsh = cuda.shared.array(BR, float32)
        i = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        lane = tid % G
        slot = tid // G
        nh = o.shape[1]
        b = bh // nh
        h = bh % nh
        nq = o.shape[2]
        d = o.shape[3]
        r0 = i * BR
        rows = min(BR, nq - r0)
        for rbase in range(0, rows, RG):
            r = rbase + slot
            acc = ZERO
            if r < rows:
                for x in range(lane, d, G):
                    acc += LD(do[b, h, r0 + r, x]) * LD(o[b, h, r0 + r, x])
            part[tid] = acc
            cuda.syncthreads()  # the G partial sums of each row are in shared memory
            if lane == 0 and r < rows:
                total = ZERO
                for g in range(G):
                    total += part[slot * G + g]
                dsh[r] = total
            cuda.syncthreads()  # part is reused by the next group of rows; dsh is complete
        # D_i leaves in one coalesced store (a store per row slot would move a 32-byte sector
        # for every two 4-byte values: +12 bytes a row, measured on the H100).
        for r in range(tid, rows, NT):
            dvec[b, h, r0 + r] = dsh[r]
        if COUNT and tid == 0:
            cuda.atomic.add(counters, (IO, READ), rows * d)
            cuda.atomic.add(counters, (IDO, READ), rows * d)
            cuda.atomic.add(counters, (ID, WRITE), rows)

    return flash2_bwd_preprocess, NT


def _dkdv_source(dtype, DP, BR, BC, CAUSAL, HAS_MASK, COUNT):
    ST = _NUMBA_DTYPES[_name(dtype)]
    LD, CV = _widen_store(dtype)
    NT = _threads(BR, BC)
    KP = _kv_stride(dtype, DP)

    def flash2_bwd_dkdv(q, k, v, do, lse, dvec, dk, dv, scale, mask, counters):
        # Grid (Tc, B·Hkv): block (j, b·Hkv + hk) computes dK_j, dV_j of kv head hk, summed over
        # the query heads of its group and the query blocks that see j.  Per (i, j):
        #   P  = exp(τ Q_i K_jᵀ - L_i)          (0 where masked, and for rows with L = -inf)
        #   dV_j += Pᵀ dO_i
        #   dS = P ∘ (dO_i V_jᵀ - D_i)
        #   dK_j += τ dSᵀ Q_i
        j = cuda.blockIdx.x
        bk = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        nhk = k.shape[1]
        b = bk // nhk
        hk = bk % nhk
        group = q.shape[1] // nhk
        nq = q.shape[2]
        nk = k.shape[2]
        d = q.shape[3]
        tr = (nq + BR - 1) // BR
        c0 = j * BC
        cols = min(BC, nk - c0)
        shift = nk - nq
        sK = cuda.shared.array((BC, KP), ST)
        sV = cuda.shared.array((BC, KP), ST)
        sQ = cuda.shared.array((BR, DP), ST)
        sdO = cuda.shared.array((BR, DP), ST)
        sLse = cuda.shared.array(BR, float32)
        sD = cuda.shared.array(BR, float32)
        sP = cuda.shared.array((BR, BC), float32)
        sdK = cuda.shared.array((BC, DP), float32)
        sdV = cuda.shared.array((BC, DP), float32)

        for e in range(tid, BC * DP, NT):
            c = e // DP
            x = e % DP
            if c < cols and x < d:
                sK[c, x] = k[b, hk, c0 + c, x]
                sV[c, x] = v[b, hk, c0 + c, x]
            else:
                sK[c, x] = ZERO
                sV[c, x] = ZERO
            sdK[c, x] = ZERO
            sdV[c, x] = ZERO
        if COUNT and tid == 0:
            cuda.atomic.add(counters, (IK, READ), cols * d)
            cuda.atomic.add(counters, (IV, READ), cols * d)
        for g in range(group):
            h = hk * group + g
            for i in range(tr):
                r0 = i * BR
                if CAUSAL and c0 > min(r0 + BR, nq) - 1 + shift:
                    continue  # query block i's last row does not reach column c0
                if HAS_MASK and mask[i, j] == 0:
                    continue
                rows = min(BR, nq - r0)
                # The syncthreads closing the previous (g, i) step protects these writes.
                for e in range(tid, BR * DP, NT):
                    r = e // DP
                    x = e % DP
                    if r < rows and x < d:
                        sQ[r, x] = q[b, h, r0 + r, x]
                        sdO[r, x] = do[b, h, r0 + r, x]
                    else:
                        sQ[r, x] = ZERO
                        sdO[r, x] = ZERO
                for r in range(tid, BR, NT):
                    if r < rows:
                        sLse[r] = lse[b, h, r0 + r]
                        sD[r] = dvec[b, h, r0 + r]
                    else:
                        sLse[r] = NEG_INF  # padding rows: P = 0
                        sD[r] = ZERO
                if COUNT and tid == 0:
                    cuda.atomic.add(counters, (IQ, READ), rows * d)
                    cuda.atomic.add(counters, (IDO, READ), rows * d)
                    cuda.atomic.add(counters, (IL, READ), rows)
                    cuda.atomic.add(counters, (ID, READ), rows)
                cuda.syncthreads()  # K_j, V_j (first time), Q_i, dO_i, L_i, D_i loaded before P
                for e in range(tid, BR * BC, NT):
                    r = e // BC
                    c = e % BC
                    p = ZERO
                    lr = sLse[r]
                    if c < cols and lr != NEG_INF and (not CAUSAL or c0 + c <= r0 + r + shift):
                        acc = ZERO
                        for x in range(d):
                            acc += LD(sQ[r, x]) * LD(sK[c, x])
                        p = math.exp(acc * scale - lr)
                    sP[r, c] = p
                cuda.syncthreads()  # P complete before dV reads its columns
                for e in range(tid, BC * DP, NT):
                    c = e // DP
                    x = e % DP
                    if x < d:
                        acc = sdV[c, x]
                        for r in range(BR):
                            acc += sP[r, c] * LD(sdO[r, x])
                        sdV[c, x] = acc
                cuda.syncthreads()  # dV is done reading P before it is overwritten by dS
                for e in range(tid, BR * BC, NT):
                    r = e // BC
                    c = e % BC
                    p = sP[r, c]
                    if c < cols and (not CAUSAL or c0 + c <= r0 + r + shift):
                        acc = ZERO
                        for x in range(d):
                            acc += LD(sdO[r, x]) * LD(sV[c, x])
                        sP[r, c] = p * (acc - sD[r])
                cuda.syncthreads()  # dS complete before dK reads its columns
                for e in range(tid, BC * DP, NT):
                    c = e // DP
                    x = e % DP
                    if x < d:
                        acc = ZERO
                        for r in range(BR):
                            acc += sP[r, c] * LD(sQ[r, x])
                        sdK[c, x] += acc * scale
                cuda.syncthreads()  # dK is done with dS and Q_i before the next step reloads them
        cuda.syncthreads()  # (no visible block at all) the zeroed accumulators are in place
        for e in range(tid, cols * d, NT):
            c = e // d
            x = e % d
            dk[b, hk, c0 + c, x] = CV(sdK[c, x])
            dv[b, hk, c0 + c, x] = CV(sdV[c, x])
        if COUNT and tid == 0:
            cuda.atomic.add(counters, (IDK, WRITE), cols * d)
            cuda.atomic.add(counters, (IDV, WRITE), cols * d)

    return flash2_bwd_dkdv, NT


def _dq_source(dtype, DP, BR, BC, CAUSAL, HAS_MASK, COUNT):
    ST = _NUMBA_DTYPES[_name(dtype)]
    LD, CV = _widen_store(dtype)
    NT = _threads(BR, BC)
    KP = _kv_stride(dtype, DP)

    def flash2_bwd_dq(q, k, v, do, lse, dvec, dq, scale, mask, counters):
        # Grid (Tr, B·H): block (i, b·H + h) computes dQ_i = τ Σ_j dS_ij K_j with
        # dS_ij = P_ij ∘ (dO_i V_jᵀ - D_i), P_ij = exp(τ Q_i K_jᵀ - L_i), over the visible j.
        i = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        nh = q.shape[1]
        b = bh // nh
        h = bh % nh
        hk = h // (nh // k.shape[1])
        nq = q.shape[2]
        nk = k.shape[2]
        d = q.shape[3]
        tc = (nk + BC - 1) // BC
        r0 = i * BR
        rows = min(BR, nq - r0)
        shift = nk - nq
        sQ = cuda.shared.array((BR, DP), ST)
        sdO = cuda.shared.array((BR, DP), ST)
        sK = cuda.shared.array((BC, KP), ST)
        sV = cuda.shared.array((BC, KP), ST)
        sLse = cuda.shared.array(BR, float32)
        sD = cuda.shared.array(BR, float32)
        sS = cuda.shared.array((BR, BC), float32)
        sdQ = cuda.shared.array((BR, DP), float32)

        for e in range(tid, BR * DP, NT):
            r = e // DP
            x = e % DP
            if r < rows and x < d:
                sQ[r, x] = q[b, h, r0 + r, x]
                sdO[r, x] = do[b, h, r0 + r, x]
            else:
                sQ[r, x] = ZERO
                sdO[r, x] = ZERO
            sdQ[r, x] = ZERO
        for r in range(tid, BR, NT):
            if r < rows:
                sLse[r] = lse[b, h, r0 + r]
                sD[r] = dvec[b, h, r0 + r]
            else:
                sLse[r] = NEG_INF
                sD[r] = ZERO
        if COUNT and tid == 0:
            cuda.atomic.add(counters, (IQ, READ), rows * d)
            cuda.atomic.add(counters, (IDO, READ), rows * d)
            cuda.atomic.add(counters, (IL, READ), rows)
            cuda.atomic.add(counters, (ID, READ), rows)
        last_col = min(r0 + BR, nq) - 1 + shift
        for j in range(tc):
            c0 = j * BC
            if CAUSAL and c0 > last_col:
                break
            if HAS_MASK and mask[i, j] == 0:
                continue
            cols = min(BC, nk - c0)
            # The syncthreads closing the previous iteration protects these writes.
            for e in range(tid, BC * DP, NT):
                c = e // DP
                x = e % DP
                if c < cols and x < d:
                    sK[c, x] = k[b, hk, c0 + c, x]
                    sV[c, x] = v[b, hk, c0 + c, x]
                else:
                    sK[c, x] = ZERO
                    sV[c, x] = ZERO
            if COUNT and tid == 0:
                cuda.atomic.add(counters, (IK, READ), cols * d)
                cuda.atomic.add(counters, (IV, READ), cols * d)
            cuda.syncthreads()  # Q_i, dO_i, L_i, D_i (first time), K_j, V_j loaded before dS
            for e in range(tid, BR * BC, NT):
                r = e // BC
                c = e % BC
                ds = ZERO
                lr = sLse[r]
                if c < cols and lr != NEG_INF and (not CAUSAL or c0 + c <= r0 + r + shift):
                    s = ZERO
                    dp = ZERO
                    for x in range(d):
                        s += LD(sQ[r, x]) * LD(sK[c, x])
                        dp += LD(sdO[r, x]) * LD(sV[c, x])
                    ds = math.exp(s * scale - lr) * (dp - sD[r])
                sS[r, c] = ds
            cuda.syncthreads()  # dS complete before dQ reads its rows
            for e in range(tid, BR * DP, NT):
                r = e // DP
                x = e % DP
                if x < d:
                    acc = ZERO
                    for c in range(BC):
                        acc += sS[r, c] * LD(sK[c, x])
                    sdQ[r, x] += acc * scale
            cuda.syncthreads()  # dQ is done with dS and K_j before the next tile overwrites them
        cuda.syncthreads()  # (no visible block at all) the zeroed accumulator is in place
        for e in range(tid, rows * d, NT):
            r = e // d
            x = e % d
            dq[b, h, r0 + r, x] = CV(sdQ[r, x])
        if COUNT and tid == 0:
            cuda.atomic.add(counters, (IDQ, WRITE), rows * d)

    return flash2_bwd_dq, NT


_SOURCES = {"fwd": _fwd_source, "preprocess": _preprocess_source, "dkdv": _dkdv_source, "dq": _dq_source}


def _key(dtype, d, br, bc, causal, has_mask, count):
    return (_name(dtype), padded_head_dim(d), int(br), int(bc), bool(causal), bool(has_mask), bool(count))


@cache
def _jit(kind: str, key: tuple):
    fn, nt = _SOURCES[kind](*key)
    return cuda.jit(fn), nt


def kernel(kind: str, dtype, d: int, br: int, bc: int, causal: bool, has_mask: bool, count: bool):
    """The compiled kernel of ``kind`` ("fwd", "preprocess", "dkdv", "dq") and its block size."""
    return _jit(kind, _key(dtype, d, br, bc, causal, has_mask, count))


def signature(kind: str, dtype):
    """Numba signature of a kernel for C-contiguous arrays of ``dtype``."""
    t = _NUMBA_DTYPES[_name(dtype)]
    a4 = types.Array(t, 4, "C")
    st = types.Array(float32, 3, "C")
    mask = types.Array(uint8, 2, "C")
    cnt = types.Array(int64, 2, "C")
    if kind == "fwd":
        return types.void(a4, a4, a4, a4, st, float32, mask, cnt)
    if kind == "preprocess":
        return types.void(a4, a4, st, cnt)
    if kind == "dkdv":
        return types.void(a4, a4, a4, a4, st, st, a4, a4, float32, mask, cnt)
    if kind == "dq":
        return types.void(a4, a4, a4, a4, st, st, a4, float32, mask, cnt)
    raise ValueError(f"kind={kind!r}")


def ptx(kind: str, dtype=np.float16, d: int = 64, block_m: int | None = None, block_n: int | None = None,
        causal: bool = True, has_mask: bool = False, count: bool = False, cc=(9, 0)) -> str:
    """sm_90 PTX of one kernel, compiled with NVRTC/NVVM (needs no GPU; not under the simulator)."""
    pass_ = "fwd" if kind == "fwd" else "bwd"
    if block_m is None or block_n is None:
        block_m, block_n = default_blocks(pass_, dtype, d)
    fn, _ = _SOURCES[kind](*_key(dtype, d, block_m, block_n, causal, has_mask, count))
    text, _ = cuda.compile_ptx(fn, signature(kind, dtype), cc=cc)
    return text


# ---------------------------------------------------------------------------------------------
# Launchers


def _prepare_mask(block_mask, br, bc, nq, nk, stream=0):
    """Device uint8 (Tr, Tc) array for a BlockMask (whose blocks fix Br, Bc), or a dummy."""
    if block_mask is None:
        return cuda.to_device(np.ones((1, 1), dtype=np.uint8), stream=stream), br, bc
    from flashsim.config import BlockMask, cdiv

    if not isinstance(block_mask, BlockMask):
        raise ValueError(f"block_mask={type(block_mask).__name__}: must be a flashsim.config.BlockMask")
    mb, nb = block_mask.block_m, block_mask.block_n
    if br is not None and br != mb or bc is not None and bc != nb:
        raise ValueError(f"block_mask blocks={(mb, nb)}: must equal the kernel's (block_m, block_n)={(br, bc)}")
    want = (cdiv(nq, mb), cdiv(nk, nb))
    if block_mask.shape != want:
        raise ValueError(f"block_mask.shape={block_mask.shape}: must be {want} for Nq={nq}, Nk={nk} "
                         f"and blocks {mb}x{nb}")
    return cuda.to_device(block_mask.array.astype(np.uint8), stream=stream), mb, nb


def _blocks(pass_, dtype, d, block_m, block_n, block_mask, nq, nk, stream=0):
    mask, br, bc = _prepare_mask(block_mask, block_m, block_n, nq, nk, stream)
    if br is None or bc is None:
        dbr, dbc = default_blocks(pass_, dtype, d)
        br = dbr if br is None else br
        bc = dbc if bc is None else bc
    check_blocks(pass_, dtype, d, br, bc)
    return mask, br, bc


def _scale(scale, d):
    if scale is None:
        return float32(1.0 / math.sqrt(d))
    from ._arrays import check_scale

    return float32(check_scale(scale))


def _inputs(names_values, **options):
    from ._arrays import check_attention_shapes, to_device

    inp = to_device(**dict(names_values), bf16=True, **options)
    a = inp.arrays
    shape = check_attention_shapes(a["q"], a["k"], a["v"], a.get("do"))
    if shape[0] * shape[1] > 65535:  # the grid's y dimension holds (batch, head)
        raise ValueError(f"batch*heads={shape[0] * shape[1]}: at most 65535")
    if "o" in a and tuple(a["o"].shape) != tuple(a["q"].shape):
        raise ValueError(f"o.shape={tuple(a['o'].shape)}: must equal q.shape={tuple(a['q'].shape)}")
    return inp, shape


def forward(q, k, v, *, causal=False, scale=None, block_m=None, block_n=None, block_mask=None,
            return_lse=False, counters=None, stream=None):
    """See :func:`kernels.flash_attention`."""
    inp, (nb, nh, nhk, nq, nk, d) = _inputs((("q", q), ("k", k), ("v", v)), stream=stream, causal=causal,
                                            scale=scale, return_lse=return_lse)
    a, dt = inp.arrays, inp.dtype_name
    mask, br, bc = _blocks("fwd", dt, d, block_m, block_n, block_mask, nq, nk, inp.stream)
    cnt, back = device_counters(counters, inp.stream)
    o = inp.empty((nb, nh, nq, d), inp.dtype)
    lse = inp.empty((nb, nh, nq), np.float32)
    kern, nt = kernel("fwd", dt, d, br, bc, causal, block_mask is not None, counters is not None)
    kern[(-(-nq // br), nb * nh), nt, inp.stream](a["q"], a["k"], a["v"], o, lse, _scale(scale, d), mask, cnt)
    back(cnt)
    if return_lse:
        return inp.out(o), inp.out(lse)
    return inp.out(o)


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, block_m=None, block_n=None, block_mask=None,
             counters=None, stream=None):
    """See :func:`kernels.flash_attention_backward`."""
    from ._arrays import to_device

    inp, (nb, nh, nhk, nq, nk, d) = _inputs((("q", q), ("k", k), ("v", v), ("o", o), ("do", do)), stream=stream,
                                            causal=causal, scale=scale)
    a, dt = inp.arrays, inp.dtype_name
    if lse is None:
        raise ValueError("lse=None: pass the logsumexp L returned by flash_attention(..., return_lse=True)")
    st = to_device(lse=lse, stream=inp.stream)
    if st.host != inp.host:
        raise ValueError("inputs mix host (numpy) and device arrays: pass all on the host or all on the device")
    lse_d = st.arrays["lse"]
    if np.dtype(lse_d.dtype) != np.float32:
        raise ValueError(f"lse.dtype={lse_d.dtype}: must be float32 (the forward's logsumexp)")
    if tuple(lse_d.shape) != (nb, nh, nq):
        raise ValueError(f"lse.shape={tuple(lse_d.shape)}: must be {(nb, nh, nq)}")
    mask, br, bc = _blocks("bwd", dt, d, block_m, block_n, block_mask, nq, nk, inp.stream)
    cnt, back = device_counters(counters, inp.stream)
    sc = _scale(scale, d)
    has_mask, count = block_mask is not None, counters is not None
    tr, tc = -(-nq // br), -(-nk // bc)
    dvec = inp.empty((nb, nh, nq), np.float32)
    dq = inp.empty((nb, nh, nq, d), inp.dtype)
    dk = inp.empty((nb, nhk, nk, d), inp.dtype)
    dv = inp.empty((nb, nhk, nk, d), inp.dtype)
    kern, nt = kernel("preprocess", dt, d, br, bc, causal, has_mask, count)
    kern[(tr, nb * nh), nt, inp.stream](a["o"], a["do"], dvec, cnt)
    kern, nt = kernel("dkdv", dt, d, br, bc, causal, has_mask, count)
    kern[(tc, nb * nhk), nt, inp.stream](a["q"], a["k"], a["v"], a["do"], lse_d, dvec, dk, dv, sc, mask, cnt)
    kern, nt = kernel("dq", dt, d, br, bc, causal, has_mask, count)
    kern[(tr, nb * nh), nt, inp.stream](a["q"], a["k"], a["v"], a["do"], lse_d, dvec, dq, sc, mask, cnt)
    back(cnt)
    return inp.out(dq), inp.out(dk), inp.out(dv)
