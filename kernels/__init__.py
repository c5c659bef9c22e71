"""Numba CUDA attention kernels held against the flashsim simulator.

Public API (arrays are (B, H, N, d); K and V may have fewer heads, Hkv dividing H):

* :func:`flash_attention` and :func:`flash_attention_backward`: FlashAttention-2
  (``kernels/flash2.py``);
* :func:`flash1_attention` (``kernels/flash1.py``) and :func:`standard_attention` /
  :func:`standard_attention_backward` (``kernels/standard.py``);
* :func:`decode_attention`: decoding against a KV cache, split-KV with a combine, paged caches,
  variable lengths, sliding windows (``kernels/decode.py``, fast: ``kernels/perf/decode.py``).

Every launcher takes ``counters=`` (an int64 array from :func:`kernels.counters.new_counters`,
on the host or the device): the counting variant of the kernels then adds every global-memory
tile transfer, in elements, per tensor and direction (host arrays are filled in place).

Every launcher takes ``stream=`` too: all copies, allocations and launches of one call run on
one stream, the one given (a Numba stream, or a torch stream), else torch's current stream on
the query's device when the inputs are torch tensors (so the kernels run after whatever wrote
their inputs on that stream, and the results, allocated by torch there, are ready on it without
any synchronisation), else Numba's default stream.  numpy results are copied back and the stream
synchronised before the call returns.
"""

from __future__ import annotations

from . import _sim

_sim.lock_shared_arrays()  # before any kernel runs under the CUDA simulator (a no-op on a GPU)
_sim.event_barrier()

from . import flash2 as _flash2  # noqa: E402
from .flash1 import flash1_attention  # noqa: E402
from .standard import standard_attention, standard_attention_backward  # noqa: E402


def _dtype_and_dim(q):
    """(dtype name, head dim) of the query, (None, None) if it has none."""
    from ._arrays import dtype_name

    dt = dtype_name(getattr(q, "dtype", None))
    try:
        return dt, int(q.shape[-1])
    except (TypeError, ValueError, IndexError, AttributeError):
        return None, None


def _fast(pass_, q, impl, deterministic=False, arrays=None, **fixed):
    """The fast variant's module to run, or None for the reference kernels.

    ``impl="auto"`` takes the fast one when it applies: its dtype and head dim are supported
    (``deterministic``: it sums nothing by atomics), nothing asks for the reference kernel's
    own tiling (block sizes, a block mask) or its traffic counters, and every device array of
    ``arrays`` (name -> array) is 16-byte aligned (``_arrays.misaligned``).  ``impl="fast"``
    insists (ValueError if it does not apply)."""
    if impl not in ("auto", "fast", "reference"):
        raise ValueError(f"impl={impl!r}: must be 'auto', 'fast' or 'reference'")
    if impl == "reference":
        return None
    from . import perf

    dt, d = _dtype_and_dim(q)
    mod = perf.best(pass_, dt, d, deterministic) if dt is not None and len(q.shape) == 4 else None
    given = sorted(k for k, v in fixed.items() if v is not None)
    if impl == "fast":
        if mod is None:
            what = " deterministic" if deterministic else ""
            raise ValueError(f"impl='fast': no fast{what} {pass_} kernel for dtype={dt}, head_dim={d}")
        if given:
            raise ValueError(f"impl='fast': {', '.join(given)} are options of the reference kernel only")
        from ._arrays import check_fast_alignment

        check_fast_alignment(**(arrays or {}))
        return mod
    from ._arrays import misaligned

    return None if given or misaligned(**(arrays or {})) else mod


def _torch_deterministic(q) -> bool:
    """torch's deterministic-algorithms setting for torch inputs (False for any other input)."""
    from ._arrays import _is_torch

    if not _is_torch(q):
        return False
    import torch

    enabled = getattr(torch, "are_deterministic_algorithms_enabled", None)  # (absent from stand-ins)
    return bool(enabled()) if enabled is not None else False


def _tuned(pass_, mod, q, k, causal) -> dict:
    """The block shape the tuner cached for this call (``kernels.perf.autotune``), {} for the
    variant's default_config."""
    from .perf import autotune

    return autotune.tuned_config(pass_, mod, q, k, causal)


