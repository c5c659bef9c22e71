"""The TMA box sweep: which sectors do the SMs receive when a TMA box row is not a whole number of
sectors, or runs past the tensor's edge?  Run under Nsight Compute with ``--nvtx`` (each workload
is one NVTX range, named as in the manifest), for ``scripts/device/tma_box_sweep.sh``:

* ``v7 d``: ``fwd_fp16_v7`` (K and V by TMA in boxes of one swizzle atom, 32 or 64 columns by Bc
  rows, zeros past d; no clusters, no multicast), B·H = 48, N = 1,536, not causal;
* ``qk d N bh``, ``pv d N bh``, ``ptv d N bh``: cuBLAS's fp16 (or bf16) GEMMs of attention, S =
  Q·Kᵀ, O = P·V and dV = Pᵀ·dO, whose kernel names give tile, K step and cluster.

The tensors are views of one random buffer made before the first range, so each range holds only
the workload's own launches.  Writes ``manifest.json`` (range name -> workload) to the folder given.

    python3 scripts/device/tma_box_sweep.py OUTDIR
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
work = []
for d in (64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 160, 200, 256):
    work.append(("v7", d, 1536, 48, "fp16"))
for d in range(8, 257, 8):
    for op in ("qk", "pv", "ptv"):
        work.append((op, d, 1536, 3, "fp16"))
for n in (1000, 2000):
    for d in (64, 80, 128):
        for op in ("qk", "pv", "ptv"):
            work.append((op, d, n, 3, "fp16"))
for d in (80, 128):
    for op in ("qk", "pv", "ptv"):
        work.append((op, d, 2000, 3, "bf16"))

biggest = max(bh * n * max(n, d) for _, d, n, bh, _ in work)
buf = {t: torch.randn(3 * biggest + 4096, device="cuda", dtype=getattr(torch, t)) * 0.1
       for t in ("float16", "bfloat16")}


def view(dt, offset, *shape):
    n = 1
    for s in shape:
        n *= s
    return buf[dt][offset:offset + n].view(*shape)


manifest = {}
for i, (op, d, n, bh, dt) in enumerate(work):
    name = f"w{i:03d}"
    manifest[name] = {"op": op, "d": d, "n": n, "bh": bh, "dtype": dt}
    t = "float16" if dt == "fp16" else "bfloat16"
    if op == "v7":
        from kernels.perf import variant

        q, k, v = (view(t, j * biggest, 3, bh // 3, n, d) for j in range(3))
        variant("fwd_fp16_v7").forward(q, k, v)  # compile outside the range
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    if op == "v7":
        variant("fwd_fp16_v7").forward(q, k, v)
    elif op == "qk":
        torch.matmul(view(t, 0, bh, n, d), view(t, biggest, bh, n, d).transpose(-1, -2))
    elif op == "pv":
        torch.matmul(view(t, 0, bh, n, n), view(t, biggest, bh, n, d))
    else:
        torch.matmul(view(t, 0, bh, n, n).transpose(-1, -2), view(t, biggest, bh, n, d))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
(out / "manifest.json").write_text(json.dumps(manifest, indent=1))
print(f"{len(work)} workloads")
