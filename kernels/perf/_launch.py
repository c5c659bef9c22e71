"""What the numbered variants share: the forward launcher (inputs, block shape, shared memory,
grid) and the backward's input checks, D = rowsum(dO ∘ O) preprocess, and the zeroed float32 dQ
buffer of the one-kernel backwards with its rounding to fp16 (or bf16).

bfloat16: the inputs arrive as their int16 bits (``kernels._arrays.BF16``); the tensor-core
kernels take them as float16 arrays (:func:`tc_view`, no copy), which they never read as fp16
numbers (``cp.async`` and ``ldmatrix`` move bits, the mma and the packing are compiled for bf16:
``bf16=True``); the elementwise helpers here widen and round through the bits
(``kernels/_bf16.py``)."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import config, cuda, float32

from .. import _direct
from .._arrays import FAST_ALIGN
from .._bf16 import cvt_bf16, ld_bf16
from .._direct import launch

#: log2(e): the kernels exponentiate with ex2, in log2 units (the one definition).
LOG2E = 1.4426950408889634


_RAISED: dict = {}


def raise_smem_limit(kern, args, nbytes: int) -> None:
    """``kernels.flash1._raise_smem_limit``, done once per (kernel, size): the driver attribute
    sticks to the compiled function, and looking it up costs host time on every call."""
    if config.ENABLE_CUDASIM or nbytes <= 48 * 1024:
        return
    key = (id(kern), nbytes)
    if key not in _RAISED:
        from ..flash1 import _raise_smem_limit

        _raise_smem_limit(kern, args, nbytes)
        _RAISED[key] = kern  # holds the dispatcher, so its id is never reused


_SMS: dict = {}


def num_sms() -> int:
    """The current device's SM count, asked once (0 under the simulator, which reports none: the
    launches keep their block shapes there, as the simulator's schedules without ``sms`` do)."""
    if "n" not in _SMS:
        dev = cuda.get_current_device()
        _SMS["n"] = int(getattr(dev, "MULTIPROCESSOR_COUNT", 0) or 0)
    return _SMS["n"]


def _merged_config(cfg: dict, config, who: str) -> dict:
    """The default block shape ``cfg`` updated by the caller's ``config``: ValueError for a key the
    variant does not take, a value not of its default's kind (``flashsim.algorithms.fast.
    check_config_values``) or more than 32 warps (1,024 threads) a block."""
    from flashsim.algorithms.fast import check_config_values

    config = config or {}
    unknown = set(config) - set(cfg)
    if unknown:
        raise ValueError(f"config keys {sorted(unknown)}: {who} takes {sorted(cfg)}")
    check_config_values(cfg, config)
    return dict(cfg, **config)


def launch_forward(name, kernel, smem_bytes, default_config, supports, q, k, v, *, causal=False, scale=None,
                   return_lse=False, config=None, stream=None, maps=None, split=None):
    """Run variant ``name``'s forward kernel on (B, H, N, d) inputs; O (and L) in the query's kind.

    ``kernel(d=..., causal=..., **cfg)`` returns (compiled kernel, threads, Br) for the block shape
    ``cfg`` (:func:`default_config` of d, updated by ``config``); the kernel's arguments are
    (q, k, v, o, lse, τ·log2 e, τ) and its dynamic shared memory is ``smem_bytes(dp, Br, Bc)``.
    ``stream`` (also accepted inside ``config``): see :func:`kernels._arrays.launch_stream`.
    ``maps(k, v, d, bc)``: the kernel's one more argument, the tensor maps of K and V (v7).
    ``split`` (v5, v7: ``combine(d, bf16)``, the combine launch's kernel, and ``smem(dp, Br)``, the
    shared memory its epilogue needs): with ``splits`` > 1 in the block shape the kernel runs over
    a grid (Tr, B·H, S) writing float32 partials, and a second launch merges them.
    A call on torch tensors that repeats an earlier one's key takes the launch that call
    prepared (:func:`with_plan`).
    """
    opts = dict(config or {}, causal=causal, scale=scale, return_lse=return_lse)
    if stream is not None:
        opts["stream"] = stream
    return with_plan(plan_key(name, (q, k, v), opts), (q, k, v),
                     lambda: _forward(name, kernel, smem_bytes, default_config, supports, q, k, v, causal=causal,
                                      scale=scale, return_lse=return_lse, config=config, stream=stream, maps=maps,
                                      split=split))