def flash_attention(q, k, v, *, causal=False, scale=None, block_m=None, block_n=None, block_mask=None,
                    return_lse=False, counters=None, impl="auto", stream=None):
    """FlashAttention-2 forward: O = softmax(τ Q Kᵀ + mask) V, and L = logsumexp of each row.

    ``q`` is (B, H, Nq, d), ``k`` and ``v`` are (B, Hkv, Nk, d) with Hkv dividing H (query head h
    uses kv head h // (H/Hkv)).  Any Nq, Nk >= 1; any head dim whose tiles fit 48 KB of static
    shared memory (tested 16..128; up to about 256 with the smallest blocks; d is padded on chip
    to a multiple of 16, so 24 or 59 work).  float32, float16 or bfloat16 inputs, all the same
    (bfloat16 as torch tensors, CPU or CUDA: numpy has no bfloat16; they pass as their int16
    bits); accumulation is float32.  ``scale`` τ defaults to 1/sqrt(d).  Default blocks
    (:func:`kernels.flash2.default_blocks`): the largest of 64x64, 64x32, 32x32, ... whose
    kernels fit, e.g. 64x32 for fp16 d = 64, 32x32 for fp16 d = 128, 16x16 for fp32 d = 128.

    Inputs: numpy arrays are copied to the device and results come back as numpy (CPU torch
    tensors alike, their results as CPU tensors); Numba device arrays and
    ``__cuda_array_interface__`` objects (torch, CuPy) are used in place and results come back in
    the query's kind.  ValueError for: arrays that are not 4-D or whose shapes
    disagree, zero-size dimensions, dtypes other than float32/float16/bfloat16 or mixed dtypes, device
    arrays that are not C-contiguous, a mix of host and device inputs, block sizes whose kernels
    do not fit 48 KB of static shared memory, an array given as None, a float16/float32 torch tensor
    that requires grad (detach it, or use ``kernels.torch_op.attention``), ``causal`` or
    ``return_lse`` that is not a bool (numpy bools count), a ``scale`` that is not None or a
    finite real number (numpy scalars count) or whose τ·log2(e) overflows float32 (|τ| above
    about 2.4e38: ``kernels._arrays.SCALE_MAX``), an unknown ``impl``, and with ``impl="fast"`` a device
    array whose data pointer is not 16-byte aligned (a tensor sliced at an odd offset: the fast
    kernels copy 16 bytes at a time; ``impl="auto"`` runs the reference kernel for it).  Any finite ``scale`` works,
    zero and negative included, on the reference and the fast kernels (the fast ones run
    τ <= 0 as Q' = -Q, τ' = -τ, or Q' = 0·Q, τ' = 1: ``kernels.perf._launch.positive_scale``).
    ``stream``: see the module docstring.

    ``causal`` is aligned bottom-right: query i sees key j iff j <= i + Nk - Nq (flash-attention
    >= 2.1).  This differs from PyTorch's ``is_causal=True`` (top-left: j <= i) unless Nq == Nk.
    Key blocks a query block cannot see are never loaded.  ``block_mask`` (a
    :class:`flashsim.config.BlockMask`) skips whole blocks; its block sizes become the kernel's
    and must equal ``block_m``/``block_n`` if those are given.

    A query row that sees no key gets O = 0 and L = -inf.  A NaN in the inputs propagates to
    the rows that use it: a NaN in Q row r (that sees a key) makes O row r and L_r NaN, on the
    reference and the fast kernels alike; a NaN in an unmasked key
    or value row makes every query row that attends it NaN.  Masked entries are never read into
    the arithmetic, so a NaN there has no effect.  An inf in the inputs follows IEEE arithmetic as
    naive attention does on the reference and the fp16/bf16 kernels; the fp32 fast kernels split
    each value as hi + lo for 3xTF32 (inf - inf is NaN), so there every row an inf reaches is NaN
    (run ``impl="reference"`` for such inputs).

    Returns O (the input dtype), and with ``return_lse=True`` also L (float32, (B, H, Nq)),
    which :func:`flash_attention_backward` needs (for CPU bfloat16 tensors both come back as CPU
    torch tensors).  Extra device memory: O and L only, O(N·d).

    ``impl``: "reference" runs the readable kernel of ``kernels/flash2.py`` (the one whose
    traffic counters equal the simulator's); "fast" the fastest numbered variant of
    ``kernels/perf`` (fp16 and bf16 on the tensor cores, head dim a multiple of 8; fp32 on the CUDA cores,
    d a multiple of 4); "auto" (default) the fast one where it applies (no block sizes, block
    mask or counters given),
    else the reference.  Both compute the same function to within the stated tolerances.  The
    fast one runs the block shape that ``python -m kernels.perf.autotune`` cached for this GPU,
    kernel version, dtype, d, causal and N bucket where the cache holds one, else the variant's
    ``default_config``.
    """
    mod = _fast("fwd", q, impl, arrays=dict(q=q, k=k, v=v), block_m=block_m, block_n=block_n, block_mask=block_mask,
                counters=counters)
    if mod is not None:
        cfg = _tuned("fwd", mod, q, k, causal)
        return mod.forward(q, k, v, causal=causal, scale=scale, return_lse=return_lse, stream=stream, **cfg)
    return _flash2.forward(q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n,
                           block_mask=block_mask, return_lse=return_lse, counters=counters, stream=stream)


