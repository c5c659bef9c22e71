# %% [markdown]
# # 07 · GPT-2 trained end to end with our attention
#
# The FlashAttention paper's end-to-end test is GPT-2 training (Dao et al., 2022, section 4.1):
# on an A100 its GPT-2 trains 3× faster than the HuggingFace implementation, and its attention
# alone, forward and backward, runs 7.6× faster at the GPT-2-medium shape. Here the same
# comparison is made with our kernels: `benchmarks/gpt2_train.py` trained GPT-2 small (12 layers,
# 12 heads, width 768) and medium (24 layers, 16 heads, width 1024) from one random
# initialisation on synthetic tokens (nothing downloaded), 110 steps of 8,192 tokens in fp16
# autocast, at sequence lengths N = 1,024 and 4,096, three times each, changing only the
# attention: **naive** (softmax(QKᵀ/√d + causal mask)·V as HuggingFace's GPT-2 computes it,
# S and P in HBM), **sdpa** (`torch.nn.functional.scaled_dot_product_attention`, torch's own
# backend choice) and **ours** (`kernels.torch_op.attention`, the fast fp16 kernels of
# `kernels/perf` as a `torch.library` custom op). Then it timed the attention alone, forward and
# backward, at the paper's GPT-2-medium shape. The record: `kernels/data/gpt2_train_h100.csv`,
# `gpt2_train_h100_losses.csv` and `gpt2_train_h100.meta.json` (`analysis.gpt2` reads them).

# %%
import sys
from pathlib import Path

ROOT = Path.cwd().resolve().parent  # the notebooks run from notebooks/
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt
import numpy as np

from analysis.gpt2 import (AGREE_TOL, ATTENTIONS, PAPER_ATTENTION_SPEEDUP, PAPER_TRAINING_SPEEDUP, configs, drift,
                           ok, read_losses, read_runs, run_of, speedups)
from analysis.notebook_data import find, load_meta
from flashsim.plot import COLORS

plt.rcParams.update({"figure.dpi": 120, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8})

runs_csv, losses_csv = find("gpt2"), find("gpt2_losses")
assert runs_csv is not None and losses_csv is not None, "no record: run benchmarks/gpt2_train.py on a GPU"
runs, losses = read_runs(runs_csv), read_losses(losses_csv)
meta = load_meta("gpt2")
print(f"{meta.get('gpu')}, driver {meta.get('driver')}, torch {meta.get('torch')}, numba-cuda {meta.get('numba_cuda')}, "
      f"{meta.get('precision')}, {meta.get('tokens_per_step')} tokens a step, first {meta.get('warmup_steps_excluded')} "
      f"steps left out of the timings; {str(meta.get('date'))[:10]}, commit {meta.get('git_commit')}")
cfgs = configs(runs)
label = {c: f"GPT-2 {c[0]}, N = {c[1]:,}" for c in cfgs}
gpu_tag = str(meta.get("gpu") or "GPU").replace("NVIDIA ", "").split()[0]  # e.g. "H100", for panel titles
for r in runs:
    t = "-" if r["step_ms_median"] is None else f"{r['step_ms_median']:7.1f} ms"
    print(f"{r['model']:15s} N = {r['seq_len']:5d} batch {r['batch']:2d} {r['attention']:6s} {r['status']:14s} {t}")

# %% [markdown]
# ## The loss curves
#
# Same initialisation, same tokens, same optimiser: the three runs of a configuration differ
# only in the attention's rounding. fp16 training is chaotic, so tiny rounding differences
# grow; the question is whether ours drifts from SDPA more than naive attention, another exact
# attention, drifts from it.

# %%
fig, axes = plt.subplots(1, len(cfgs), figsize=(4.2 * len(cfgs), 3.6), sharey=True)
for ax, c in zip(axes, cfgs):
    for a in ATTENTIONS:
        y = losses.get((*c, a))
        if y is not None:
            ax.plot(np.arange(len(y)), y, color=COLORS[a], lw=1.8 if a == "ours" else 1.1, label=a)
        else:
            ax.plot([], [], color=COLORS[a], label=f"{a}: {run_of(runs, *c, a)['status']}")
    ax.set_title(f"{gpu_tag}: {label[c]}", fontsize=9)
    ax.set_xlabel("training step")
    ax.legend()
axes[0].set_ylabel("training loss (cross-entropy, nats)")
plt.show()

drifts = {c: drift(losses, *c) for c in cfgs}
agree = {c: min(d[a]["agree_until"] for a in ("ours", "naive") if d[a] is not None) for c, d in drifts.items()}
final = {c: {a: losses[(*c, a)][-1] for a in ATTENTIONS if (*c, a) in losses} for c in cfgs}
drop = {c: losses[(*c, "sdpa")][0] - losses[(*c, "sdpa")][-1] for c in cfgs}
least, most = min(drop, key=drop.get), max(drop, key=drop.get)
assert least[0] == "medium"  # the takeaway says GPT-2 medium learns slowly
for c in cfgs:
    print(label[c], f"agree to 4 decimals for the first {agree[c]} steps;",
          "last loss " + ", ".join(f"{a} {v:.3f}" for a, v in final[c].items()))
