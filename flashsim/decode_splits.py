"""Decoding's IO bounds and the split count as a model decision.

:func:`decode_bounds` splits the decode schedule's HBM bytes (flashsim/algorithms/decode.py) into
the compulsory traffic and what each choice adds over it:

``compulsory``
    Q read once, each visible K and V row of the cache read once (rows lo_b .. L_b - 1 of every
    kv head), O and L written once: B·Hq·Nq·d·e (Q) + 2·Hkv·d·e·Σ_b (L_b - lo_b) + B·Hq·Nq·d·e (O)
    + 4·B·Hq·Nq (L), e the element size.
``block_rounding``
    With a window, the rows of the first key block before the window's start (read and masked):
    2·Hkv·d·e·Σ_b (lo_b - jf_b·Bc).
``split``
    Split-KV: Q read again by every further split that has a key block, Hq·Nq·d·e·Σ_b (ne_b - 1),
    and the partial results' round trip, Op and Lp written by every split and read by the
    combine: 2·S·B·Hq·Nq·(d + 1)·4 (0 when S = 1).
``paging``
    The block-table reads, 4 bytes each.
``lengths``
    The sequence lengths: every program of the main launch, an empty split's too, reads its
    sequence's L_b (int32) to find its range, 4·B·Hkv·S.
``schedule`` = compulsory + block_rounding + split + paging + lengths, the closed form's bytes
    exactly.
``no_gqa_packing``
    What one program per query head (instead of per kv head) would add: K, V, the block table
    and the lengths read g times instead of once, (g - 1)·(K + V + BT + lengths bytes).
``paging_sectors`` (with ``sectors=True`` and a page size)
    The sector effect of paging: the walker's K and V sector bytes (32 per sector) paged minus the
    same schedule with a contiguous cache (rows of a kv head Hkv·d apart, page boundaries).

:func:`propose` picks ``num_splits`` for a workload on a GPU preset.  It follows
flash-attention's ``num_splits_heuristic`` (csrc/flash_attn/flash_api.cpp; hopper/heuristics.h
adds an L2 clause): with P = B·Hkv programs per split and W = SMs x ``blocks_per_sm`` slots, no
split when P >= 0.8·W; otherwise S from 1 to min(max_splits, SMs, key blocks), skipping an S
whose ⌈blocks/S⌉ equals that of S - 1 (the same split in effect), wave efficiency
eff(S) = n/⌈n⌉ with n = P·S/W, and flash-attention takes the smallest S with eff >= 0.85 of the
best (``fa2_choice``).  Ours charges the combine traffic instead of the 85% rule: it models the
time as main bytes / (bandwidth · eff(S)) + (S > 1)·(combine bytes / bandwidth + one launch,
``launch_s``) and proposes the eligible S of least modelled time (the smaller on a tie).  Both,
and the table they chose from, are returned; the bytes are the closed form's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .algorithms.decode import block_table_reads, decode_plan
from .api import closed_form_elements, resolve_tiling
from .config import STAT_BYTES, Hardware, Tiling, Workload, get_gpu


def decode_bounds(w: Workload, tiling: Tiling | None = None, sram_elems: int | None = None, sectors: bool = True,
                  **options) -> dict[str, int]:
    """The decode schedule's bytes as compulsory traffic plus each overhead (module docstring)."""
    t = resolve_tiling(w, "decode", tiling, sram_elems)
    p = decode_plan(w, t, **options)
    e = w.elem_bytes
    rows = p.batch * p.hq * p.nq
    visible = int((p.lengths - p.lo).sum())
    out = {
        "compulsory": rows * p.d * e + 2 * p.hkv * p.d * e * visible + rows * p.d * e + STAT_BYTES * rows,
        "block_rounding": 2 * p.hkv * p.d * e * int((p.lo - p.jf * p.bc).sum()),
        "split": (p.hq * p.nq * p.d * e * int((p.nonempty - 1).sum())
                  + (2 * p.splits * rows * (p.d + 1) * STAT_BYTES if p.splits > 1 else 0)),
        "paging": 4 * p.hkv * block_table_reads(p),
        "lengths": 4 * p.batch * p.hkv * p.splits,
    }
    out["schedule"] = out["compulsory"] + out["block_rounding"] + out["split"] + out["paging"] + out["lengths"]
    kv_bytes = 2 * p.hkv * p.d * e * int((p.lengths - p.jf * p.bc).sum())
    out["no_gqa_packing"] = (p.group - 1) * (kv_bytes + out["paging"] + out["lengths"])
    if sectors and p.page is not None:
        from .api import simulate

        def kv_sectors(opts):
            r = simulate(w, "decode", "fwd", tiling=t, **opts)
            return 32 * sum(r.io.breakdown[(n, "read")].sectors for n in ("K", "V"))

        contiguous = {k: v for k, v in options.items() if k not in ("page_size", "block_table")}
        out["paging_sectors"] = kv_sectors(options) - kv_sectors(contiguous)
    return out