def flash_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, block_m=None, block_n=None,
                             block_mask=None, counters=None, impl="auto", stream=None, deterministic=None):
    """FlashAttention-2 backward: (dQ, dK, dV) of Σ O ∘ dO, recomputing P from Q, K and L.

    ``o`` and ``lse`` are the forward's outputs (O in the input dtype, L float32 (B, H, Nq), on
    the same side, host or device, as the other inputs); ``do`` has O's shape and dtype.  The
    reference kernels (``impl="reference"``, or where no fast kernel applies) are three
    deterministic kernels (no atomics): D = rowsum(dO ∘ O); dK, dV per key block, summed over the
    query heads that share the kv head; dQ per query block.  dK and dV have the kv heads' shape
    (B, Hkv, Nk, d).  Options and input rules as :func:`flash_attention`; the default block
    sizes may be smaller than the forward's (the backward keeps more tiles on chip) unless a
    block mask fixes them.  Fully masked rows (L = -inf) contribute nothing: their dQ row is 0
    and they add nothing to dK, dV.  NaN propagates to the gradients computed from it.
    ``impl`` as in :func:`flash_attention`.  The fast backwards: fp16 and bf16 on the tensor cores,
    at d = 64 and 128 one kernel that accumulates dQ in float32 with atomic adds across key blocks
    (``bwd_fp16_v3``), at other d the deterministic pair of kernels (``bwd_fp16_v1``); fp32 at d =
    32, 64, 128 on the TF32 tensor cores with each product taken as three (3xTF32: x = hi + lo, as
    accurate as fp32 FFMA; ``bwd_fp32_v2``), at other d on the CUDA cores (``bwd_fp32_v1``), both
    with dQ by atomic adds.  Where dQ is summed by atomics its rounding can differ from run to run
    in the last bits (~1 ulp of the float32 sum); dK, dV are deterministic.  ``deterministic=True``
    runs no kernel with atomics: ``bwd_fp16_v1`` for fp16 and bf16, the reference kernels for fp32
    (with ``impl="fast"``, a ValueError where no fast kernel is deterministic); None (the default)
    takes torch's ``torch.are_deterministic_algorithms_enabled()`` for torch tensors, else False;
    anything but None or a bool (numpy bools count) is a ValueError naming it.
    """
    import numpy as np

    if deterministic is None:
        deterministic = _torch_deterministic(q)
    elif not isinstance(deterministic, (bool, np.bool_)):  # numpy bools count, as for causal
        raise ValueError(f"deterministic={deterministic!r}: must be None or a bool")
    if lse is not None and "float32" not in str(getattr(lse, "dtype", "float32")):
        raise ValueError(f"lse.dtype={lse.dtype}: must be float32 (the forward's logsumexp)")
    mod = _fast("bwd", q, impl, deterministic=bool(deterministic), arrays=dict(q=q, k=k, v=v, o=o, do=do),
                block_m=block_m, block_n=block_n, block_mask=block_mask, counters=counters)
    if mod is not None:
        cfg = _tuned("bwd", mod, q, k, causal)
        return mod.backward(q, k, v, o, lse, do, causal=causal, scale=scale, stream=stream, **cfg)
    return _flash2.backward(q, k, v, o, lse, do, causal=causal, scale=scale, block_m=block_m, block_n=block_n,
                            block_mask=block_mask, counters=counters, stream=stream)


