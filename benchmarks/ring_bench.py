"""Ring attention on P GPUs over NCCL (kernels/ring.py), held against the simulator's prediction.

    torchrun --nproc-per-node $(nvidia-smi -L | wc -l) benchmarks/ring_bench.py --out $OUT
    bash scripts/device/ring_nccl.sh            # the same, with the environment and provenance

One process per GPU.  Three parts, each over P = 1, 2, 4, ... up to the world size (the first P
ranks in a subgroup; the others wait):

1. **exactness** (fp16, d = 128, B = 1, H = 8, N = ``--check-n``, full and causal): every rank's
   shards of O, dQ, dK, dV from the ring (our kernels in each step) against float64 attention of
   the whole sequence, beside the error of single-GPU attention (our kernels on the whole
   sequence) against the same reference; the rule is ring error <= 2x single-GPU error.
2. **strong scaling**: N fixed (``--strong-n``, default 262,144), causal, fp16, d = 128, H = 8:
   the ring's forward and forward + backward time per P;
3. **weak scaling**: N = ``--weak-n`` x P (default 131,072 x P: 1,048,576 at P = 8).

For every timed case it also times the ring's two halves apart: the step kernels alone (the same
calls, no transfers) and the transfers alone (the same sends, no kernels), and writes beside them
the simulator's prediction (:func:`flashsim.parallel.context_parallel` on the GPU's preset: the
overlapped time, the serial time, the compute and link times).  Times are the slowest rank's,
the median of ``--reps`` runs after one warm-up (which compiles the kernels), by CUDA events on
torch's current stream after a barrier.

Rank 0 writes ``ring_nccl.csv`` (one row per case and P), ``ring_nccl_exactness.csv`` and
``ring_nccl.meta.json`` (provenance: GPUs, driver, torch, NCCL, the git commit) into ``--out``.
``--quick`` runs small sizes (a smoke test, P = 1 on one GPU included).
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist

from flashsim.cmdline import ToolParser


def _log(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


#: the device of this rank (set by main): a CUDA GPU, or the CPU for a dry run over gloo
DEV = torch.device("cpu")


def _timed(fn, reps: int, group) -> float:
    """Median over reps of the slowest rank's milliseconds (one warm-up first)."""
    fn()
    out = []
    for _ in range(reps):
        dist.barrier(group=group)
        if DEV.type == "cuda":
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ms = a.elapsed_time(b)
        else:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        t = torch.tensor([ms], device=DEV)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        out.append(float(t))
    return statistics.median(out)


def _inputs(b, h, n, d, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn((b, h, n, d), generator=g, device=DEV, dtype=torch.float32).to(dtype) for _ in range(4)]


def _attn(args):
    from kernels.ring import KernelAttention, ReferenceAttention

    if args.attn == "reference":
        return ReferenceAttention()
    return KernelAttention(*(("reference", 4, 4) if DEV.type == "cpu" else ()))


def _rel(a, b) -> float:
    return float(torch.linalg.vector_norm((a.double() - b.double()).flatten())
                 / torch.linalg.vector_norm(b.double().flatten()))


