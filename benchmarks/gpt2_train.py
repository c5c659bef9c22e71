"""GPT-2 trained end to end with three attentions: naive PyTorch, SDPA, and ours (kernels.torch_op).

    python benchmarks/gpt2_train.py --out kernels/data/gpt2_train_h100.csv      (on a GPU, with torch)

The FlashAttention paper (Dao et al., 2022, section 4.1) reports GPT-2 training 3x faster than the
HuggingFace implementation and attention 7.6x faster.  This script makes the same comparison with
what we have, on one GPU, and nothing downloaded:

* models: GPT-2 small (12 layers, 12 heads, width 768) and medium (24 layers, 16 heads, width
  1024), head dim 64, GPT-2's vocabulary of 50,257 tokens, pre-LayerNorm blocks, random
  initialisation (seed 0, the same for every attention);
* data: synthetic token streams with something to learn (seed 1, the same for every attention):
  the first half of each sequence follows a fixed random permutation chain with probability 0.9
  (else a uniform token), the second half repeats the first (so attention can copy);
* training: AdamW (lr 3e-4 after 10 warm-up steps, weight decay 0.1), fp16 autocast with a
  GradScaler, causal attention, 8,192 tokens a step (batch 8 at N = 1,024, 2 at N = 4,096);
* attention: ``naive`` (softmax(QKᵀ·τ + causal mask)·V as HuggingFace's GPT-2 computes it, S and
  P materialised), ``sdpa`` (``F.scaled_dot_product_attention``, torch's own backend choice) and
  ``ours`` (``kernels.torch_op.attention``: the fast fp16 kernels of ``kernels/perf``).

The GradScaler's loss scale is recorded after every step: it halves after a step whose gradients
held an inf or NaN (the step is skipped), so ``skipped_steps`` counts the steps an attention's
backward overflowed or produced NaN under the scaled loss.

Each run times every step with CUDA events (median and quartiles after the first 10 steps), reads
the peak memory, and records every step's loss; a run that runs out of memory is recorded as
such.  Then the attention alone, forward + backward, at the paper's GPT-2-medium shape (batch 64,
16 heads, N = 1,024, d = 64, causal), median of 20 calls per implementation.  Writes
``OUT`` (one row per run), ``OUT`` with ``_losses`` (every step's loss) and ``.meta.json``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from flashsim.cmdline import ToolParser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.torch_op import attention as ours_attention  # noqa: E402

MODELS = {"small": dict(layers=12, heads=12, width=768), "medium": dict(layers=24, heads=16, width=1024)}
VOCAB = 50257
TOKENS_PER_STEP = 8192
WARMUP_STEPS = 10


def naive_attention(q, k, v):
    n, d = q.shape[-2], q.shape[-1]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    p = torch.softmax(s.masked_fill(mask, -math.inf), dim=-1).to(v.dtype)
    return p @ v


ATTENTIONS = {
    "naive": naive_attention,
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "ours": lambda q, k, v: ours_attention(q, k, v, causal=True),
}


class Block(nn.Module):
    def __init__(self, width, heads, attn):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, n, c = x.shape
        # (3, B, H, N, d), contiguous: q, k and v are then contiguous for every attention alike.
        qkv = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).contiguous()
        y = self.attn(qkv[0], qkv[1], qkv[2])
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, width, n_ctx, attn):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, width), nn.Embedding(n_ctx, width)
        self.blocks = nn.ModuleList(Block(width, heads, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied LM head, as GPT-2


@functools.lru_cache(maxsize=2)
def batches(steps, batch, n, seed=1):
    """Synthetic token streams (see the module docstring), the same for every attention (host tensors)."""
    g = np.random.default_rng(seed)
    perm = g.permutation(VOCAB)
    half = n // 2 + 1
    seq = np.empty((steps, batch, half), dtype=np.int64)
    seq[:, :, 0] = g.integers(0, VOCAB, (steps, batch))
    for t in range(1, half):
        follow = g.random((steps, batch)) < 0.9
        seq[:, :, t] = np.where(follow, perm[seq[:, :, t - 1]], g.integers(0, VOCAB, (steps, batch)))
    full = np.concatenate([seq, seq], axis=2)[:, :, : n + 1]
    return [torch.from_numpy(np.ascontiguousarray(x)) for x in full]


def train(model_name, n, impl, steps, device="cuda"):
    cfg = MODELS[model_name]
    batch = TOKENS_PER_STEP // n
    torch.manual_seed(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = GPT(cfg["layers"], cfg["heads"], cfg["width"], n, ATTENTIONS[impl]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP_STEPS))
    scaler = torch.amp.GradScaler()
    losses, times = [], []
    for tokens in batches(steps, batch, n):
        tokens = tokens.to(device, non_blocking=True)
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        t1.record()
        torch.cuda.synchronize()
        times.append(t0.elapsed_time(t1))
        losses.append((float(loss), scaler.get_scale()))
    peak = torch.cuda.max_memory_allocated() / 2**30
    del model, opt
    torch.cuda.empty_cache()
    t = np.array(times[WARMUP_STEPS:])
    return {"model": model_name, "seq_len": n, "batch": batch, "attention": impl, "steps": steps, "status": "ok",
            "step_ms_median": float(np.median(t)), "step_ms_q1": float(np.percentile(t, 25)),
            "step_ms_q3": float(np.percentile(t, 75)), "tokens_per_s": TOKENS_PER_STEP / (np.median(t) / 1e3),
            "peak_mem_gib": peak, "loss_first": losses[0][0], "loss_last": losses[-1][0],
            "skipped_steps": sum(b[1] < a[1] for a, b in zip([(None, 65536.0)] + losses, losses))}, losses


def attention_alone(impl, b=64, h=16, n=1024, d=64, reps=20):
    """Forward + backward of the attention alone at the paper's GPT-2-medium shape, fp16, causal."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=g).requires_grad_()
               for _ in range(3))
    do = torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=g)
    fn = ATTENTIONS[impl]
    ms = []
    for i in range(reps + 3):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        fn(q, k, v).backward(do)
        t1.record()
        torch.cuda.synchronize()
        if i >= 3:
            ms.append(t0.elapsed_time(t1))
        q.grad = k.grad = v.grad = None
    return {"model": "attention-only", "seq_len": n, "batch": b, "attention": impl, "steps": reps, "status": "ok",
            "step_ms_median": float(np.median(ms)), "step_ms_q1": float(np.percentile(ms, 25)),
            "step_ms_q3": float(np.percentile(ms, 75))}