assert all(v >= 10 for v in agree.values())  # the takeaway says the curves start together
agree_txt = f"{min(agree.values())}–{max(agree.values())}"

# %% [markdown]
# **Takeaway:** the three attentions give the same losses to 4 decimals for the first
# {{agree_txt}} steps of every configuration, then drift apart as fp16 training does. Over the
# 110 steps SDPA's loss falls by {{drop[most]|.2f}} nats in {{label[most]}} but only
# {{drop[least]|.2f}} in {{label[least]}} (GPT-2 medium learns slowly in so few steps). How far
# apart the curves end is the next figure's question.

# %% [markdown]
# ## How far ours drifts, against how far naive attention drifts
#
# |loss − SDPA's loss| per step for ours and for naive attention (log scale; steps where the two
# agree exactly are left out). Naive attention is as exact as SDPA in real arithmetic, so its
# distance from SDPA is the noise floor of fp16 training here.

# %%
fig, axes = plt.subplots(1, len(cfgs), figsize=(4.2 * len(cfgs), 3.4), sharey=True)
for ax, c in zip(axes, cfgs):
    for a in ("naive", "ours"):
        d = drifts[c][a]
        if d is None:
            continue
        steps = np.arange(len(d["diff"]))
        keep = d["diff"] > 0
        ax.semilogy(steps[keep], d["diff"][keep], color=COLORS[a], lw=1.4 if a == "ours" else 1.0,
                    label=f"|{a} − sdpa|: mean {d['mean']:.3f}, max {d['max']:.3f}")
    ax.axhline(AGREE_TOL, color="k", ls=":", lw=0.8, label="4 decimals")
    ax.set_title(f"{gpu_tag}: {label[c]}", fontsize=9)
    ax.set_xlabel("training step")
    ax.legend(fontsize=8, loc="upper left")
axes[0].set_ylabel("|loss − SDPA's loss| (nats)")
plt.show()

both = [c for c in cfgs if drifts[c]["naive"] is not None]
ratio_mean = {c: drifts[c]["ours"]["mean"] / drifts[c]["naive"]["mean"] for c in both}
more = [c for c in both if ratio_mean[c] > 1]
less = [c for c in both if ratio_mean[c] <= 1]
worst = max(both, key=lambda c: ratio_mean[c])
for c in both:
    print(label[c], f"mean |ours − sdpa| / mean |naive − sdpa| = {ratio_mean[c]:.2f}")


def _names(cs):
    return "; ".join(f"{label[c]} ({ratio_mean[c]:.1f}×)" for c in cs) or "none"


more_txt, less_txt = _names(more), _names(less)
no_naive = [label[c] for c in cfgs if drifts[c]["naive"] is None]
w_end = final[worst]["ours"] - final[worst]["sdpa"]
assert worst in more and ratio_mean[worst] > 2 and w_end > 0  # the takeaway calls it out

# %% [markdown]
# **Takeaway:** ours drifts from SDPA more than naive attention does in {{more_txt}} (mean
# |ours − sdpa| over mean |naive − sdpa|), and less in {{less_txt}}. The clear outlier is
# {{label[worst]}}: mean |ours − sdpa| {{drifts[worst]['ours']['mean']|.3f}} against
# {{drifts[worst]['naive']['mean']|.3f}} for naive, and ours ends {{w_end|.2f}} nats above SDPA — more
# than fp16 noise as naive measures it, worth a look at our fp16 kernels' rounding at
# N = {{worst[1]|,}}.
# ({{', '.join(no_naive)}}: naive ran out of memory, so there is no noise floor to set ours against.)

# %% [markdown]
# ## Step time, throughput and memory
#
# Step time: median over the timed steps, error bars from the first to the third quartile.
# Tokens per second: tokens per step over the median step time. Peak memory: torch's peak
# allocation over the run.

# %%
fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 3.8))
xs = np.arange(len(cfgs))
width = 0.8 / len(ATTENTIONS)
for k, a in enumerate(ATTENTIONS):
    rs = [run_of(runs, *c, a) for c in cfgs]
    med = np.array([r["step_ms_median"] if ok(r) else np.nan for r in rs])
    lo = np.array([r["step_ms_median"] - r["step_ms_q1"] if ok(r) else 0 for r in rs])
    hi = np.array([r["step_ms_q3"] - r["step_ms_median"] if ok(r) else 0 for r in rs])
    x = xs + (k - 1) * width
    ax1.bar(x, med, width, yerr=[lo, hi], capsize=3, color=COLORS[a], label=a)
    ax2.bar(x, [r["tokens_per_s"] / 1e3 if ok(r) else np.nan for r in rs], width, color=COLORS[a], label=a)
    ax3.bar(x, [r["peak_mem_gib"] if ok(r) else np.nan for r in rs], width, color=COLORS[a], label=a)
    for ax in (ax1, ax2, ax3):
        for xi, r in zip(x, rs):
            if not ok(r):
                ax.text(xi, 0, " out of memory" if r and r["status"] == "out of memory" else " -", rotation=90,
                        ha="center", va="bottom", fontsize=8)