def exactness(p, group, rank, n, causal, args, rows):
    from kernels.ring import ReferenceAttention, ring_backward, ring_forward, shard

    b, h, d = 1, args.heads, args.head_dim
    q, k, v, do = _inputs(b, h, n, d, args.torch_dtype, seed=11)
    scale = 1.0 / math.sqrt(d)
    ref, attn = ReferenceAttention(), _attn(args)
    r_o, r_l = ref.forward(q, k, v, causal, scale)
    r_dq, r_dk, r_dv = ref.backward(q, k, v, r_o, r_l, do, causal, scale)
    s_o, s_l = attn.forward(q, k, v, causal, scale)  # single-device attention of the whole sequence
    s_dq, s_dk, s_dv = attn.backward(q, k, v, s_o.to(q.dtype), s_l, do, causal, scale)
    sh = [shard(x, rank, p, causal) for x in (q, k, v, do)]
    o, lse = ring_forward(*sh[:3], causal=causal, scale=scale, attn=attn, group=group)
    dq, dk, dv = ring_backward(*sh[:3], o, lse, sh[3], causal=causal, scale=scale, attn=attn, group=group)
    for name, got, single, want in (("O", o, s_o, r_o), ("dQ", dq, s_dq, r_dq), ("dK", dk, s_dk, r_dk),
                                    ("dV", dv, s_dv, r_dv)):
        e_ring = _rel(got, shard(want, rank, p, causal))
        e_single = _rel(shard(single, rank, p, causal), shard(want, rank, p, causal))
        t = torch.tensor([e_ring, e_single], device=DEV, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        rows.append({"P": p, "N": n, "heads": h, "head_dim": d, "dtype": args.dtype, "causal": causal,
                     "tensor": name, "ring_error": float(t[0]),
                     "single_gpu_error": float(t[1]), "ratio": float(t[0] / t[1]) if t[1] else float("nan"),
                     "within_2x": bool(t[0] <= max(2 * t[1], 1e-12))})
        _log(f"exactness P={p} N={n} causal={causal} {name}: ring {float(t[0]):.3e}, single GPU {float(t[1]):.3e}")


def timing(p, group, rank, mode, n, args, preset, rows):
    from flashsim import Workload
    from flashsim.parallel import context_parallel
    from kernels.ring import _post, _ring, ring_backward, ring_forward, step_blocks

    b, h, d, causal = 1, args.heads, args.head_dim, True
    local = n // p
    q, k, v, do = _inputs(b, h, local, d, args.torch_dtype, seed=rank)
    scale = 1.0 / math.sqrt(d)
    attn = _attn(args)
    _, world, nxt, prv = _ring(group)
    kv = torch.stack([k, v])

    def fwd():
        return ring_forward(q, k, v, causal=causal, scale=scale, attn=attn, group=group)

    o, lse = fwd()

    def fwd_bwd():
        o_, l_ = ring_forward(q, k, v, causal=causal, scale=scale, attn=attn, group=group)
        return ring_backward(q, k, v, o_, l_, do, causal=causal, scale=scale, attn=attn, group=group)

    def kernels_only(backward):
        def run():
            for s in range(world):
                _, qs, ks, c = step_blocks(rank, s, world, local, causal)
                if backward:
                    attn.backward(q[:, :, qs], k[:, :, ks], v[:, :, ks], o[:, :, qs], lse[:, :, qs], do[:, :, qs],
                                  c, scale)
                else:
                    attn.forward(q[:, :, qs], k[:, :, ks], v[:, :, ks], c, scale)
        return run

    def transfers_only(backward):
        dkv = torch.zeros((2, *k.shape), dtype=torch.float32, device=DEV)

        def run():
            for s in range(world):
                sends = [(kv, 0)] if s < world - 1 else []
                if backward and s >= 1:
                    sends.append((dkv, 1))
                reqs, _ = _post(sends, nxt, prv, group)
                for r in reqs:
                    r.wait()
            if backward and world > 1:
                for r in _post([(dkv, 1)], nxt, prv, group)[0]:
                    r.wait()
        return run

    w = Workload(batch=b, heads=h, seq_len_q=n, head_dim=d, dtype=args.dtype, causal=causal)
    for pass_, ring_fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        t_ring = _timed(ring_fn, args.reps, group)
        t_k = _timed(kernels_only(False), args.reps, group)
        t_x = _timed(transfers_only(pass_ != "fwd"), args.reps, group)
        if pass_ != "fwd":
            t_k += _timed(kernels_only(True), args.reps, group)
        sim = context_parallel(w, p, "ring", pass_, gpu=preset)
        steps = sim.steps
        row = {"mode": mode, "P": p, "N": n, "rows_per_gpu": local, "heads": h, "head_dim": d, "causal": causal,
               "dtype": args.dtype, "pass": pass_, "ring_ms": t_ring, "kernels_only_ms": t_k, "transfers_only_ms": t_x,
               "overlap_saved_ms": t_k + t_x - t_ring,
               "sim_overlapped_ms": sim.time_s * 1e3, "sim_serial_ms": sim.serial_time_s * 1e3,
               "sim_compute_ms": max(sum(s.compute_s for s in steps if s.device == r) for r in range(p)) * 1e3,
               "sim_link_ms": max(sum(s.link_s for s in steps if s.device == r) for r in range(p)) * 1e3,
               "sim_exposed_steps": sim.exposed_steps, "sim_gpu": sim.gpu}
        rows.append(row)
        _log(f"{mode} P={p} N={n} {pass_}: ring {t_ring:.2f} ms (kernels alone {t_k:.2f}, transfers alone "
             f"{t_x:.2f}); simulator overlapped {row['sim_overlapped_ms']:.2f} ms, serial {row['sim_serial_ms']:.2f}")


def _write_csv(path, rows):
    if not rows:
        return
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    ap.add_argument("--check-n", type=int, default=8192)
    ap.add_argument("--strong-n", type=int, default=262144)
    ap.add_argument("--weak-n", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    ap.add_argument("--attn", choices=("kernels", "reference"), default="kernels",
                    help="each step's attention: our kernels, or the float64 reference (a dry run of the ring)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--force", action="store_true", help="overwrite an earlier result in --out")
    args = ap.parse_args(argv)
    if args.quick:
        args.check_n, args.strong_n, args.weak_n, args.reps = 2048, 16384, 8192, 2
    args.torch_dtype = {"fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    global DEV
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        DEV = torch.device("cuda", local_rank)
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=DEV)
    else:  # a dry run on the CPU: gloo, the kernels under Numba's CUDA simulator (or --attn reference)
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = os.path.join(args.out, "ring_nccl.csv")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if os.path.exists(out) and not args.force:
            raise SystemExit(f"ring_bench: {out} exists (give --force to overwrite)")
    name = torch.cuda.get_device_name().lower() if DEV.type == "cuda" else "cpu"
    preset = "h200" if "h200" in name else "a100-80gb" if "a100" in name else "h100"
    ps = [p for p in (1, 2, 4, 8, 16) if p <= world]
    groups = {p: dist.new_group(list(range(p))) for p in ps}
    exact, timed = [], []
    t0 = time.time()
    for p in ps:
        if rank < p:
            for causal in (False, True):
                exactness(p, groups[p], rank, args.check_n, causal, args, exact)
            timing(p, groups[p], rank, "strong", args.strong_n, args, preset, timed)
            timing(p, groups[p], rank, "weak", args.weak_n * p, args, preset, timed)
            if DEV.type == "cuda":
                torch.cuda.empty_cache()
        dist.barrier()
    if rank == 0:
        _write_csv(os.path.join(args.out, "ring_nccl_exactness.csv"), exact)
        _write_csv(out, timed)
        from kernels.gpucheck import provenance

        cuda = DEV.type == "cuda"
        meta = {"provenance": provenance(), "world": world, "backend": dist.get_backend(),
                "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
                "torch": torch.__version__, "nccl": str(torch.cuda.nccl.version()) if cuda else None,
                "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                        "NVSHMEM_DISABLE_NVLS")},
                "simulator_preset": preset, "args": {k: v for k, v in vars(args).items() if k != "torch_dtype"},
                "seconds": time.time() - t0,
                "all_within_2x": all(r["within_2x"] for r in exact)}
        tmp = os.path.join(args.out, "ring_nccl.meta.json.tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1)
        os.replace(tmp, os.path.join(args.out, "ring_nccl.meta.json"))
        print(f"wrote {out} ({len(timed)} rows) and the exactness table ({len(exact)} rows) "
              f"in {time.time() - t0:.0f} s")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
