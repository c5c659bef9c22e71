# %% [markdown]
# # 01 · IO complexity: standard attention against FlashAttention-1 and -2
#
# How many elements cross between HBM and on-chip SRAM (of M elements) when attention is
# computed exactly, as the sequence length N, the head dimension d and the SRAM size M vary.
# Every count below is the simulator's walker (`flashsim.simulate`: it adds up each tile
# transfer of the schedule) and each one is checked against the algorithm's closed form.
# Beside them: Theorem 2 (FlashAttention's Θ(N²d²/M); the curve drawn is our count from
# Algorithm 1, 2Nd + 12N²d²/M + 16N²d/M — the constants are ours, the theorem states only the Θ), the
# lower bound of Proposition 3 in Saha & Ye's pointwise form, and Saha & Ye's two-regime
# Θ(min(N²d²/M, N²d/√M)) — all from `flashsim.bounds`. Counts are per attention head
# (batch = heads = 1), forward pass, fp16. Nothing here runs on a GPU: "A100 preset" in a
# title means M is the A100's shared memory per thread block (flashsim's `a100` preset).

# %%
import math
import sys
from pathlib import Path

ROOT = Path.cwd().resolve().parent  # the notebooks run from notebooks/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt
import numpy as np

from analysis.compare import fit_loglog
from flashsim import Workload, closed_form_elements, get_gpu, simulate
from flashsim.bounds import bounds
from flashsim.plot import COLORS  # one colour per algorithm, as in flashsim report

plt.rcParams.update({"figure.dpi": 120, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8})
M_A100 = get_gpu("a100").sram_elems(2)  # 164 KiB of shared memory per thread block, fp16 elements


THEOREM2 = "Theorem 2 (Θ(N²d²/M)); our constants from Algorithm 1: 2Nd + 12N²d²/M + 16N²d/M"


def gemm_block_for(M, d):
    """The largest GEMM tile b of standard attention whose working set fits M elements: b rows of
    each operand (whole head dim d) and the b x b output tile, b² + 2bd <= M (at least 1)."""
    return max(1, math.isqrt(d * d + M) - d)


def hbm(w, algo, M, pass_="fwd", walk=True, **options):
    """HBM accesses (elements) of one algorithm: the walker's count, checked against the closed
    form (walk=False: the closed form alone, for tiny M where the walker's Tc·Tr loop is slow).
    Standard attention takes no M: its GEMM tile is the ``gemm_block`` option (default 128)."""
    M = None if algo == "standard" else M
    if not walk:
        return sum(closed_form_elements(w, algo, pass_, sram_elems=M, **options).values())
    r = simulate(w, algo, pass_, sram_elems=M, **options)
    assert r.agrees, (algo, w, M)
    return r.io.elements


def head(n, d):
    return Workload(batch=1, heads=1, seq_len_q=n, head_dim=d, dtype="fp16")


print(f"M (A100, fp16) = {M_A100:,} elements")

# %% [markdown]
# ## Sequence length N
#
# d = 64 and M = the A100's 164 KiB per thread block (83,968 fp16 elements), so the paper's
# rule gives Bc = ⌈M/4d⌉ = 328 and Br = min(Bc, d) = 64. Standard attention (Algorithm 0,
# tiled GEMMs with 128 × 128 output tiles, whose 2·128·d + 128² elements fit this M for every d
# below; scale+mask+softmax fused) writes and re-reads the N × N matrices S and P, and re-reads
# Q, K and V once per tile row or column, so it moves more than Algorithm 0's 4Nd + 4N².

# %%
Ns = [256, 512, 1024, 2048, 4096, 8192, 16384]
algos = ("standard", "flash1", "flash2")
by_n = {a: np.array([hbm(head(n, 64), a, M_A100) for n in Ns], dtype=float) for a in algos}
bnd_n = [bounds(head(n, 64), M_A100) for n in Ns]

fig, ax = plt.subplots(figsize=(6.4, 4.2))
for a in algos:
    ax.loglog(Ns, by_n[a], "o-", color=COLORS[a], label=f"{a} (simulated)")
ax.loglog(Ns, [b["standard"] for b in bnd_n], "k--", lw=0.8, label="Algorithm 0 count 4Nd + 4N²")
ax.loglog(Ns, [b["flash"] for b in bnd_n], "k-.", lw=0.8, label=THEOREM2)
ax.loglog(Ns, [b["lower_bound"] for b in bnd_n], "k:", lw=1.2, label="lower bound (Prop. 3, c = 1)")
ax.set_xlabel("sequence length N (tokens)")
ax.set_ylabel("HBM accesses per head (elements)")
ax.set_title(f"simulated, A100 preset: forward, d = 64, M = {M_A100:,}")
ax.legend()
plt.show()