for ax, yl in ((ax1, "step time (ms), median and IQR"), (ax2, "throughput (thousand tokens/s)"),
               (ax3, "peak memory (GiB)")):
    ax.set_xticks(xs, [f"{m}\nN = {n:,}" for m, n in cfgs], fontsize=8)
    ax.set_xlabel("model and sequence length")
    ax.set_ylabel(yl)
    ax.set_title(f"{meta.get('gpu')}", fontsize=9)
    ax.legend()
fig.tight_layout()
plt.show()

sp = speedups(runs)
train_naive = {c: sp[c]["naive"] for c in cfgs if sp[c]["naive"] is not None}
train_sdpa = {c: sp[c]["sdpa"] for c in cfgs if sp[c]["sdpa"] is not None}
oom = [label[c] for c in cfgs if run_of(runs, *c, "naive")["status"] == "out of memory"]
mem_naive = {c: run_of(runs, *c, "naive")["peak_mem_gib"] / run_of(runs, *c, "ours")["peak_mem_gib"] for c in train_naive}
mem_sdpa_mib = max(abs(run_of(runs, *c, "ours")["peak_mem_gib"] - run_of(runs, *c, "sdpa")["peak_mem_gib"]) * 1024
                   for c in cfgs)
for c in cfgs:
    print(label[c], {k: None if v is None else round(v, 3) for k, v in sp[c].items()})
assert all(v > 1 for v in train_naive.values()) and all(v < 1 for v in train_sdpa.values())


def _rng(d):
    return f"{min(d.values()):.2f}–{max(d.values()):.2f}×"


# %% [markdown]
# **Takeaway:** a training step with our attention is {{_rng(train_naive)}} as fast as with naive
# attention (the most at {{label[max(train_naive, key=train_naive.get)]}}) and {{_rng(train_sdpa)}} as
# fast as with SDPA; it needs {{min(mem_naive.values())|.1f}}–{{max(mem_naive.values())|.1f}}× less memory
# than naive and the same as SDPA (to {{mem_sdpa_mib|.2f}} MiB), neither storing the N × N
# matrices. {{', '.join(oom)}}: naive attention ran out of the GPU's memory.

# %% [markdown]
# ## Attention alone, at the paper's GPT-2-medium shape
#
# Forward and backward of one attention call (batch 64, 16 heads, N = 1,024, d = 64, causal,
# fp16): the measurement behind the paper's 7.6×.

# %%
att = [r for r in runs if r["model"] == "attention-only"]
att_n = att[0]["seq_len"]
fig, ax = plt.subplots(figsize=(5.2, 3.4))
for k, r in enumerate(att):
    ax.bar(k, r["step_ms_median"], 0.7, color=COLORS[r["attention"]],
           yerr=[[r["step_ms_median"] - r["step_ms_q1"]], [r["step_ms_q3"] - r["step_ms_median"]]], capsize=3)
    ax.text(k, r["step_ms_median"], f"{r['step_ms_median']:.2f} ms", ha="center", va="bottom", fontsize=8)
ax.set_xticks(range(len(att)), [r["attention"] for r in att])
ax.set_xlabel("attention")
ax.set_ylabel("forward + backward (ms), median and IQR")
ax.set_title(f"{gpu_tag}: batch {att[0]['batch']}, N = {att_n:,}, d = 64, causal, fp16", fontsize=9)
plt.show()

att_naive, att_sdpa = sp[("attention-only", att_n)]["naive"], sp[("attention-only", att_n)]["sdpa"]
print(f"attention alone: ours {att_naive:.2f}x naive, {att_sdpa:.2f}x SDPA")
assert att_naive > 1 > att_sdpa

# %% [markdown]
# **Takeaway:** in the paper's comparison, ours gives **{{att_naive|.1f}}×** on attention alone
# (the paper: {{PAPER_ATTENTION_SPEEDUP}}× on an A100) and **{{_rng(train_naive)}}** per GPT-2
# training step over naive attention (the paper: {{PAPER_TRAINING_SPEEDUP|.0f}}× over HuggingFace's
# whole implementation, of which attention is one part), on an {{meta.get('gpu')}}. Against
# torch's SDPA ours is {{att_sdpa|.2f}}× on attention alone and {{_rng(train_sdpa)}} per step: our
# Numba kernels beat the naive baseline the paper beat, not the FlashAttention-2 kernels torch
# ships today.
