"""A roofline estimate of a simulated run's time on a GPU preset.

Model::

    t_compute = matmul_flops / peak_matmul[dtype] + nonmatmul_flops / peak_nonmatmul
    t_memory  = hbm_bytes / hbm_bandwidth
    time_s    = max(t_compute, t_memory)

Assumptions (all optimistic, so ``time_s`` is a lower bound on a real kernel's time):

* compute and memory traffic overlap perfectly, and the two kinds of arithmetic do not: tensor
  cores and CUDA cores are charged one after the other (the softmax of a FlashAttention tile
  waits for its QKᵀ, and vice versa), so their times add;
* every unit runs at its datasheet peak (dense tensor-core rate for fp16/bf16; strict fp32
  CUDA-core rate for fp32 unless ``tf32=True``) with all SMs busy — no tail effects, no launch
  latency, no occupancy limits;
* HBM moves exactly the simulated bytes at the datasheet bandwidth (by default the element
  bytes of the walker; ``sectors=True`` charges whole 32-byte sectors instead), and nothing is
  served from L2 — a kernel whose re-reads hit in L2 will run faster than this model says for
  the memory-bound case;
* the exp of the softmax costs one nonmatmul FLOP (real SFU throughput is lower).

``bound`` is "memory" when t_memory ≥ t_compute, else "compute"; ``arithmetic_intensity`` is
total FLOPs per HBM byte, to compare with the GPU's ridge point peak_matmul / bandwidth.
"""

from __future__ import annotations

from .config import Hardware, get_gpu
from .flops import flops as count_flops
from .traffic import SECTOR_BYTES


def _gpu(gpu) -> Hardware:
    if isinstance(gpu, Hardware):
        return gpu
    if isinstance(gpu, str):
        return get_gpu(gpu)
    raise ValueError(f"gpu={gpu!r}: must be a preset name or a Hardware")


def roofline_from_counts(matmul_flops: float, nonmatmul_flops: float, hbm_bytes: float, gpu, dtype: str,
                         tf32: bool = False) -> dict:
    """The model above from raw counts."""
    g = _gpu(gpu)
    key = "tf32" if (dtype == "fp32" and tf32) else dtype
    if key not in g.matmul_flops:
        raise ValueError(f"dtype={dtype!r}: GPU {g.name} has no matmul rate for {key!r}")
    t_mm = matmul_flops / g.matmul_flops[key]
    t_nm = nonmatmul_flops / g.nonmatmul_flops
    t_compute = t_mm + t_nm
    t_memory = hbm_bytes / g.hbm_bytes_per_s
    total = matmul_flops + nonmatmul_flops
    return {
        "time_s": max(t_compute, t_memory),
        "compute_s": t_compute,
        "matmul_s": t_mm,
        "nonmatmul_s": t_nm,
        "memory_s": t_memory,
        "bound": "memory" if t_memory >= t_compute else "compute",
        "arithmetic_intensity": total / hbm_bytes if hbm_bytes else float("inf"),
        "ridge_point": g.matmul_flops[key] / g.hbm_bytes_per_s,
        "matmul_flops": matmul_flops,
        "nonmatmul_flops": nonmatmul_flops,
        "hbm_bytes": hbm_bytes,
        "gpu": g.name,
    }


def roofline(sim_result, gpu, tf32: bool = False, sectors: bool = False, use_closed_form: bool = False) -> dict:
    """Roofline time of a :class:`flashsim.api.SimResult` on ``gpu`` (preset name or Hardware).

    FLOPs come from :func:`flashsim.flops.flops` for the result's algorithm, pass and tiling;
    bytes from the walker (``sectors=True``: sectors x 32; ``use_closed_form=True``: the closed
    form's bytes), every traffic class (loads, stores, reductions, bulk copies) together.
    """
    r = sim_result
    if not hasattr(r, "io") or not hasattr(r, "workload"):
        raise ValueError(f"sim_result: type {type(r).__name__} is not a flashsim.api.SimResult (from simulate())")
    opts = {k: v for k, v in r.options.items() if k != "sram_elems"}  # decode's lengths, splits, ...
    f = count_flops(r.workload, r.pass_, algo=r.algorithm, tiling=r.tiling, **opts)
    io = r.closed_form if use_closed_form else r.io
    # every traffic class reaches HBM's side of the chip: loads and stores, reductions, bulk (TMA)
    cls = io.by_class().values()
    if sectors:
        if any(t.sectors is None for t in cls):
            raise ValueError("sectors=True: this count has no sector numbers (closed forms count elements only)")
        nbytes = sum(t.sectors for t in cls) * SECTOR_BYTES
    else:
        nbytes = sum(t.bytes for t in cls)
    return roofline_from_counts(f["matmul"], f["nonmatmul"], nbytes, gpu, r.workload.dtype, tf32=tf32)


__all__ = ["roofline", "roofline_from_counts"]