def provenance() -> dict:
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    smi = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).split(",")
    commit = os.environ.get("FLASHSIM_GIT_COMMIT") or run(["git", "-C", str(Path(__file__).parent), "rev-parse",
                                                           "--short", "HEAD"]) or None
    import numba_cuda

    return {"gpu": smi[0].strip() or None, "driver": smi[1].strip() if len(smi) > 1 else None,
            "torch": torch.__version__, "numba_cuda": numba_cuda.__version__, "numpy": np.__version__,
            "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": commit, "dirty": os.environ.get("FLASHSIM_GIT_DIRTY"),
            "tokens_per_step": TOKENS_PER_STEP, "warmup_steps_excluded": WARMUP_STEPS, "precision": "fp16 autocast"}


def _write_csv(path: Path, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = ToolParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="CSV of runs; NAME_losses.csv and NAME.meta.json go beside it")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--seq-lens", nargs="+", type=int, default=[1024, 4096])
    ap.add_argument("--attentions", nargs="+", default=list(ATTENTIONS), choices=list(ATTENTIONS))
    ap.add_argument("--steps", type=int, default=110)
    ap.add_argument("--force", action="store_true", help="overwrite an existing record")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.exists() and not a.force:
        print(f"gpt2_train: error: {out} exists (use --force to overwrite)", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    loss_path, meta_path = out.with_name(out.stem + "_losses.csv"), out.with_name(out.stem + ".meta.json")
    rows, loss_rows = [], []
    for impl in a.attentions:
        rows.append(attention_alone(impl))
        print(rows[-1], flush=True)
    for model_name in a.models:
        for n in a.seq_lens:
            for impl in a.attentions:
                t = time.time()
                try:
                    row, losses = train(model_name, n, impl, a.steps)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    row, losses = {"model": model_name, "seq_len": n, "batch": TOKENS_PER_STEP // n,
                                   "attention": impl, "steps": a.steps, "status": "out of memory"}, []
                row["wall_s"] = round(time.time() - t, 1)
                rows.append(row)
                loss_rows += [{"model": model_name, "seq_len": n, "attention": impl, "step": i, "loss": x,
                               "loss_scale": sc} for i, (x, sc) in enumerate(losses)]
                print(row, flush=True)
                _write_csv(out, rows)
                _write_csv(loss_path, loss_rows)
    meta_tmp = meta_path.with_name(meta_path.name + ".tmp")
    meta_tmp.write_text(json.dumps(provenance(), indent=1))
    os.replace(meta_tmp, meta_path)
    print(f"\n{'model':15s} {'N':>5s} {'attention':>9s} {'step ms':>9s} {'IQR':>13s} {'tok/s':>9s} {'GiB':>6s} "
          f"{'loss':>7s}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['model']:15s} {r['seq_len']:5d} {r['attention']:>9s} {r['status']}")
            continue
        print(f"{r['model']:15s} {r['seq_len']:5d} {r['attention']:>9s} {r['step_ms_median']:9.2f} "
              f"{r['step_ms_q1']:6.2f}-{r['step_ms_q3']:6.2f} {r.get('tokens_per_s', 0):9.0f} "
              f"{r.get('peak_mem_gib', 0):6.1f} {r.get('loss_last', math.nan):7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