i4k = Ns.index(4096)
std_over_f1 = by_n["standard"][i4k] / by_n["flash1"][i4k]
std_over_f2 = by_n["standard"][i4k] / by_n["flash2"][i4k]
alg0 = np.array([b["standard"] for b in bnd_n])  # Algorithm 0's count, 4Nd + 4N²
sim_over_alg0 = by_n["standard"][i4k] / alg0[i4k]
alg0_over_f1 = alg0[i4k] / by_n["flash1"][i4k]
# the takeaway's orderings, on every N drawn: flash1 and flash2 below both standard curves
assert all(by_n[a][i] < min(by_n["standard"][i], alg0[i]) for a in ("flash1", "flash2") for i in range(len(Ns)))
slope_n = {a: fit_loglog([{"N": n, "y": y} for n, y in zip(Ns[3:], by_n[a][3:])], ("N",), "y")["exponents"]["N"]
           for a in algos}
f1_over_thm2 = by_n["flash1"][i4k] / bnd_n[i4k]["flash"]
print({a: round(s, 3) for a, s in slope_n.items()}, f"flash1 / Theorem 2 at N=4096: {f1_over_thm2:.4f}")

# %% [markdown]
# **Takeaway:** at N = 4096 FlashAttention-1 moves {{std_over_f1|.1f}}× and FlashAttention-2
# {{std_over_f2|.1f}}× fewer HBM elements than our simulated standard attention (128 × 128 GEMM
# tiles, which re-read Q, K and V: {{sim_over_alg0|.2f}}× Algorithm 0's 4Nd + 4N²); against
# Algorithm 0's count itself FlashAttention-1 moves {{alg0_over_f1|.1f}}× fewer. All three are Θ(N²)
# (fitted exponents in N for N ≥ 2048: {{slope_n['standard']|.2f}}, {{slope_n['flash1']|.2f}},
# {{slope_n['flash2']|.2f}}; FlashAttention-1's is lowered by the ceiling in Tc = ⌈N/Bc⌉ and its Θ(Nd) terms),
# so the gap is a constant factor set by d and M; FlashAttention-1 sits at
# {{f1_over_thm2|.3f}}× Theorem 2's expression.

# %% [markdown]
# ## Head dimension d
#
# N = 4096, same M. FlashAttention-1 pays d²: each of its Tc ≈ 4Nd/M passes over Q and O moves
# N·d elements. FlashAttention-2 reads K and V once per query block, Tr = N/Br times, and the
# paper's rule caps Br = min(⌈M/4d⌉, d) at d: for d ≤ √(M/4) ≈ 145 Br = d, so K and V cost
# 2·(N/d)·N·d = 2N², flat in d; only beyond it (d = 256 here, Br = ⌈M/4d⌉ = 82) does Br fall
# with d and the d² term appear. Standard attention pays d only through its Nd terms (Q, K, V
# re-read once per 128-wide tile); its N² terms do not depend on d.

# %%
ds = [16, 32, 64, 128, 256]
by_d = {a: np.array([hbm(head(4096, d), a, M_A100) for d in ds], dtype=float) for a in algos}
bnd_d = [bounds(head(4096, d), M_A100) for d in ds]

fig, ax = plt.subplots(figsize=(6.4, 4.2))
for a in algos:
    ax.loglog(ds, by_d[a], "o-", color=COLORS[a], label=f"{a} (simulated)")
ax.loglog(ds, [b["flash"] for b in bnd_d], "k-.", lw=0.8, label=THEOREM2)
ax.loglog(ds, [b["lower_bound"] for b in bnd_d], "k:", lw=1.2, label="lower bound (Prop. 3, c = 1)")
ax.set_xscale("log", base=2)
ax.set_xlabel("head dimension d (elements per row of Q, K, V)")
ax.set_ylabel("HBM accesses per head (elements)")
ax.set_title(f"simulated, A100 preset: forward, N = 4096, M = {M_A100:,}")
ax.legend()
plt.show()

slope_d_f1 = fit_loglog([{"d": d, "y": y} for d, y in zip(ds[2:], by_d["flash1"][2:])], ("d",), "y")["exponents"]["d"]
ratio_d = by_d["standard"] / by_d["flash1"]
flat = [i for i, d in enumerate(ds) if d * d <= M_A100 / 4]  # Br = d: the rule's cap binds
f2_flat_spread = by_d["flash2"][flat].max() / by_d["flash2"][flat].min()
assert f2_flat_spread < 1.05 and by_d["flash2"][-1] > 2 * by_d["flash2"][flat].max()
assert slope_d_f1 > 1.8  # FlashAttention-1 pays d²
assert all(by_d["flash1"][i] < by_d["standard"][i] for i in range(len(ds)))
print("standard / flash1 by d:", dict(zip(ds, ratio_d.round(2))), f"flash1 exponent in d (d ≥ 64): {slope_d_f1:.2f}")