def _forward(name, kernel, smem_bytes, default_config, supports, q, k, v, *, causal, scale, return_lse, config,
             stream, maps=None, split=None):
    from .._arrays import check_attention_shapes, check_fast_alignment, to_device

    config = dict(config or {})
    stream = config.pop("stream", stream)
    inp = to_device(q=q, k=k, v=v, stream=stream, causal=causal, scale=scale, return_lse=return_lse, bf16=True)
    a = inp.arrays
    check_fast_alignment(**a)
    nb, nh, nhk, nq, nk, d = check_attention_shapes(a["q"], a["k"], a["v"])
    if not supports(inp.dtype_name, d):
        raise ValueError(f"dtype={inp.dtype_name}, head_dim={d}: not supported by {name.rsplit('.', 1)[-1]}")
    if nb * nh > 65535:
        raise ValueError(f"batch*heads={nb * nh}: at most 65535")
    cfg = _merged_config(default_config(d), config, "this variant")
    from flashsim.algorithms.fast import fit_to_grid

    cfg = fit_to_grid(name.rsplit(".", 1)[-1], cfg, config, nq, nb * nh, num_sms(), d=d, nk=nk)
    if cfg["bc"] <= 0 or cfg["bc"] % 16:
        raise ValueError(f"bc={cfg['bc']}: must be a positive multiple of 16")
    splits = cfg.get("splits", 1)  # checked with the others (1..MAX_SPLITS) by _merged_config
    from ..flash2 import padded_head_dim

    dp = padded_head_dim(d)
    kern, nt, br = kernel(d=d, causal=bool(causal), **cfg, **({"bf16": True} if inp.bf16 else {}))
    sc = positive_scale(inp, a, 1.0 / math.sqrt(d) if scale is None else float(scale))
    o = inp.empty((nb, nh, nq, d), inp.dtype)
    lse = inp.empty((nb, nh, nq), np.float32)
    smem = smem_bytes(dp, br, cfg["bc"])
    grid = (-(-nq // br), nb * nh)
    if splits > 1:  # the kernel writes float32 partials of S splits of the keys; a second launch merges them
        op = inp.empty((splits * nb, nh, nq, d), np.float32)
        lp = inp.empty((splits * nb, nh, nq), np.float32)
        args = (*tc_view(inp, a["q"], a["k"], a["v"]), op, lp, float32(sc * LOG2E), float32(sc))
        smem = max(smem, split.smem(dp, br))
        grid = (*grid, splits)
    else:
        args = (*tc_view(inp, a["q"], a["k"], a["v"], o), lse, float32(sc * LOG2E), float32(sc))
    if maps is not None:
        args = (*args, maps(args[1], args[2], d, cfg["bc"]))
    raise_smem_limit(kern, args, smem)
    launch(kern, grid, nt, inp.stream, smem, *args)
    if splits > 1:
        flat = (x.reshape(x.size) for x in (op, lp, o, lse))  # the combine indexes them flat
        launch(split.combine(d, inp.bf16), (-(-nq * d // (split.threads * split.elems)), nb * nh), split.threads,
               inp.stream, 0, *flat, nq, nb * nh)
    if return_lse:
        return inp.out(o), inp.out(lse)
    return inp.out(o)


# ---------------------------------------------------------------------------------------------
# Prepared calls: a call on torch tensors that repeats an earlier call's shapes and options
# replays the launches that call made, with new buffers and pointers, without the checks.

#: plan_key -> the replay of that key (:func:`_replay`); dropped with the streams
#: (``kernels._direct.forget_streams``).
_PLANS: dict = {}
_direct.ON_FORGET.append(_PLANS.clear)


def plan_key(name, tensors, options):
    """What fixes a call's launches on torch tensors: the variant, its options (block-shape
    overrides included), each tensor's shape, dtype and device, the current device and its torch
    stream; None where a call may not be prepared (not all torch CUDA tensors, one that is not
    contiguous or requires grad, an explicit stream, a scale that is not a positive number, an
    option that cannot be a key, the simulator, ``FLASHSIM_DIRECT_LAUNCH=0``)."""
    if not _direct.enabled() or options.get("stream") is not None:
        return None
    scale = options.get("scale")
    if scale is not None and not (type(scale) in (int, float) and scale > 0):
        return None
    try:
        for t in tensors:
            if type(t).__module__ != "torch" or not t.is_cuda or t.requires_grad or not t.is_contiguous():
                return None
        import torch

        key = (name, tuple(sorted((k, v) for k, v in options.items() if k != "stream")),
               tuple((t.shape, t.dtype, t.get_device()) for t in tensors), torch._C._cuda_getDevice(),
               torch._C._cuda_getCurrentRawStream(tensors[0].get_device()))
        hash(key)
        return key
    except Exception:  # noqa: BLE001 - anything unexpected (an unhashable option, no such torch call): no plan
        return None


def with_plan(key, tensors, full):
    """``full()`` (the call's whole path: checks, buffers, launches), or, for a key (:func:`plan_key`)
    an earlier call prepared, its replay on ``tensors``.  The first call of a key runs ``full``
    under a :class:`kernels._direct.Recorder` and prepares its launches (:func:`_replay`); a call
    inside another call being recorded takes its full path (so that the outer one sees its
    launches), and so does a call the replay declines (a tensor whose data pointer is not 16-byte
    aligned: the full path refuses it, :func:`kernels._arrays.check_fast_alignment`)."""
    if key is None or _direct.recording():
        return full()
    plan = _PLANS.get(key)
    if plan is not None:
        out = plan(tensors)
        return full() if out is None else out
    with _direct.Recorder() as rec:
        out = full()
    plan = _replay(rec, tensors, out)
    if plan is not None:
        if len(_PLANS) >= 1024:
            _PLANS.clear()
        _PLANS[key] = plan
    return out


def _replay(rec, tensors, out):
    """A function of new tensors of the same key that allocates the buffers ``rec`` saw (same
    shapes, dtypes and device, torch's allocator, as :meth:`kernels._arrays.Inputs.empty` does on
    the current device, which the key holds), makes its launches (:func:`kernels._direct.prepare`)
    with each array argument's pointer taken from the same input or buffer, and returns the same
    buffers as ``out``; None where that cannot be exact: inputs that share memory, a launch the
    direct path does not take, an array argument that is neither an input, a buffer,
    :data:`kernels._direct.PERSISTENT` nor made from inputs (:data:`kernels._direct.DERIVED`, made
    again from the new inputs' pointers), a result that is not one of the buffers."""
    ins = {}
    for i, t in enumerate(tensors):
        p = t.data_ptr()
        if p in ins or p == 0:
            return None
        ins[p] = i
    bufs = {t.data_ptr(): j for j, t in enumerate(rec.allocs)}
    if len(bufs) != len(rec.allocs) or 0 in bufs:
        return None
    steps = []
    for kern, grid, block, stream, smem, args in rec.launches:
        prep = _direct.prepare(kern, grid, block, stream, smem, args)
        if prep is None:
            return None
        srcs = []
        for p in prep.pointers:
            if p in ins:
                srcs.append((0, ins[p]))
            elif p in bufs:
                srcs.append((1, bufs[p]))
            elif p in _direct.PERSISTENT:
                srcs.append((2, p))
            elif p in _direct.DERIVED and all(x in ins for x in _direct.DERIVED[p][1]):
                make, from_ = _direct.DERIVED[p]
                srcs.append((3, (make, tuple(ins[x] for x in from_))))
            else:
                return None
        steps.append((prep, tuple(srcs)))
    single = not isinstance(out, tuple)
    idx = []
    for o in (out,) if single else out:
        j = next((j for j, t in enumerate(rec.allocs) if t is o), None)
        if j is None:
            return None
        idx.append(j)
    specs = [(tuple(t.shape), t.dtype, t.device) for t in rec.allocs]
    import torch

    empty = torch.empty

    def run(tensors):
        """The replay's outputs, or None for tensors the full path must see (misaligned ones)."""
        ptr = [t.data_ptr() for t in tensors]
        if any(p % FAST_ALIGN for p in ptr):
            return None
        made = [empty(shape, dtype=dt, device=dev) for shape, dt, dev in specs]
        mp = [t.data_ptr() for t in made]
        for prep, srcs in steps:
            prep(*[ptr[i] if kind == 0 else mp[i] if kind == 1 else i if kind == 2 else i[0](*[ptr[x] for x in i[1]])
                   for kind, i in srcs])
        res = tuple(made[j] for j in idx)
        return res[0] if single else res

    return run


def prepared_backward(name, fn):
    """``fn`` (a variant's ``backward(q, k, v, o, lse, do, **options)``) with its calls on torch
    tensors prepared per key (:func:`with_plan`)."""

    def backward(q, k, v, o, lse, do, **options):
        t = (q, k, v, o, lse, do)
        return with_plan(plan_key(name, t, options), t, lambda: fn(q, k, v, o, lse, do, **options))

    backward.__doc__, backward.__name__, backward.__wrapped__ = fn.__doc__, fn.__name__, fn
    return backward


def saved_forward(q, k, v, *, causal=False, scale=None):
    """(O, L) from the shipped forward for the inputs' dtype and head dim (``BEST``, as
    ``kernels.flash_attention(impl="fast")`` runs it): what a fast backward needs."""
    from .. import flash_attention

    return flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True, impl="fast")


def prepare_backward(requirement, default_config, supports, q, k, v, o, lse, do, *, scale=None, config=None,
                     causal=False, stream=None):
    """The checks every fast backward makes before it launches anything.

    Returns (inputs, arrays, (B, H, Hkv, Nq, Nk, d), L on the device, block-shape config, τ for the
    kernels (> 0: see :func:`positive_scale`; :func:`finish_dq` then fixes dQ)).  ``requirement``
    ends the unsupported-input message ("bwd_fp16_v1 takes float16 with ...").  ``stream`` (also
    accepted inside ``config``): see :func:`kernels._arrays.launch_stream`."""
    from .._arrays import check_attention_shapes, check_fast_alignment, to_device

    config = dict(config or {})
    stream = config.pop("stream", stream)
    inp = to_device(q=q, k=k, v=v, o=o, do=do, stream=stream, causal=causal, scale=scale, bf16=True)
    a = inp.arrays
    check_fast_alignment(**a)
    nb, nh, nhk, nq, nk, d = dims = check_attention_shapes(a["q"], a["k"], a["v"], a["do"])
    if not supports(inp.dtype_name, d):
        raise ValueError(f"dtype={inp.dtype_name}, head_dim={d}: {requirement}")
    if tuple(a["o"].shape) != tuple(a["q"].shape):
        raise ValueError(f"o.shape={tuple(a['o'].shape)}: must equal q.shape={tuple(a['q'].shape)}")
    st = to_device(lse=lse, stream=inp.stream)
    if st.host != inp.host:
        raise ValueError("inputs mix host (numpy) and device arrays: pass all on the host or all on the device")
    lse_d = st.arrays["lse"]
    if np.dtype(lse_d.dtype) != np.float32 or tuple(lse_d.shape) != (nb, nh, nq):
        raise ValueError(f"lse: must be float32 {(nb, nh, nq)}, got {lse_d.dtype} {tuple(lse_d.shape)}")
    if nb * max(nh, nhk) > 65535:
        raise ValueError(f"batch*heads={nb * nh}: at most 65535")
    cfg = _merged_config(default_config(d), config, requirement.split()[0])
    sc = positive_scale(inp, a, 1.0 / math.sqrt(d) if scale is None else float(scale))
    return inp, a, dims, lse_d, cfg, sc


@cuda.jit
def _times(src, dst, c):
    for x in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
        dst[x] = float32(src[x]) * c


@cuda.jit
def _times_bf16(src, dst, c):
    for x in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
        dst[x] = cvt_bf16(ld_bf16(src[x]) * c)


def tc_view(inp, *arrays):
    """The arrays as the tensor-core kernels take them: bf16 bits (int16) as float16 elements,
    the same memory (a view); fp16 and fp32 arrays unchanged."""
    return tuple(x.view(np.float16) for x in arrays) if inp.bf16 else arrays


def positive_scale(inp, a, sc):
    """τ for the kernels, which is τ itself when positive.  The kernels keep the running max of
    the raw scores Q Kᵀ and apply τ in the exponent (one FFMA per score); that max is the right
    end only for τ > 0, and a masked score (-inf) times τ <= 0 is +inf or NaN.  For τ <= 0 they
    run instead on Q' = c·Q with τ' > 0 and τ' Q' = τ Q, the same function: c = -1, τ' = -τ for
    τ < 0; c = 0 (a NaN stays NaN), τ' = 1 for τ = 0.  Q' replaces ``a["q"]`` (one elementwise
    pass, on this path only); dQ is c·dQ' (``inp.dq_factor``, applied by :func:`finish_dq` or
    :func:`dq_to_f16`), while dK, dV are unchanged."""
    inp.dq_factor = 1.0
    if sc > 0:
        return sc
    inp.dq_factor = -1.0 if sc < 0 else 0.0
    q = a["q"]
    n = int(np.prod(q.shape))
    qp = inp.empty(tuple(q.shape), inp.dtype)
    times = _times_bf16 if inp.bf16 else _times
    launch(times, *elementwise_grid(n), inp.stream, 0, q.reshape(n), qp.reshape(n), float32(inp.dq_factor))
    a["q"] = qp
    return -sc if sc < 0 else 1.0


def finish_dq(inp, dq):
    """dQ = c·dQ' in place where :func:`positive_scale` ran the kernels on Q' = c·Q."""
    if inp.dq_factor != 1.0:
        n = int(np.prod(dq.shape))
        times = _times_bf16 if inp.bf16 and np.dtype(dq.dtype) != np.float32 else _times
        launch(times, *elementwise_grid(n), inp.stream, 0, dq.reshape(n), dq.reshape(n), float32(inp.dq_factor))


def elementwise_grid(n: int) -> tuple:
    """(blocks, threads) for a grid-stride loop over n elements; one warp under the simulator,
    where one simulated thread per element would cost more than the kernel under test."""
    if config.ENABLE_CUDASIM:
        return 1, 32
    return min(1024, -(-n // 256)), 256


@cuda.jit
def _zero(a):
    for x in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        a[x] = 0.0


def zero_fill(flat, stream=0) -> None:
    """Zero a flat float32 device array (the buffer a backward's dQ atomics add into)."""
    launch(_zero, *elementwise_grid(flat.shape[0]), stream, 0, flat)


def zeroed_dq(inp, shape):
    """(B, H, Nq, d) float32 buffer, zeroed, that a one-kernel backward's dQ atomics add into, and
    its flat view."""
    dqa = inp.empty(shape, np.float32)
    flat = dqa.reshape(int(np.prod(shape)))
    zero_fill(flat, inp.stream)
    return dqa, flat


@cuda.jit
def _scaled_to_f16(src, dst, scale):
    for x in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
        dst[x] = src[x] * scale


@cuda.jit
def _scaled_to_bf16(src, dst, scale):
    for x in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
        dst[x] = cvt_bf16(src[x] * scale)


def dq_to_f16(inp, flat, shape, scale):
    """dQ = τ · (the float32 buffer of :func:`zeroed_dq`), rounded to fp16 (bf16 for bf16 inputs,
    to nearest even), in the inputs' kind (times ``inp.dq_factor``: :func:`positive_scale`)."""
    dq = inp.empty(shape, inp.dtype)
    conv = _scaled_to_bf16 if inp.bf16 else _scaled_to_f16
    launch(conv, *elementwise_grid(flat.shape[0]), inp.stream, 0, flat, dq.reshape(flat.shape[0]),
           np.float32(scale * inp.dq_factor))
    return inp.out(dq)


@cache
def _dummy_counters():
    arr = cuda.device_array((1, 2), dtype=np.int64)
    ptr = getattr(getattr(arr, "device_ctypes_pointer", None), "value", None)
    if ptr:  # kept for the process: a prepared call may pass it as it is
        _direct.PERSISTENT.add(ptr)
    return arr


def row_dots(inp, a, causal):
    """D_i = rowsum(dO_i ∘ O_i) (float32, (B, H, Nq)) by the reference preprocess kernel of
    ``kernels/flash2.py`` (memory-bound and coalesced; its traffic counters switched off)."""
    from .. import flash2

    nb, nh, nq, d = a["o"].shape
    dvec = inp.empty((nb, nh, nq), np.float32)
    pre, ntp = flash2.kernel("preprocess", inp.dtype_name, d, 64, 64, causal, False, False)
    launch(pre, (-(-nq // 64), nb * nh), ntp, inp.stream, 0, a["o"], a["do"], dvec, _dummy_counters())
    return dvec


def launch_fp32_backward(requirement, mod, q, k, v, o, lse, do, *, causal=False, scale=None, config=None,
                         check=None):
    """The one-kernel fp32 backwards' launcher (bwd_fp32_v1, bwd_fp32_v2): checks, D, the zeroed dQ,
    one launch over (key blocks, B·Hkv).  ``mod`` gives ``default_config``, ``supports``,
    ``tiling``, ``kernel`` and ``smem_bytes``; ``check(cfg, d)`` adds the variant's own config
    checks (ValueError)."""
    from .tc import MAX_WARPS

    inp, a, (nb, nh, nhk, nq, nk, d), lse_d, cfg, sc = prepare_backward(
        requirement, mod.default_config, mod.supports, q, k, v, o, lse, do, scale=scale, config=config, causal=causal)
    for key in ("bc", "br"):
        if cfg[key] <= 0 or cfg[key] % 16:
            raise ValueError(f"{key}={cfg[key]}: must be a positive multiple of 16")
    if not 1 <= cfg["nw"] <= MAX_WARPS:
        raise ValueError(f"nw={cfg['nw']}: must be 1..{MAX_WARPS}")
    if check is not None:
        check(cfg, d)
    mod.tiling(d, cfg["bc"], cfg["br"], cfg["nw"])  # ValueError if the warps cannot tile the products
    kern, nt = mod.kernel(d, bool(causal), **cfg)
    dvec = row_dots(inp, a, causal)
    dq, _ = zeroed_dq(inp, (nb, nh, nq, d))  # the atomics add into dQ itself (fp32: no rounding after)
    dk = inp.empty((nb, nhk, nk, d), np.float32)
    dv = inp.empty((nb, nhk, nk, d), np.float32)
    args = (a["q"], a["k"], a["v"], a["do"], lse_d, dvec, dq, dk, dv, float32(sc * LOG2E), float32(sc))
    smem = mod.smem_bytes(d, cfg["bc"], cfg["br"])
    raise_smem_limit(kern, args, smem)
    launch(kern, (-(-nk // cfg["bc"]), nb * nhk), nt, inp.stream, smem, *args)
    finish_dq(inp, dq)
    return inp.out(dq), inp.out(dk), inp.out(dv)
