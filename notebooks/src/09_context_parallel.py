# %% [markdown]
# # 09 · Context parallelism: the two-level IO picture
#
# A million-token sequence does not fit one GPU's attention, so the sequence is split over P
# GPUs, and the IO question gets a second level: each GPU's HBM traffic, and the bytes over
# NVLink between GPUs, which hide under the compute or do not.  `flashsim.parallel` simulates
# two schedules, forward and backward:
#
# * **ring attention**: each GPU keeps its N/P queries; the K, V shards travel round the ring in
#   P − 1 steps, each step one FlashAttention-2 call on a block (the single-device `flash2`
#   schedule, walked) overlapped with the next shard's transfer, the partial outputs merged by
#   logsumexp; causal attention with zig-zag shards (chunks r and 2P − 1 − r on GPU r), so every
#   GPU does the same work at every step;
# * **Ulysses**: an all-to-all turns sequence shards into head shards, each GPU runs full-sequence
#   attention on H/P heads, and another all-to-all turns the output back.
#
# Every count is the walker's, per GPU, checked against the closed form.  The workload: one
# sequence (batch 1), 32 heads, d = 128, fp16, causal, forward + backward, on the H100 preset
# (3.35 TB/s HBM, 989 TFLOP/s fp16, NVLink 450 GB/s per direction through NVSwitch).  Times are
# rooflines (each unit at its peak, a step's transfer fully overlapped with its compute): what the
# schedule allows, not a measurement; the NCCL run that would measure them
# (`scripts/device/ring_nccl.sh`) has not been made on several GPUs yet.

# %%
import sys
from pathlib import Path

ROOT = Path.cwd().resolve().parent  # the notebooks run from notebooks/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt
import numpy as np

from flashsim import Workload, get_gpu
from flashsim.parallel import context_parallel

plt.rcParams.update({"figure.dpi": 80, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8})
GPU = get_gpu("h100")
H, D = 32, 128
STYLE = {"ring": ("C0", "o-"), "ulysses": ("C3", "s--")}


def work(n, causal=True):
    return Workload(batch=1, heads=H, seq_len_q=n, head_dim=D, dtype="fp16", causal=causal)


def run(n, p, parallel, pass_="fwd+bwd", causal=True):
    r = context_parallel(work(n, causal), p, parallel, pass_, gpu=GPU)
    assert r.agrees, (n, p, parallel)
    return r


print(f"{GPU.name}: HBM {GPU.hbm_bytes_per_s / 1e12:.2f} TB/s, fp16 {GPU.matmul_flops['fp16'] / 1e12:.0f} TFLOP/s, "
      f"NVLink {GPU.link_bytes_per_s / 1e9:.0f} GB/s per direction ({GPU.link_topology})")

# %% [markdown]
# ## Per-GPU HBM bytes and link bytes against P
#
# N = 1,048,576 tokens, P = 1 … 16.  Left: the HBM bytes of the busiest GPU; right: the bytes
# each GPU sends over NVLink in the whole forward + backward.

# %%
N = 1_048_576
Ps = [1, 2, 4, 8, 16]
res = {par: [run(N, p, par) for p in Ps] for par in ("ring", "ulysses")}
hbm = {par: np.array([max(io.bytes for io in r.per_device) for r in rs]) / 1e9 for par, rs in res.items()}
sent = {par: np.array([max(r.sent_bytes) for r in rs]) / 1e9 for par, rs in res.items()}

fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
for par in res:
    c, ls = STYLE[par]
    a1.loglog(Ps, hbm[par], ls, color=c, label=par)
    a2.plot(Ps, sent[par], ls, color=c, label=par)
a1.loglog(Ps, hbm["ring"][0] / np.array(Ps), "k:", lw=1, label="one GPU's bytes / P")
a1.set_xscale("log", base=2)
a1.set_xlabel("GPUs P")
a1.set_ylabel("HBM bytes of the busiest GPU (GB)")
a1.set_title(f"HBM, N = {N:,}, causal, fwd + bwd")
a1.legend()
a2.set_xscale("log", base=2)
a2.set_xlabel("GPUs P")
a2.set_ylabel("bytes each GPU sends (GB)")
a2.set_title("NVLink")
a2.legend()
plt.show()

hbm_eff = {par: hbm[par][0] / (hbm[par][-1] * Ps[-1]) for par in res}  # 1 = perfect 1/P
ring_sent_growth = sent["ring"][-1] / sent["ring"][1]
uly_sent_fall = sent["ulysses"][1] / sent["ulysses"][-1]
assert 0.9 < hbm_eff["ring"] <= 1.0 and 0.9 < hbm_eff["ulysses"] <= 1.0
assert 1.2 < ring_sent_growth < 16 / 15 * 2 and uly_sent_fall > 4
print({k: round(v, 3) for k, v in hbm_eff.items()}, round(ring_sent_growth, 2), round(uly_sent_fall, 2))