# %% [markdown]
# **Takeaway:** FlashAttention-1's traffic grows as d^{{slope_d_f1|.2f}} for d ≥ 64, so its
# advantage over standard attention falls from {{ratio_d[0]|.1f}}× at d = 16 to
# {{ratio_d[-1]|.2f}}× at d = 256 with the same 164 KiB of SRAM. FlashAttention-2 is flat in d
# up to d = 128 (within {{100*(f2_flat_spread-1)|.1f}} %, Br = d), then jumps
# {{by_d['flash2'][-1]/by_d['flash2'][flat].max()|.1f}}× at d = 256 where Br < d.

# %% [markdown]
# ## SRAM size M, and the small-cache regime d² > M
#
# N = 4096 and d = 128, so d² = 16,384: below that M the Br × d and Bc × d tiles of
# FlashAttention hold fewer than d rows and its cost keeps growing as N²d²/M, while Saha & Ye's
# small-cache algorithm (`smallcache`: √M × √M blocked matrix products, S written to HBM)
# grows only as N²d/√M. The lower bound follows the same two regimes (Saha & Ye: Θ(min(N²d²/M,
# N²d/√M)), here with constant 1). M runs from 4d (one row each of Q, K, V, O) to N·d/2.
# Standard attention's GEMM tiles must fit M too: here its tile b is chosen from M, the largest
# with b² + 2bd ≤ M (`gemm_block_for`: b = 1 at M = 512, 53 at M = d², 399 at the largest M),
# not the fixed 128 × 128 of the figures above (which would need 49,152 elements at d = 128).

# %%
n_m, d_m = 4096, 128
Ms = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
algos_m = ("standard", "flash1", "flash2", "smallcache")
# the walker below M = 4096 would take minutes (Tc = 4Nd/M key blocks); the closed forms there
# are the same counts (tests/test_flash1_schedule.py and friends hold them equal to the walker)
by_m = {a: np.array([hbm(head(n_m, d_m), a, m, walk=m >= 4096, **({"gemm_block": gemm_block_for(m, d_m)}
                                                                    if a == "standard" else {}))
                      for m in Ms], dtype=float) for a in algos_m}
bnd_m = [bounds(head(n_m, d_m), m) for m in Ms]

fig, ax = plt.subplots(figsize=(6.4, 4.4))
for a in algos_m:
    tiles = " (GEMM tile from M)" if a == "standard" else ""
    ax.loglog(Ms, by_m[a], "o-", color=COLORS[a], label=f"{a}{tiles} (simulated)")
ax.loglog(Ms, [b["flash"] for b in bnd_m], "k-.", lw=0.8, label=THEOREM2)
ax.loglog(Ms, [b["saha_ye"] for b in bnd_m], "k--", lw=0.8, label="Saha–Ye: N²·min(d²/M, d/√M)")
ax.loglog(Ms, [b["lower_bound"] for b in bnd_m], "k:", lw=1.6, label="lower bound (max with I/O floor)")
ax.axvline(d_m * d_m, color="grey", lw=0.8)
ax.text(d_m * d_m * 1.08, ax.get_ylim()[0] * 1.5, "M = d²", color="grey", va="bottom")
ax.set_xscale("log", base=2)
ax.set_xlabel("SRAM size M (elements)")
ax.set_ylabel("HBM accesses per head (elements)")
ax.set_title(f"simulated (M varies, no GPU preset): forward, N = {n_m}, d = {d_m}")
ax.legend(loc="upper left", bbox_to_anchor=(0, -0.15), ncol=2)
plt.show()

small = [i for i, m in enumerate(Ms) if m < d_m * d_m]
fit_m = {a: fit_loglog([{"M": Ms[i], "y": by_m[a][i]} for i in idx], ("M",), "y")["exponents"]["M"]
         for a, idx in (("smallcache", small), ("flash1", range(len(Ms))))}
first_flash_win = next(Ms[i] for i in range(len(Ms)) if by_m["flash2"][i] < by_m["smallcache"][i])
i_small = Ms.index(2048)
sc_gain = by_m["flash2"][i_small] / by_m["smallcache"][i_small]
i_big = Ms.index(65536)
f2_gain = by_m["smallcache"][i_big] / by_m["flash2"][i_big]
# the prose below claims these orderings against every curve drawn; fail loudly otherwise
others = [a for a in algos_m if a != "smallcache"]
assert all(by_m["smallcache"][i] < min(by_m[a][i] for a in others) for i in small)
assert all(by_m["flash2"][i] < by_m["smallcache"][i] for i in range(len(Ms)) if Ms[i] >= first_flash_win)
print(f"exponents in M: {fit_m}; flash2 first beats smallcache at M = {first_flash_win}")