def decode_attention(q, k_cache, v_cache, *, cache_seqlens=None, cu_seqlens_k=None, block_table=None,
                     page_size=None, num_splits=None, window=None, causal=True, scale=None, block_n=None,
                     impl="auto", counters=None, stream=None):
    """Decoding: Nq query rows per sequence against its KV cache; returns (O, L).

    ``q`` is (B, Hq, Nq, d).  The cache is contiguous, ``k_cache``/``v_cache`` (B, Hkv, Nk_max, d),
    or paged with ``block_table`` (B, max_pages_per_seq) of int32 page numbers: (num_pages, P, Hkv,
    d) as in vLLM and flash-attention (or (num_pages·P, Hkv, d) with ``page_size=P``).  Hkv
    divides Hq (query head h uses kv head h // (Hq/Hkv)).  ``cache_seqlens`` (B,) gives each
    sequence's length L_b (or ``cu_seqlens_k`` (B+1,), cumulative: L_b = cu[b+1] - cu[b]; neither:
    every sequence fills the cache), Nq <= L_b <= Nk_max (max_pages_per_seq·P when paged).  Query
    row i of sequence b sits at position L_b - Nq + i and sees keys j <= that position (``causal``,
    bottom-right; ``causal=False``: every key j < L_b), and with ``window=(left, right)`` only
    pos - left <= j <= pos + right (-1: unbounded on that side).  Rows are never empty (each sees
    its own position).  ``scale`` τ defaults to 1/sqrt(d).

    Returns O (B, Hq, Nq, d) in the input precision and L (B, Hq, Nq), the float32 logsumexp of
    the scaled scores, in the query's kind (numpy for numpy; torch tensors, CPU or CUDA, for
    torch; a device array for device arrays).  float32, float16 and bfloat16 (torch tensors only:
    numpy has no bfloat16); accumulation in float32.

    The key range of each (sequence, kv head) is cut into ``num_splits`` parts run by separate
    thread blocks, each writing a float32 partial O and logsumexp, and a combine launch merges
    them (flash-decoding); the g = Hq/Hkv query heads of one kv head share a thread block, so K
    and V are read once (GQA packing).  The schedule is in ``kernels/decode.py``'s docstring.
    ``num_splits`` None: 1 on the reference kernel, a count that fills the GPU on the fast one
    (``kernels.perf.decode.default_splits``).  ``block_n``: the reference kernel's key block Bc
    (default ``kernels.decode.default_block_n``).

    ``impl``: "reference" (``kernels/decode.py``, whose ``counters=`` -- an int64 array from
    :func:`kernels.counters.new_counters` -- count every transfer in elements, per tensor Q, K,
    V, O, L, Op, Lp and BT), "fast" (``kernels/perf/decode.py``), "auto" (the fast one unless
    ``counters`` or ``block_n`` is given, or its tiles would not fit shared memory).  ``stream``:
    as :func:`flash_attention`; block tables and lengths given on the device are copied to the
    host to be checked (a synchronisation).

    ValueError, naming the field, for: shapes that disagree (q not 4-D, k_cache and v_cache
    different, batch or head_dim that differ, Hkv not dividing Hq), a block table that is not
    (B, pages) or holds a page number outside [0, num_pages) for a page a sequence uses, a
    ``page_size`` that does not divide a 3-D cache or differs from the cache's, lengths of the
    wrong count, above Nk_max or below Nq, ``cu_seqlens_k`` not starting at 0 or decreasing, both
    length forms given, ``num_splits`` above the key blocks of the longest sequence (or < 1), a
    window that is not a pair of integers >= -1, dtypes other than float32/float16/bfloat16 or
    mixed, host and device inputs mixed, query rows per kv head whose tiles do not fit 48 KB of
    shared memory.
    """
    from . import decode as _decode

    if impl not in ("auto", "fast", "reference"):
        raise ValueError(f"impl={impl!r}: must be 'auto', 'fast' or 'reference'")
    kw = dict(cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k, block_table=block_table,
              page_size=page_size, num_splits=num_splits, window=window, causal=causal, scale=scale,
              stream=stream)
    given = [name for name, x in (("counters", counters), ("block_n", block_n)) if x is not None]
    if impl == "fast" and given:
        raise ValueError(f"impl='fast': {', '.join(given)} are options of the reference kernel only")
    if impl == "reference" or given:
        return _decode.forward(q, k_cache, v_cache, block_n=block_n, counters=counters, **kw)
    from .perf import decode as _fast_decode

    p = _decode.plan(q, k_cache, v_cache, **{n: kw[n] for n in kw if n != "num_splits"})
    if impl == "auto" and not _fast_decode.supports(p.dt, p.d, p.group * p.nq, p.page_size):
        return _decode.forward(q, k_cache, v_cache, _plan=p, **kw)  # tiles too large for the fast kernel
    return _fast_decode.forward(q, k_cache, v_cache, _plan=p, **kw)


__all__ = ["flash_attention", "flash_attention_backward", "flash1_attention", "standard_attention",
           "standard_attention_backward", "decode_attention"]
