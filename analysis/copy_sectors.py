"""The 32-byte sectors that L2 sends to an SM for a kernel's ``cp.async`` tile copies (16 bytes a
lane), given where in shared memory each 16-byte chunk lands.

The rule, measured on the H100 (``kernels/data/fwd_fp16_v5_sector_h100_17772c5/``): a global
sector is sent once for every 32-byte-aligned unit of shared memory its bytes are copied into.
Where a tile row is a whole number of sectors (d % 16 = 0) that is the tile's sector count.  At
d % 16 = 8 every other row starts 16 bytes into a sector: ``fwd_fp16_v5``'s swizzled tiles put
the two halves of each such sector in different units (or atoms), so those sectors come twice,
1.53x the tile's sectors at d = 120 and 1.55x at d = 88; the padded tiles of ``fwd_fp16_v4`` and
the backwards (rows of d rounded up to 16, plus 8, halves: every other row shifted 16 bytes in
shared memory as in global memory) keep them together, and only the sector a row pair shares
across the row end comes twice, (d/8 + 1)/(d/8) by the rule (1.2x at d = 40, 1.07x at d = 120;
not measured).  Nsight Compute's ``l1tex__m_xbar2l1tex_read_sectors.sum`` equals
:func:`v5_forward_sectors`'s count to the sector at d = 88, 96, 120 and 128 (N = 4,096, B·H = 64),
whichever order the lanes take the chunks in and whether the copy is cached in L1
(``cp.async.ca``) or not: the extra sectors come from the destination layout alone.  L2's own
count (``lts__t_sectors_srcunit_tex_op_read.sum``) is lower at d = 120 and 88 (1.41x and 1.51x the
tile's sectors: some repeats are merged there) and is not modelled here.
"""

from __future__ import annotations

import numpy as np

from kernels.perf._tiles import swizzled_offset
from kernels.perf.fwd_fp16 import default_config_v5, swizzle_bytes


def tile_sectors(rows: int, d: int, dest, base: int = 0) -> tuple[int, int]:
    """(sectors sent, distinct sectors) for copying a rows x d f16 tile, contiguous in memory from
    byte ``base`` (its offset modulo 32 is what matters), chunk c of row r to shared element offset
    ``dest(r, c)``."""
    if rows < 0 or d <= 0 or d % 8:
        raise ValueError(f"{rows=}, {d=}: rows >= 0 and d a positive multiple of 8")
    ch = d // 8
    units: dict[int, set[int]] = {}
    for r in range(rows):
        for c in range(ch):
            g = base + (r * ch + c) * 16
            units.setdefault(g // 32, set()).add(2 * dest(r, c) // 32)
    return sum(len(u) for u in units.values()), len(units)


def padded_offset(stride: int):
    """``dest`` of a padded tile (rows of ``stride`` halves: ``fwd_fp16_v4``, the backwards)."""
    return lambda r, c: r * stride + 8 * c


def v5_forward_sectors(d: int, n: int, bh: int, config: dict | None = None) -> dict:
    """Sectors L2 sends to the SMs for one ``fwd_fp16_v5`` launch, not causal, Nq = Nk = n,
    ``bh`` heads (as many kv heads), its default block or ``config``: per block Q once and K, V
    for every key block (the last one partial: rows past n are zero-filled, not read).  Every
    tile must start on a 32-byte boundary in memory (n and Bc even where d % 16 = 8).  Returns
    ``sent``, ``distinct`` (each tile's sectors once) and their ratio."""
    for name, x in (("d", d), ("n", n), ("bh", bh)):
        if isinstance(x, bool) or not isinstance(x, int | np.integer) or x < 1:
            raise ValueError(f"{name}={x!r}: must be a positive integer")
    d, n, bh = int(d), int(n), int(bh)
    if d % 8 or d > 256:
        raise ValueError(f"{d=}: fwd_fp16_v5 takes d % 8 == 0 up to 256")
    cfg = dict(default_config_v5(d), **(config or {}))
    bc, br = cfg["bc"], 16 * cfg["nw"] * cfg["mt"]
    if d % 16 and (n % 2 or bc % 2):
        raise ValueError(f"{n=}, bc={bc}: tiles start 16 bytes into a sector where d % 16 = 8 and n or "
                         "Bc is odd; not modelled")
    sw = swizzle_bytes(d)
    full, last = divmod(n, bc)
    kv = [bc] * full + ([last] if last else [])
    q = [min(br, n - r0) for r0 in range(0, n, br)]
    q_tiles = {r: tile_sectors(r, d, swizzled_offset(br, sw)) for r in set(q)}
    kv_tiles = {r: tile_sectors(r, d, swizzled_offset(bc, sw)) for r in set(kv)}
    # one block per query block and head: its Q tile once, K and V for every key block
    sent = sum(q_tiles[r][0] for r in q) + len(q) * 2 * sum(kv_tiles[r][0] for r in kv)
    distinct = sum(q_tiles[r][1] for r in q) + len(q) * 2 * sum(kv_tiles[r][1] for r in kv)
    return dict(sent=sent * bh, distinct=distinct * bh, ratio=sent / distinct)