# %% [markdown]
# **Takeaway:** below M = d² = {{d_m*d_m|,}} the small-cache algorithm moves the fewest
# elements of the four at every M tried (standard attention with GEMM tiles that fit M
# included) — at M = 2,048 {{sc_gain|.1f}}× fewer than FlashAttention-2 (its count falls as
# M^{{fit_m['smallcache']|.2f}}, FlashAttention's as M^{{fit_m['flash1']|.2f}}) — and
# FlashAttention-2 takes over from M = {{first_flash_win|,}} on, {{f2_gain|.1f}}× cheaper at
# M = 65,536: the crossover sits at M ≈ d², where Saha & Ye's two regimes meet.
# (FlashAttention-2 stops improving at M = 4d² = 65,536, where the rule's Br = min(⌈M/4d⌉, d)
# reaches d: its K, V re-reads depend on Br only.)

# %% [markdown]
# ## Where N²d²/M comes from: the per-tensor breakdown
#
# N = 4096, d = 64, M = 83,968 (Bc = 328, Tc = ⌈N/Bc⌉ = 13, Br = 64, Tr = 64). FlashAttention-1
# (Algorithm 1) loops over key blocks outside: each of the Tc iterations streams all of Q in,
# and reads and re-writes all of O (already normalised) and ℓ, m. FlashAttention-2 loops over
# query blocks outside: Q and O cross once, but K and V are read once per query block (Tr times).
# The unit below is N·d = 262,144 elements: one full pass over an N × d tensor.

# %%
from flashsim import Tiling

w_b = head(4096, 64)
t_b = Tiling.from_sram(M_A100, 64)
tc, tr = t_b.t_c(4096), t_b.t_r(4096)
nd = 4096 * 64
parts = {}
for a in ("flash1", "flash2"):
    r = simulate(w_b, a, "fwd", sram_elems=M_A100)
    parts[a] = {f"{t} {'read' if dr == 'read' else 'write'}": v for (t, dr), v in sorted(r.io.elements_by_key().items())}

keys = sorted({k for p in parts.values() for k in p}, key=lambda k: ("QKVOlmL".find(k[0]), k))
fig, ax = plt.subplots(figsize=(7.2, 2.8))
for y, a in enumerate(parts):
    left = 0.0
    for i, k in enumerate(keys):
        v = parts[a].get(k, 0) / nd
        if v:
            ax.barh(y, v, left=left, color=f"C{i % 10}", edgecolor="white",
                    label=k if y == 0 or k not in parts["flash1"] else None)
            if v > 1.5:
                ax.text(left + v / 2, y, k.replace(" read", " r").replace(" write", " w"), ha="center", va="center",
                        fontsize=8)
            left += v
ax.set_yticks([0, 1], list(parts))
ax.set_ylabel("algorithm")
ax.set_xlabel("HBM accesses per head (units of N·d elements)")
ax.set_title(f"simulated, A100 preset: N = 4096, d = 64, Br = {t_b.block_m}, Bc = {t_b.block_n} (Tc = {tc}, Tr = {tr})",
             fontsize=9)
ax.legend(ncol=5, fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.3))
plt.show()

f1 = parts["flash1"]
o_rw = f1["O read"] + f1["O write"]
o_rw_frac = o_rw / sum(f1.values())
q_units = f1["Q read"] / nd
o_read_units, o_write_units = f1["O read"] / nd, f1["O write"] / nd
assert q_units == o_read_units == tc and o_write_units == tc + 1  # the takeaway's counts
thm_unit = 4 * 4096 * 4096 * 64 * 64 / M_A100 / nd  # 4·N²d²/M in units of N·d
kv_f2 = (parts["flash2"]["K read"] + parts["flash2"]["V read"]) / nd
assert sum(parts["flash2"].values()) > sum(f1.values())  # claimed in the takeaway
for a, p in parts.items():
    print(a, {k: round(v / nd, 3) for k, v in p.items()}, f"total {sum(p.values()) / nd:.2f} N·d")

# %% [markdown]
# **Takeaway:** in FlashAttention-1 Q read and O read each cost Tc·N·d = {{q_units|.0f}} N·d and
# O write (Tc + 1)·N·d = {{o_write_units|.0f}} N·d (the extra one is O's initialisation); with
# 4Nd/M = {{thm_unit|.1f}} in place of Tc, the three give the 12N²d²/M of our Theorem 2 curve;
# re-reading and re-writing O every key block alone is {{o_rw/nd|.0f}} N·d,
# {{100*o_rw_frac|.0f}} % of its traffic. FlashAttention-2 writes O once but reads K and V
# Tr = {{tr}} times ({{kv_f2|.0f}} N·d): with Br capped at d = 64 by the paper's rule it moves
# more than FlashAttention-1 here — notebook 02 shows what larger query blocks buy.