@dataclass(frozen=True)
class Proposal:
    """:func:`propose`'s answer: the split count, flash-attention's choice, and the table."""

    num_splits: int
    fa2_choice: int
    programs_per_split: int
    slots: int
    table: list[dict] = field(default_factory=list)


def _bytes(w: Workload, t: Tiling, splits: int, options: dict) -> tuple[int, int]:
    """(main launch bytes, combine launch bytes) of the closed form at ``splits``."""
    el = closed_form_elements(w, "decode", "fwd", tiling=t, **{**options, "num_splits": splits})
    size = {"Q": w.elem_bytes, "K": w.elem_bytes, "V": w.elem_bytes, "O": w.elem_bytes, "L": STAT_BYTES,
            "Op": STAT_BYTES, "Lp": STAT_BYTES, "BT": 4, "Lens": 4}
    total = sum(n * size[k[0]] for k, n in el.items())
    if splits == 1:
        return total, 0
    combine = sum(n * size[k[0]] for k, n in el.items() if k in (("Op", "read"), ("Lp", "read"), ("O", "write"),
                                                                     ("L", "write")))
    return total - combine, combine


def propose(w: Workload, gpu: Hardware | str = "h100", tiling: Tiling | None = None, sram_elems: int | None = None,
            *, max_splits: int = 128, blocks_per_sm: int = 1, launch_s: float = 2e-6, **options) -> Proposal:
    """Propose ``num_splits`` for decoding ``w`` on ``gpu`` (module docstring); ``options`` are the
    decode options other than ``num_splits`` (page size, window, lengths, ...)."""
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if not isinstance(g, Hardware):
        raise ValueError(f"gpu={gpu!r}: must be a preset name or a flashsim Hardware")
    for name, v in (("max_splits", max_splits), ("blocks_per_sm", blocks_per_sm)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}: must be a positive integer")
    if isinstance(launch_s, bool) or not isinstance(launch_s, (int, float)) or not launch_s >= 0:
        raise ValueError(f"launch_s={launch_s!r}: must be a number >= 0 (seconds)")
    options = {k: v for k, v in options.items() if k != "num_splits"}
    t = resolve_tiling(w, "decode", tiling, sram_elems)
    p = decode_plan(w, t, **options)
    nblocks = int(p.nblk.max())
    per_split = p.batch * p.hkv
    slots = g.num_sms * blocks_per_sm
    top = max(1, min(max_splits, g.num_sms, nblocks))
    bw = g.hbm_bytes_per_s
    table = []
    for s in range(1, top + 1):
        eligible = s == 1 or math.ceil(nblocks / s) != math.ceil(nblocks / (s - 1))
        waves = per_split * s / slots
        eff = waves / math.ceil(waves)
        main, combine = _bytes(w, t, s, options) if eligible else (None, None)
        time_s = None if main is None else main / (bw * eff) + (combine / bw + launch_s if s > 1 else 0.0)
        table.append({"num_splits": s, "eligible": eligible, "programs": per_split * s, "waves": waves,
                      "efficiency": eff if eligible else 0.0, "main_bytes": main, "combine_bytes": combine,
                      "model_time_s": time_s})
    ok = [r for r in table if r["eligible"]]
    if per_split >= 0.8 * slots:
        fa2 = 1
    else:
        best = max(r["efficiency"] for r in ok)
        fa2 = next(r["num_splits"] for r in ok if r["efficiency"] >= 0.85 * best)
    ours = min(ok, key=lambda r: (r["model_time_s"], r["num_splits"]))["num_splits"]
    return Proposal(ours, fa2, per_split, slots, table)


__all__ = ["decode_bounds", "propose", "Proposal"]