# %% [markdown]
# **Takeaway:** both schedules divide the HBM traffic by P: at P = 16 the busiest GPU moves
# {{hbm_eff['ring']|.3f}} (ring) and {{hbm_eff['ulysses']|.3f}} (Ulysses) of one GPU's bytes / 16
# (the rest: the ring's logsumexp merges and the transfers' own HBM reads and writes).  The link
# traffic does not: a ring GPU sends its K, V shard P − 1 times and its dK, dV accumulators (fp32,
# twice the bytes of fp16) P times, (P − 1)/P of the whole sequence's K and V plus all of its dK
# and dV whatever P: {{sent['ring'][1]|.1f}} GB at P = 2, {{sent['ring'][-1]|.1f}} GB at P = 16
# ({{ring_sent_growth|.2f}}×).  Ulysses sends (P − 1)/P of shards that shrink as 1/P:
# {{sent['ulysses'][1]|.1f}} GB at P = 2, {{uly_sent_fall|.1f}}× less at 16.

# %% [markdown]
# ## Does the transfer hide?  The verdict per step
#
# A ring step computes a block of (N/P)² / 2 scores (zig-zag, off the diagonal) and sends 2·(N/P)·d
# elements per head: compute grows as (N/P)², the transfer as N/P, so below some shard size the
# transfer shows.  P = 8, the forward, a middle step of GPU 0 (an "upper" step: the second half
# of its queries against all of the K, V it holds), shards of 128 to 131,072 rows.

# %%
rows = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
P8 = 8
mid = []
for n_local in rows:
    r = run(n_local * P8, P8, "ring", "fwd")
    mid.append(r.device_steps(0)[1])
comp = np.array([s.compute_s for s in mid]) * 1e6
mem = np.array([s.memory_s for s in mid]) * 1e6
link = np.array([s.link_s for s in mid]) * 1e6
hidden = [s.hidden for s in mid]

fig, ax = plt.subplots(figsize=(6.4, 4.2))
ax.loglog(rows, comp, "o-", color="C2", label="compute (flash2 FLOPs at peak)")
ax.loglog(rows, mem, "^-", color="C1", label="HBM (walker bytes at 3.35 TB/s)")
ax.loglog(rows, link, "s--", color="C0", label="K, V transfer (450 GB/s)")
ax.set_xscale("log", base=2)
ax.set_xlabel("rows per GPU N/P")
ax.set_ylabel("time of one ring step (µs)")
ax.set_title("ring forward, P = 8, GPU 0, step 1")
ax.legend()
plt.show()

first_hidden = rows[hidden.index(True)]
assert all(hidden[hidden.index(True):]) and not hidden[0]
# the crossover by hand: an upper step has (n/2)·n scores, 2·2d·H matmul FLOPs each: 2n²dH / F
# seconds, against K and V sent, 2·n·d·H elements of 2 bytes: 4ndH / B; equal at n = 2F/B
n_cross_compute = 2 * GPU.matmul_flops["fp16"] / GPU.link_bytes_per_s
print(f"first hidden at {first_hidden:,} rows per GPU; compute alone would hide it from {n_cross_compute:,.0f}")

# %% [markdown]
# **Takeaway:** with 8 GPUs the K, V transfer of a ring step hides from {{first_hidden|,}} rows per
# GPU on (N = {{first_hidden * P8|,}}); below that it is exposed.  FLOPs alone would hide it only from
# about n = 2F/B = {{n_cross_compute|,.0f}} rows (an off-diagonal step computes n²/2 scores and sends 4nd
# bytes per head); it hides sooner because the step is HBM-bound in this model: the flash2
# schedule re-reads K and V once per query block (Br = {{res['ring'][0].tiling.block_m}} at
# d = 128), which costs more time than the FLOPs, and the transfer only has to beat the slower of the two.

# %% [markdown]
# ## Ring against Ulysses: the roofline time
#
# Forward + backward, overlapped rooflines (Σ over steps of the slowest GPU's step), at
# N = 1,048,576 and at N = 32,768, P = 2 … 16; the ratio is the ring's time over Ulysses'.

# %%
small = {par: [run(32768, p, par) for p in Ps] for par in ("ring", "ulysses")}
t_big = {par: np.array([r.time_s for r in rs]) for par, rs in res.items()}
t_small = {par: np.array([r.time_s for r in rs]) for par, rs in small.items()}

fig, ax = plt.subplots(figsize=(6.4, 4.2))
for par in res:
    c, ls = STYLE[par]
    ax.loglog(Ps, t_big[par] * 1e3, ls, color=c, label=f"{par}, N = 1,048,576")
    ax.loglog(Ps, t_small[par] * 1e3, ls, color=c, alpha=0.5, label=f"{par}, N = 32,768")
ax.set_xscale("log", base=2)
ax.set_xlabel("GPUs P")
ax.set_ylabel("fwd + bwd roofline time (ms)")
ax.set_title("ring against Ulysses, causal, H100 preset")
ax.legend()
plt.show()


def ring_extra(io):
    """HBM bytes of a ring GPU that are not its flash2 kernels': the transfers' own reads and
    writes, the merges and accumulations, the final casts."""
    parts = {"link": 0, "merge": 0}
    for (name, dr), t in io.breakdown.items():
        if name.endswith("@link"):
            parts["link"] += t.bytes
        elif name.endswith("acc") or (name.endswith("s") and dr == "read") \
                or (name in ("O", "dQ", "dK", "dV") and dr == "write"):
            parts["merge"] += t.bytes
    return parts


speedup_big = {par: t_big[par][0] / t_big[par][-1] for par in res}
ratio_big = t_big["ring"][-1] / t_big["ulysses"][-1]
ratio_small = t_small["ring"][-1] / t_small["ulysses"][-1]
r16, u16 = small["ring"][-1], small["ulysses"][-1]
hbm_ratio_small = r16.per_device[0].bytes / u16.per_device[0].bytes
extra = ring_extra(r16.per_device[0])
extra_share = (extra["link"] + extra["merge"]) / r16.per_device[0].bytes
exposed_small = sum(not s.hidden for s in r16.steps if s.link_bytes and s.kind != "final")
assert speedup_big["ring"] > 12 and speedup_big["ulysses"] > 12
assert ratio_small > 1.3 and hbm_ratio_small > 1.3 and exposed_small == 0
print(speedup_big, ratio_big, ratio_small, hbm_ratio_small, extra, extra_share)

# %% [markdown]
# **Takeaway:** at a million tokens both scale almost perfectly (16 GPUs: {{speedup_big['ring']|.1f}}×
# ring, {{speedup_big['ulysses']|.1f}}× Ulysses, in this roofline): the attention dwarfs every
# transfer, and the ring takes {{ratio_big|.3f}}× Ulysses' time.  At N = 32,768 on 16 GPUs (2,048
# rows per GPU) the ring takes {{ratio_small|.2f}}× Ulysses' time, though none of its transfers
# beside a step is exposed: its steps are HBM-bound and a ring GPU moves {{hbm_ratio_small|.2f}}×
# Ulysses' HBM bytes, {{extra_share * 100|.0f}}% of them outside the attention kernels (the
# transfers' own reads and writes, {{extra['link'] / 1e9|.2f}} GB; the logsumexp merges and fp32
# accumulations, {{extra['merge'] / 1e9|.2f}} GB), costs of O(N·d) per GPU that do not shrink with P
# while the attention's do.  Ulysses needs P to divide the heads (32 here); the ring does not.

# %% [markdown]
# ## One run, step by step
#
# N = 1,048,576 on 8 GPUs, ring, GPU 0: what each step moves and how long each part takes.

# %%
r8 = res["ring"][Ps.index(8)]
print(f"{'pass':4} {'step':>4} {'kind':6} {'HBM GB':>8} {'link MB':>8} {'compute ms':>10} {'HBM ms':>8} "
      f"{'link ms':>8}  transfer")
for s in r8.device_steps(0):
    print(f"{s.pass_:4} {s.index:4} {s.kind:6} {s.io.bytes / 1e9:8.2f} {s.link_bytes / 1e6:8.1f} "
          f"{s.compute_s * 1e3:10.2f} {s.memory_s * 1e3:8.2f} {s.link_s * 1e3:8.3f}  "
          f"{s.verdict if s.link_bytes else ''}")
final = [s for s in r8.device_steps(0) if s.kind == "final"][0]
final_share = final.time_s / sum(s.time_s for s in r8.device_steps(0))
hidden8 = sum(s.hidden for s in r8.steps if s.link_bytes and s.kind != "final")
moving8 = sum(1 for s in r8.steps if s.link_bytes and s.kind != "final")
assert hidden8 == moving8 and final_share < 0.01
print(f"time {r8.time_s * 1e3:.1f} ms overlapped, {r8.serial_time_s * 1e3:.1f} ms serial")

# %% [markdown]
# Every transfer that runs beside a step hides ({{hidden8}} of {{moving8}} over the 8 GPUs); the
# one exposed transfer is the last, dK and dV going home after the backward's last step, which is
# {{final_share * 100|.2f}}% of GPU 0's time.  The overlapped and serial times differ by what the
# overlap saves: {{(r8.serial_time_s - r8.time_s) * 1e3|.1f}} ms of {{r8.serial_time_s * 1e3|.1f}}.
