"""DRAM traffic: a schedule's thread blocks replayed through a model of the GPU's L2.

:func:`dram_traffic` takes a :class:`~flashsim.traffic.Schedule` whose launches carry their
thread blocks (``Launch.blocks``, a :class:`flashsim.blocks.BlockSpec`, filled by every
schedule of standard, flash1, flash2, decode, fast, torch_flash, torch_memeff and torch_naive)
and a GPU preset, and returns the bytes read from and written to DRAM, launch by launch.
:func:`simulate_dram` builds the schedule first.

The model, piece by piece:

* **Issue order.**  A launch's blocks are issued in grid order (x fastest, then y, then z).
  ``slots = num_sms x blocks_per_sm`` of them are resident at once (blocks per SM from the
  preset's thread, block and shared-memory limits and the block's threads and shared memory;
  registers only where the block gives a measured count: PyTorch's fmha and nvjet kernels).
  Resident blocks advance round-robin, one *step* each per round (a step is what a block loads
  or stores between two barriers: a K_j, V_j pair, a slice of a GEMM's operands); when a block
  finishes, the next block of the grid takes its slot.
* **Accesses.**  Each tile of a step is expanded, row by row, into the 128-byte lines it
  touches, each with the mask of the 32-byte sectors it touches (``l2_line_bytes`` and
  ``l2_sector_bytes`` of the preset), tensors laid out as the walker lays them out.
* **The L2**, one set-associative cache (``l2_ways``, sets indexed by line address modulo the
  number of sets) whose parameters come from the calibration microbenchmarks
  (``python -m analysis.calibrate l2``; records in analysis/data/l2calib/, derived by
  ``analysis.calibrate.l2_model_parameters``; each preset's ``l2_source`` names them):

  - *capacity* ``l2_effective_bytes`` (``l2_capacity_fraction`` of the L2: 32.4 of 50 MiB on
    the H100, 42.6 of 60 MiB on the H200): the capacity for which this cache reproduces the
    measured re-reads of a window by the whole grid (all hit up to 32 MiB, then a gradual ramp:
    half miss at 45 MiB on the H100, 64 MiB on the H200);
  - *replacement* ``l2_replacement``: "nru" (a hit marks a line re-referenced; the victim is
    drawn at random among the ways not re-referenced since they came in, and when every way is,
    the marks are cleared), with a share ``l2_random_share`` (0.3) of the victims drawn among
    all the ways instead.  Random choice gives the measured ramp (LRU would give a cliff); the
    marks keep lines re-read while other data streams by, the random share loses some of them
    as the H100 does (analysis/data/l2calib/h100_l2_policy.csv: a hot buffer of 1, 4, 8, 16 MiB
    re-read under a 256 MiB stream loses 0, 2, 8, 25% of its re-reads; this cache 1, 4, 8, 26%;
    plain NRU 0, 0, 0, 4%, plain random 3, 11, 23, 46%).  "lru" and "random" are there for
    comparison (and an int k: random among the k least recently used);
  - *reads*: a missing sector is fetched with the rest of its ``l2_fetch_bytes`` granule (64
    bytes measured: a strided read touching one sector per 64 bytes or more fetches 64 bytes);
    only the granule's sectors not already valid are counted;
  - *writes*: write-allocate without fetch; the written sectors become valid and dirty.  At
    most ``l2_dirty_bytes`` of lines (``l2_dirty_fraction`` of the L2: 23.7 MiB measured on the
    H100, 28.2 MiB on the H200) are held dirty, counted in lines whatever share of their sectors
    is dirty (as the H200 counts them: analysis/data/l2calib/h200_l2_dirty_lines, stores to half
    and quarter lines leave half and a quarter of the bytes): beyond it the lines dirtied first are written back
    and stay, clean (a launch writing W bytes sends max(0, W - limit) to DRAM, as measured).
    A store of new sectors to a line already dirty joins its dirty part unless the line's draw
    (one per residency in the L2) is at or above the share ``l2_split_merge`` gives for the bytes
    stored since the line's last store (all at once, 0.71 after 128 KiB, none from 1 MiB on the
    H200: analysis/data/l2calib/h200_l2_halfline and h200_l2_quarter, lines stored in halves and
    quarters L lines apart); a line so joined takes ``1 + l2_split_cost`` lines of the limit
    (0.093 on the H200: what makes halves and quarters stored at once leave 25.4-25.6 MiB where
    whole lines leave 28).  Otherwise the older sectors are orphaned, and written back whenever
    the limit is next passed, before the oldest lines (so the 128-byte lines of standard
    attention's fp16 S, two blocks' 64-byte rows each, leave 25.1-25.6 MiB dirty; below the
    limit nothing is written back).  An evicted dirty line writes its dirty sectors back;
  - *reductions* (``red``/atomics, traffic class "reduction": the dQ accumulation of the fast
    kernels' backwards and of torch_flash's) are read-modify-writes made in the L2: the
    sectors not yet valid are fetched first (with the rest of their granule, DRAM reads as for
    a read miss), then the reduced sectors are valid and dirty, as a store leaves them.  A reduction into a sector
    the L2 holds (a zero fill's store still there, an earlier reduction) reads nothing from
    DRAM.  Reductions count as requested writes (``requested_write_bytes``).
* **Launch boundaries.**  ``cold_launches=False`` (a pass as it runs): the L2's content carries
  from one launch to the next (the dK/dV launch can hit on D written by the preprocess launch);
  the lines still dirty after the last launch are written back eventually and reported as
  ``final_flush_bytes`` (part of the total writes).  ``cold_launches=True`` (what Nsight Compute
  measures with ``--cache-control all``): every launch starts with an empty L2, and its dirty
  lines at the end are written back by ncu's flush before the next replay, outside the measured
  range: they are reported as ``dirty_end_bytes``, not as the launch's writes.  ``start_dirty``
  puts other data, dirty, in the L2 whenever it starts empty: what ncu's replay leaves when it
  measures more metrics than the calibration did (analysis.compare.replay_dirty).

What it is not: no timing (the H100 writes to DRAM at about 19 MB/s while any kernel runs,
whatever it stored: 9.7 MB for 8 MiB stored and the kernel kept alive 512 ms; long launches show
it as megabytes of writes the model does not predict; analysis.compare reports it apart), no early
write-back under a read stream (a launch's dirty lines leave for DRAM once it also reads about 28
MiB of other data on the H200, where this cache, sized by the re-reads, starts at 48 MiB:
analysis/data/l2calib/h200_l2_readwrite.csv), no partitions (an SM's hits reach both halves, with
no near copy of far lines, and written lines lie in their address's half as read ones do:
analysis.l2_partition), and not what one SM's re-read loses (one SM reading in order keeps the
newest 28-29 MiB of the 60 MiB and loses the lines read before them, the same lines on four SMs,
near and far nearly alike: 0.08, 0.28, 0.40, 0.56 of W = 32, 40, 48, 64 MiB, where this cache, its
sets indexed by address modulo their count and its victims random, loses 0, 0, 0.11 and 0.34:
analysis/data/l2calib/h200_l2_reread), nor why a launch that writes and then reads back W MiB
reads about half of it from DRAM (one SM reading lines the grid has just written misses none of
them in the next launch, a quarter of them in the same one); no read-modify-write of partly
written sectors, no local memory (the reference kernels measured have none), no register-limited
occupancy where the kernel's register count is not given, no per-SM placement of blocks. The A100
presets have no calibration: they assume the H100's fractions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from .config import Hardware, get_gpu, split_cost_value, split_merge_points
from .traffic import Schedule, _tensor_bases


@dataclass(frozen=True)
class LaunchDRAM:
    """One launch's DRAM traffic (bytes) and what it asked the L2 for."""

    name: str
    grid: tuple[int, int, int]
    threads: int
    blocks_per_sm: int
    read_bytes: int  # sectors that missed, times the sector size
    write_bytes: int  # dirty sectors evicted during the launch
    dirty_end_bytes: int  # dirty sectors left in the L2 when the launch ends
    requested_read_bytes: int  # sectors read, hit or miss (the L2's read requests)
    requested_write_bytes: int


@dataclass(frozen=True)
class DRAMTraffic:
    gpu: str
    cold_launches: bool
    l2_effective_bytes: int
    launches: list[LaunchDRAM] = field(default_factory=list)

    @property
    def read_bytes(self) -> int:
        return sum(x.read_bytes for x in self.launches)

    @property
    def final_flush_bytes(self) -> int:
        """Dirty bytes written back after the launches: with cold launches, every launch's
        dirty lines at its end; otherwise the last launch's."""
        if self.cold_launches:
            return sum(x.dirty_end_bytes for x in self.launches)
        return self.launches[-1].dirty_end_bytes if self.launches else 0

    @property
    def write_bytes(self) -> int:
        """All bytes that reach DRAM as writes, the final flush included."""
        return sum(x.write_bytes for x in self.launches) + self.final_flush_bytes

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "cold_launches": self.cold_launches, "l2_effective_bytes": self.l2_effective_bytes,
                "dram_read_bytes": self.read_bytes, "dram_write_bytes": self.write_bytes,
                "final_flush_bytes": self.final_flush_bytes,
                "launches": [dict(x.__dict__) for x in self.launches]}


# ---------------------------------------------------------------------------------------------
# The cache (numba)

# counters
_REQ_RD, _REQ_WR, _MISS_RD, _EVICT_WR = 0, 1, 2, 3
# what an access does: a load, a store, a reduction (red/atom: read-modify-write in the L2)
_LOAD, _STORE, _RED = 0, 1, 2
# the cache's scalar state (one int64 array, so the numba functions can update it in place);
# _WCLOCK counts the sectors stored so far
# _NDIRTY and _DLIMIT count in _SLOT units a line (a line whose dirty part joined several stores
# takes _SLOT + st[_SCOST]); _SCOST: that extra, in units
_CLOCK, _RNG, _NDIRTY, _DLIMIT, _FHEAD, _FTAIL, _POLICY, _GRAN, _RSHARE, _WCLOCK, _OHEAD, _OTAIL, _SCOST = range(13)
_SLOT = 1 << 16
# two queues of (way, generation of the way when queued, sectors): ``fifo``, the dirty lines in
# the order they became dirty (written back oldest first beyond the limit), and ``orph``, the
# orphaned parts of lines stored in parts (written back first, whenever the limit is passed).
# ``meta`` (3 x ways): a way's generation (one more each time a line comes in: the queued
# entries of the line it held are dead), the store clock of its line's last store of new
# sectors, and whether its dirty part joined more than one store (1) or not (0)
_Q_WAY, _Q_GEN, _Q_MASK = 0, 1, 2
_M_GEN, _M_LAST, _M_JOIN = 0, 1, 2


@njit(cache=True, inline="always")
def _popcount(x):
    n = 0
    while x:
        x &= x - 1
        n += 1
    return n


@njit(cache=True, inline="always")
def _granules(mask, gran):
    """``mask`` widened to whole fetch granules of ``gran`` sectors (1, 2, 4 or 8)."""
    if gran == 1:
        return mask
    out = 0
    full = (1 << gran) - 1
    for g in range(0, 8, gran):
        if (mask >> g) & full:
            out |= full << g
    return out


@njit(cache=True, inline="always")
def _undirty(st, meta, k):
    """Line in way k leaves the dirty lines: its share of the limit is freed."""
    st[_NDIRTY] -= _SLOT + meta[_M_JOIN, k] * st[_SCOST]
    meta[_M_JOIN, k] = 0


@njit(cache=True)
def _clean(dirty, st, fifo, orph, meta, ctr):
    """Beyond the dirty limit: write back every orphaned part still dirty (oldest first), then
    the oldest dirty lines (first dirtied first) until no more than the limit is held; their
    sectors stay valid, now clean.  Entries of lines evicted meanwhile (another generation of
    their way) are skipped."""
    osize = orph.shape[1]
    while st[_OHEAD] < st[_OTAIL]:
        h = st[_OHEAD] % osize
        st[_OHEAD] += 1
        k = orph[_Q_WAY, h]
        if meta[_M_GEN, k] == orph[_Q_GEN, h]:
            m = dirty[k] & orph[_Q_MASK, h]  # (a line keeps its newest part: never all of it)
            ctr[_EVICT_WR] += _popcount(m)
            dirty[k] &= ~m
    size = fifo.shape[1]
    while st[_NDIRTY] > st[_DLIMIT] and st[_FHEAD] < st[_FTAIL]:
        h = st[_FHEAD] % size
        st[_FHEAD] += 1
        k = fifo[_Q_WAY, h]
        if meta[_M_GEN, k] == fifo[_Q_GEN, h] and dirty[k]:
            ctr[_EVICT_WR] += _popcount(dirty[k])
            _undirty(st, meta, k)
            dirty[k] = 0


@njit(cache=True)
def _compact(dirty, q, meta, head, tail):
    """Keep only the live entries of queue ``q`` (st indices ``head``, ``tail``), in order, from
    the start of the array; returns how many."""
    size = q.shape[1]
    keep = np.empty((3, size), dtype=np.int64)
    n = 0
    for e in range(head, tail):
        h = e % size
        k = q[_Q_WAY, h]
        if meta[_M_GEN, k] == q[_Q_GEN, h] and dirty[k] & q[_Q_MASK, h]:
            keep[:, n] = q[:, h]
            n += 1
    q[:, :n] = keep[:, :n]
    return n


@njit(cache=True, inline="always")
def _push(dirty, st, q, meta, ih, it, k, mask):
    size = q.shape[1]
    if st[it] - st[ih] == size:  # full: drop the entries of lines written back or evicted
        st[it] = _compact(dirty, q, meta, st[ih], st[it])
        st[ih] = 0
        if st[it] == size:  # (not reached: the queues hold twice the most live entries)
            raise RuntimeError("flashsim.l2: write-back queue overflow")
    t = st[it] % size
    q[_Q_WAY, t] = k
    q[_Q_GEN, t] = meta[_M_GEN, k]
    q[_Q_MASK, t] = mask
    st[it] += 1


@njit(cache=True, inline="always")
def _merge_share(merge, dsec):
    """The share of lines whose store to them, dirty, joins their dirty part, ``dsec`` sectors
    stored since the line's last store: ``merge`` (2 x m: log2(sectors + 4), share) interpolated
    linearly in log2(sectors + 4), held flat beyond its ends."""
    m = merge.shape[1]
    x = np.log2(dsec + 4.0)
    if x <= merge[0, 0]:
        return merge[1, 0]
    for i in range(1, m):
        if x <= merge[0, i]:
            x0 = merge[0, i - 1]
            return merge[1, i - 1] + (merge[1, i] - merge[1, i - 1]) * (x - x0) / (merge[0, i] - x0)
    return merge[1, m - 1]


@njit(cache=True, inline="always")
def _unit(line, gen):
    """A number in [0, 1) hashed from a line and the generation of the way holding it (one draw
    a residency; splitmix64's finaliser): the merge's draw, reproducible and apart from the
    replacement's random stream."""
    z = np.uint64(line) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(gen) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return float(z >> np.uint64(11)) / 9007199254740992.0


@njit(cache=True, inline="always")
def _dirtied(tags, dirty, st, fifo, orph, meta, merge, k, before, mask, ctr):
    """Line in way k gains the dirty sectors ``mask`` (``before``: its dirty sectors until now).
    A line that becomes dirty is queued for write-back.  On a line already dirty, new sectors
    join its dirty part (which then takes ``_SCOST`` more of the limit), or (lines stored in
    parts: where the line's draw, one per residency, is not below the share ``merge`` gives for
    the bytes stored since the line's last store) start a part of their own and the older
    sectors are orphaned: queued to be written back at the next passing of the limit."""
    new = mask & ~before
    if new:
        if before == 0:  # becomes dirty: one more dirty line, queued for write-back
            st[_NDIRTY] += _SLOT
            _push(dirty, st, fifo, meta, _FHEAD, _FTAIL, k, 255)
        elif merge.shape[1] and _unit(tags[k], meta[_M_GEN, k]) >= _merge_share(merge, st[_WCLOCK] - meta[_M_LAST, k]):
            old = before & ~mask
            if old:
                _push(dirty, st, orph, meta, _OHEAD, _OTAIL, k, old)
            st[_NDIRTY] -= meta[_M_JOIN, k] * st[_SCOST]
            meta[_M_JOIN, k] = 0
        elif meta[_M_JOIN, k] == 0:
            st[_NDIRTY] += st[_SCOST]
            meta[_M_JOIN, k] = 1
        meta[_M_LAST, k] = st[_WCLOCK]
    dirty[k] = before | mask
    st[_WCLOCK] += _popcount(mask)


@njit(cache=True, inline="always")
def _access(tags, stamp, valid, dirty, st, fifo, orph, meta, merge, set_index, ways, line, mask, op, ctr):
    base = set_index * ways
    victim = base
    oldest = stamp[base]
    clock = st[_CLOCK]
    for k in range(base, base + ways):
        if tags[k] == line:
            if op == _RED:  # the old values first: the sectors not valid are fetched
                miss = mask & ~valid[k]
                if miss:
                    fetch = _granules(miss, st[_GRAN]) & ~valid[k]
                    ctr[_MISS_RD] += _popcount(fetch)
                    valid[k] |= fetch
            if op != _LOAD:
                ctr[_REQ_WR] += _popcount(mask)
                _dirtied(tags, dirty, st, fifo, orph, meta, merge, k, dirty[k], mask, ctr)
                valid[k] |= mask
                if st[_NDIRTY] > st[_DLIMIT]:
                    _clean(dirty, st, fifo, orph, meta, ctr)
            else:
                ctr[_REQ_RD] += _popcount(mask)
                miss = mask & ~valid[k]
                if miss:
                    fetch = _granules(miss, st[_GRAN]) & ~valid[k]
                    ctr[_MISS_RD] += _popcount(fetch)
                    valid[k] |= fetch
            stamp[k] = 1 if st[_POLICY] == 0 else clock  # NRU: the line is re-referenced
            return
        if stamp[k] < oldest:  # least recently used; an empty way (stamp -1) first
            oldest = stamp[k]
            victim = k
    pool = st[_POLICY]
    if pool != 1 and oldest >= 0:  # a full set (a set with an empty way fills it first)
        x = st[_RNG]  # xorshift64, from a fixed seed
        x ^= (x << 13) & 0x7FFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0x7FFFFFFFFFFFFFFF
        x &= 0x7FFFFFFFFFFFFFFF
        st[_RNG] = x
        x >>= 11
        if pool == 0 and (x >> 20) % 1_000_000 < st[_RSHARE]:  # NRU's share of plain random choices
            victim = base + x % ways
        elif pool == 0:  # NRU: a random way among those not re-referenced since they came in
            n0 = 0
            for k in range(base, base + ways):
                if stamp[k] == 0:
                    n0 += 1
            if n0 == 0:  # all re-referenced: forget it
                for k in range(base, base + ways):
                    stamp[k] = 0
                n0 = ways
            want = x % n0
            for k in range(base, base + ways):
                if stamp[k] == 0:
                    if want == 0:
                        victim = k
                        break
                    want -= 1
        elif pool >= ways:
            victim = base + x % ways
        else:  # one of the ``pool`` least recently used ways
            want = x % pool
            for k in range(base, base + ways):
                rank = 0
                for m in range(base, base + ways):
                    if stamp[m] < stamp[k]:
                        rank += 1
                if rank == want:
                    victim = k
                    break
    if tags[victim] >= 0 and dirty[victim]:
        ctr[_EVICT_WR] += _popcount(dirty[victim])
        _undirty(st, meta, victim)
    meta[_M_GEN, victim] += 1  # its queue entries die with it
    tags[victim] = line
    stamp[victim] = 0 if pool == 0 else clock
    dirty[victim] = 0
    if op != _LOAD:
        valid[victim] = mask
        if op == _RED:  # the line comes in with the reduced sectors' granules, then they are dirtied
            fetch = _granules(mask, st[_GRAN])
            valid[victim] = fetch
            ctr[_MISS_RD] += _popcount(fetch)
        ctr[_REQ_WR] += _popcount(mask)
        _dirtied(tags, dirty, st, fifo, orph, meta, merge, victim, 0, mask, ctr)
        if st[_NDIRTY] > st[_DLIMIT]:
            _clean(dirty, st, fifo, orph, meta, ctr)
    else:
        fetch = _granules(mask, st[_GRAN])
        valid[victim] = fetch
        ctr[_REQ_RD] += _popcount(mask)
        ctr[_MISS_RD] += _popcount(fetch)


@njit(cache=True, inline="always")
def _sampled(set_index, sample):
    """Whether set ``set_index`` is simulated under set sampling: a multiplicative hash of the
    index, so that the sample does not alias with the power-of-two strides of tensor rows."""
    h = (np.uint64(set_index) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return h % np.uint64(sample) == 0


@njit(cache=True)
def _sampled_sets(nsets, sample):
    """(gap, count): gap[s] = sets from s to the next sampled set, cyclically (0 if s is one)."""
    gap = np.zeros(nsets, dtype=np.int64)
    count = 0
    last = -1
    for k in range(2 * nsets - 1, -1, -1):  # twice round, so the gaps wrap
        s = k % nsets
        if sample == 1 or _sampled(s, sample):
            last = k
            if k < nsets:
                count += 1
        gap[s] = last - k if last >= 0 else 0
    return gap, count


@njit(cache=True)
def _range(tags, stamp, valid, dirty, st, fifo, orph, meta, merge, nsets, ways, lshift, sshift, a, n, op, ctr, gap):
    """Bytes [a, a + n) through the cache, line by line with their sector masks; only the lines
    of the sampled sets (``gap[set]``: how many sets on the next sampled one is, 0 for a sampled
    set; see :func:`_sampled`).  Set = line address mod sets, kept incrementally."""
    first = a >> lshift
    last = (a + n - 1) >> lshift
    si = first % nsets
    line = first
    while line <= last:
        g = gap[si]
        if g:  # jump to the next sampled set
            line += g
            si += g
            if si >= nsets:
                si -= nsets
            continue
        lo = max(a, line << lshift) - (line << lshift)
        hi = min(a + n, (line + 1) << lshift) - (line << lshift)
        s0 = lo >> sshift
        s1 = (hi - 1) >> sshift
        mask = ((1 << (s1 + 1)) - 1) ^ ((1 << s0) - 1)
        _access(tags, stamp, valid, dirty, st, fifo, orph, meta, merge, si, ways, line, mask, op, ctr)
        st[_CLOCK] += 1
        line += 1
        si += 1
        if si == nsets:
            si = 0


@njit(cache=True)
def _run(tags, stamp, valid, dirty, st, fifo, orph, meta, merge, nsets, ways, lshift, sshift,
         addr, nrows, stride, nbytes, op, tile_ptr, step_ptr, slot_blk, slot_step, next_blk, final, ctr, gap):
    """Advance the resident blocks round-robin, one step each per round, refilling free slots
    from blocks next_blk.. of this chunk.  Returns (next_blk, done): done is False when a slot
    wants a block beyond the chunk (and the chunk is not the last)."""
    nb = step_ptr.size - 1
    nslots = slot_blk.size
    while True:
        active = False
        for s in range(nslots):
            b = slot_blk[s]
            if b < 0:
                if next_blk < nb:
                    b = next_blk
                    next_blk += 1
                    slot_blk[s] = b
                    slot_step[s] = 0
                    if step_ptr[b] == step_ptr[b + 1]:  # a block with no access
                        slot_blk[s] = -1
                        continue
                elif not final:
                    return next_blk, False
                else:
                    continue
            active = True
            step = step_ptr[b] + slot_step[s]
            for t in range(tile_ptr[step], tile_ptr[step + 1]):
                a = addr[t]
                for r in range(nrows[t]):
                    _range(tags, stamp, valid, dirty, st, fifo, orph, meta, merge, nsets, ways, lshift, sshift,
                           a + r * stride[t], nbytes[t], op[t], ctr, gap)
            slot_step[s] += 1
            if step + 1 == step_ptr[b + 1]:
                slot_blk[s] = -1
        if not active:
            return next_blk, True


@njit(cache=True)
def _trace(tags, stamp, valid, dirty, st, fifo, orph, meta, merge, nsets, ways, lshift, sshift, addr, nbytes, op,
           ctr, gap):
    for i in range(addr.size):
        _range(tags, stamp, valid, dirty, st, fifo, orph, meta, merge, nsets, ways, lshift, sshift, addr[i],
               nbytes[i], op[i], ctr, gap)


@njit(cache=True)
def _dirty_sectors(tags, dirty):
    n = 0
    for k in range(tags.size):
        if tags[k] >= 0:
            n += _popcount(dirty[k])
    return n


class L2:
    """A write-back, set-associative cache of ``capacity`` bytes (see the module docstring).

    ``policy``: "lru", "random" (a full set gives up a pseudo-random way, from a fixed seed:
    the counts are reproducible) or "nru" (see the module docstring), of whose victims a share
    ``random_share`` is drawn among all the ways instead.  ``dirty_limit``: the most bytes of
    dirty lines held (dirty_limit / line_bytes lines, however few of their sectors are dirty); a
    write that goes beyond it writes the oldest dirty lines back (they stay, clean); None: no
    limit (dirty lines reach DRAM only when evicted).  ``split_merge``: ((bytes stored since,
    share), ...), bytes ascending: a store of new sectors to a line already dirty joins its dirty
    part if the line's draw (one per residency, in [0, 1)) is below the share for the bytes
    stored (by anyone) since the line's last store; otherwise the line's older dirty sectors are
    orphaned, written back (and kept) the next time the limit is passed, before the oldest lines.
    Empty (the default): every store joins.  ``split_cost``: what a line whose dirty part joined
    more than one store takes of the limit beyond one line (0: nothing).  ``fetch_bytes``: what a read
    miss fetches from DRAM, the missing sectors of each aligned ``fetch_bytes`` granule it
    touches."""

    def __init__(self, capacity: int, line_bytes: int = 128, sector_bytes: int = 32, ways: int = 16,
                 sample: int = 1, *, policy: str = "lru", dirty_limit: int | None = None,
                 fetch_bytes: int | None = None, random_share: float = 0.0, split_merge=(), split_cost: float = 0.0):
        for name, v in (("line_bytes", line_bytes), ("sector_bytes", sector_bytes)):
            if v <= 0 or v & (v - 1):
                raise ValueError(f"{name}={v}: must be a power of two")
        if line_bytes % sector_bytes or line_bytes // sector_bytes > 8:
            raise ValueError(f"line_bytes={line_bytes}: must be 1 to 8 sectors of {sector_bytes} bytes")
        self.nsets = capacity // (line_bytes * ways)
        if self.nsets < 1:
            raise ValueError(f"capacity={capacity}: smaller than one set of {ways} lines of {line_bytes} bytes")
        if isinstance(sample, bool) or not isinstance(sample, (int, np.integer)) or sample < 1:
            raise ValueError(f"sample={sample!r}: must be a positive integer")
        if policy not in ("lru", "random", "nru") and not (isinstance(policy, int) and 1 <= policy <= ways):
            raise ValueError(f"policy={policy!r}: must be 'lru', 'random', 'nru' or a victim pool of 1 to {ways=}")
        fetch_bytes = sector_bytes if fetch_bytes is None else fetch_bytes
        if fetch_bytes < sector_bytes or fetch_bytes > line_bytes or fetch_bytes & (fetch_bytes - 1):
            raise ValueError(f"fetch_bytes={fetch_bytes}: must be a power of two from the sector "
                             f"({sector_bytes}) to the line ({line_bytes})")
        if isinstance(random_share, bool) or not 0 <= random_share <= 1:
            raise ValueError(f"random_share={random_share!r}: must be a fraction in [0, 1]")
        split_cost = split_cost_value(split_cost, "split_cost")
        if dirty_limit is not None and (isinstance(dirty_limit, bool) or dirty_limit < 0):
            raise ValueError(f"dirty_limit={dirty_limit!r}: must be None or a number of bytes >= 0")
        merge = split_merge_array(split_merge, sector_bytes)
        self.split_merge = tuple(tuple(x) for x in split_merge)
        self.ways, self.line_bytes, self.sector_bytes, self.sample = ways, line_bytes, sector_bytes, int(sample)
        self.policy, self.dirty_limit, self.fetch_bytes = policy, dirty_limit, fetch_bytes
        self.random_share = float(random_share)
        self.split_cost = split_cost
        self.gap, sampled = _sampled_sets(self.nsets, self.sample)
        if sampled == 0:
            raise ValueError(f"sample={sample}: no set of the {self.nsets} is sampled; sample fewer")
        #: counts of the sampled sets x scale = the estimate for the whole cache
        self.scale = self.nsets / sampled
        # the store clock counts the sectors of the sampled sets: the table's distances scaled to
        # it, kept as log2(sectors + 4), where the share is interpolated
        self.merge = merge.copy()
        self.merge[0] = np.log2(merge[0] / self.scale + 4.0)
        self.lshift, self.sshift = line_bytes.bit_length() - 1, sector_bytes.bit_length() - 1
        self.reset()

    @classmethod
    def for_gpu(cls, gpu: Hardware | str, sample: int = 1) -> L2:
        """The cache of a GPU preset (its effective capacity, line, sector, ways, replacement,
        dirty limit and fetch granule), as :func:`dram_traffic` replays launches through it."""
        g = get_gpu(gpu) if isinstance(gpu, str) else gpu
        return cls(g.l2_effective_bytes, g.l2_line_bytes, g.l2_sector_bytes, g.l2_ways, sample,
                   policy=g.l2_replacement, dirty_limit=g.l2_dirty_bytes, fetch_bytes=g.l2_fetch_bytes,
                   random_share=g.l2_random_share, split_merge=g.l2_split_merge, split_cost=g.l2_split_cost)

    @property
    def capacity(self) -> int:
        return self.nsets * self.ways * self.line_bytes

    def reset(self) -> None:
        n = self.nsets * self.ways
        self.tags = np.full(n, -1, dtype=np.int64)
        self.stamp = np.full(n, -1, dtype=np.int64)
        self.valid = np.zeros(n, dtype=np.uint8)
        self.dirty = np.zeros(n, dtype=np.uint8)
        self.st = np.zeros(13, dtype=np.int64)
        self.st[_RNG] = 0x2545F4914F6CDD1D
        # the dirty limit in lines of the simulated sets (set sampling: a share of it): the L2
        # counts dirty lines, whatever share of their sectors is dirty (l2_dirty_probe's half and
        # quarter lines: the same number of lines held, a half and a quarter of the bytes)
        lim = self.dirty_limit if self.dirty_limit is not None else self.capacity * 2
        self.st[_DLIMIT] = int(round(lim / self.line_bytes / self.scale)) * _SLOT
        self.st[_SCOST] = round(self.split_cost * _SLOT)
        # the write-back queues: twice the most live entries (a dirty line has one in fifo; an
        # orphaned part holds dirty sectors of its own, at most line / sector - 1 of a line)
        spl = self.line_bytes // self.sector_bytes
        self.fifo = np.zeros((3, 2 * n + 64), dtype=np.int64)
        self.orph = np.zeros((3, 2 * (spl - 1) * n + 64), dtype=np.int64)
        self.meta = np.zeros((3, n), dtype=np.int64)
        self.st[_POLICY] = {"lru": 1, "random": self.ways, "nru": 0}.get(self.policy, self.policy)
        self.st[_GRAN] = self.fetch_bytes // self.sector_bytes
        self.st[_RSHARE] = round(self.random_share * 1_000_000)

    def _state(self) -> tuple:
        """The arrays and sizes the numba functions take, in their order."""
        return (self.tags, self.stamp, self.valid, self.dirty, self.st, self.fifo, self.orph, self.meta, self.merge,
                self.nsets, self.ways, self.lshift, self.sshift)

    def dirty_bytes(self) -> int:
        """Dirty bytes held (with set sampling, scaled to the whole cache)."""
        return round(int(_dirty_sectors(self.tags, self.dirty)) * self.scale) * self.sector_bytes

    def access(self, addr: int, nbytes: int, write: bool, ctr: np.ndarray | None = None, *,
               reduction: bool = False) -> np.ndarray:
        """One byte range through the cache (for tests and small experiments); returns the
        counters [read sectors, written sectors, read misses, dirty sectors evicted].
        ``reduction``: a reduction (``write`` must be True), counted as written sectors whose
        missing granules are fetched first (see the module docstring)."""
        ctr = np.zeros(4, dtype=np.int64) if ctr is None else ctr
        if not isinstance(ctr, np.ndarray) or ctr.dtype != np.int64 or ctr.shape != (4,):
            raise ValueError(f"ctr: must be an int64 array of 4 counters, got {getattr(ctr, 'shape', ctr)!r}")
        op = int(_ops(1, write, reduction)[0])
        _range(*self._state(), int(addr), int(nbytes), op, ctr, self.gap)
        return ctr

    def replay(self, addr, nbytes, write=False, *, reduction=False) -> np.ndarray:
        """A trace through the cache, in order: byte ranges [addr[i], addr[i] + nbytes[i]) (arrays
        of one length, or a scalar ``nbytes``), ``write`` and ``reduction`` per range or for all;
        returns the counters of :meth:`access` (not scaled by set sampling)."""
        a = np.ascontiguousarray(addr, dtype=np.int64).reshape(-1)
        try:
            n = np.ascontiguousarray(np.broadcast_to(np.asarray(nbytes, dtype=np.int64), a.shape))
            op = _ops(a.size, write, reduction)
        except ValueError as e:
            if "reduction" in str(e):
                raise
            raise ValueError(f"nbytes, write, reduction: each a scalar or one per address ({a.size}): {e}") from None
        if a.size and (a.min() < 0 or n.min() < 1):
            raise ValueError("addr, nbytes: addresses must be >= 0 and ranges at least one byte")
        ctr = np.zeros(4, dtype=np.int64)
        _trace(*self._state(), a, n, op, ctr, self.gap)
        return ctr


def _ops(n: int, write, reduction) -> np.ndarray:
    w = np.broadcast_to(np.asarray(write, dtype=bool), (n,))
    r = np.broadcast_to(np.asarray(reduction, dtype=bool), (n,))
    if np.any(r & ~w):
        raise ValueError("reduction=True: a reduction writes; pass write=True")
    return np.where(r, _RED, np.where(w, _STORE, _LOAD)).astype(np.int64)


def split_merge_array(split_merge, sector_bytes: int = 32) -> np.ndarray:
    """``split_merge`` ((bytes, share), ...) as the cache's 2 x m float64 table (sectors, share),
    checked as the presets check theirs (ValueError naming the field)."""
    pts = split_merge_points(split_merge, "split_merge")
    return np.array([[b / sector_bytes for b, _ in pts], [p for _, p in pts]], dtype=np.float64).reshape(2, -1)


def _tile_arrays(tiles, tensors, bases):
    """Byte addresses of tiles: (start, rows, row stride, bytes per row, op: load, store or
    reduction); a tile of whole rows becomes one range."""
    lay = [tensors[n] for n in tiles.names]
    tab = np.array([[t.row_bytes, t.elem_bytes, t.cols, t.slice_bytes, bases[t.name]] for t in lay],
                   dtype=np.int64).reshape(-1, 5)
    stride, eb, cols, sb, base = (tab[:, k][tiles.tensor] for k in range(5))
    addr = base + tiles.slice * sb + tiles.row0 * stride + tiles.col0 * eb
    nbytes = tiles.ncols * eb
    nrows = tiles.nrows.astype(np.int64)
    whole = tiles.ncols == cols
    nbytes = np.where(whole, nbytes * nrows, nbytes)
    nrows = np.where(whole, np.minimum(nrows, 1), nrows)
    op = np.where(tiles.reduction, _RED, np.where(tiles.write, _STORE, _LOAD)).astype(np.int64)
    return addr, nrows, stride, nbytes, op


def _simulate_launch(cache: L2, launch, tensors, bases, gpu: Hardware, chunk_blocks: int | None) -> np.ndarray:
    spec = launch.blocks
    nblk = spec.num_blocks
    slots = gpu.num_sms * spec.blocks_per_sm(gpu)
    chunk = chunk_blocks or max(2 * slots, 256)
    slot_blk = np.full(slots, -1, dtype=np.int64)  # absolute block index
    slot_step = np.zeros(slots, dtype=np.int64)
    ctr = np.zeros(4, dtype=np.int64)
    lo, next_abs = 0, 0
    while True:
        active = slot_blk[slot_blk >= 0]
        lo = int(active.min()) if active.size else next_abs
        hi = min(nblk, max(lo + chunk, next_abs + slots))
        tiles = spec.tiles(lo, hi)
        addr, nrows, stride, nbytes, op = _tile_arrays(tiles, tensors, bases)
        rel = np.where(slot_blk >= 0, slot_blk - lo, -1)
        nxt, done = _run(*cache._state(), addr, nrows, stride, nbytes, op, tiles.tile_ptr,
                         tiles.step_ptr, rel, slot_step, next_abs - lo, hi == nblk, ctr, cache.gap)
        slot_blk = np.where(rel >= 0, rel + lo, -1)
        next_abs = int(nxt) + lo
        if done:
            return np.round(ctr * cache.scale).astype(np.int64)


def dram_traffic(schedule: Schedule, gpu: Hardware | str, *, cold_launches: bool = False, sample: int = 1,
                 chunk_blocks: int | None = None, start_dirty: int = 0) -> DRAMTraffic:
    """DRAM read and write bytes of every launch of ``schedule`` on ``gpu`` (a preset or its
    name), the L2 starting empty (see the module docstring for the model and ``cold_launches``).

    ``sample`` > 1: set sampling.  About one set in ``sample`` is simulated (those whose index
    hashes to 0 mod ``sample``), and every count is scaled by (sets / sets simulated).  Exact
    counts need ``sample=1``; benchmarks/bench_l2.py measures the error of sampling.

    ``start_dirty``: bytes of other data the L2 holds dirty whenever it starts empty (each launch
    with ``cold_launches``), stored at addresses past every tensor before the launch and not
    counted as its traffic (but among its ``dirty_end_bytes`` while they stay); the oldest
    dirty lines, so the first written back.  What Nsight
    Compute leaves dirty when it measures more metrics than the calibration did (analysis.calibrate
    .replay_dirty_bytes: 2.06 MiB on the H200 for the fast set's 10 metrics, where a launch that
    only reads 64 MiB writes 2.3 MiB)."""
    if isinstance(gpu, str):
        gpu = get_gpu(gpu)
    if not isinstance(gpu, Hardware):
        raise ValueError(f"gpu={gpu!r}: must be a Hardware preset or a preset name")
    if isinstance(start_dirty, bool) or not isinstance(start_dirty, (int, np.integer)) or start_dirty < 0:
        raise ValueError(f"start_dirty={start_dirty!r}: must be a number of bytes >= 0")
    missing = [ln.name for ln in schedule.launches if ln.blocks is None]
    if missing:
        raise ValueError(f"schedule.launches={missing}: no thread-block model (Launch.blocks) for the L2 model; "
                         "it exists for standard, flash1, flash2, decode, fast, torch_flash, torch_memeff and "
                         "torch_naive")
    cache = L2.for_gpu(gpu, sample)
    bases = _tensor_bases(schedule.tensors)
    sec = gpu.l2_sector_bytes
    # the other data's lines: past the last tensor, 1 MiB aligned
    other = -(-max((bases[n] + t.slices * t.slice_bytes for n, t in schedule.tensors.items()), default=0)
              // (1 << 20)) * (1 << 20)

    def start():
        if start_dirty:
            cache.access(other, int(start_dirty) // cache.sector_bytes * cache.sector_bytes, True)

    start()
    out = []
    names: set[str] = set()
    for i, launch in enumerate(schedule.launches):
        if cold_launches and i:
            cache.reset()
            start()
        ctr = _simulate_launch(cache, launch, schedule.tensors, bases, gpu, chunk_blocks)
        name, k = launch.name, 2
        while name in names:
            name, k = f"{launch.name}#{k}", k + 1
        names.add(name)
        spec = launch.blocks
        out.append(LaunchDRAM(name, spec.grid, spec.threads, spec.blocks_per_sm(gpu), int(ctr[_MISS_RD]) * sec,
                              int(ctr[_EVICT_WR]) * sec, cache.dirty_bytes(), int(ctr[_REQ_RD]) * sec,
                              int(ctr[_REQ_WR]) * sec))
    return DRAMTraffic(gpu.name, cold_launches, cache.capacity, out)


def simulate_dram(workload, algo: str, pass_: str = "fwd", gpu: Hardware | str = "h100", tiling=None,
                  sram_elems: int | None = None, *, cold_launches: bool = False, sample: int = 1,
                  **options) -> DRAMTraffic:
    """Build ``algo``'s schedule for ``workload`` (as :func:`flashsim.simulate` does) and run it
    through ``gpu``'s L2: the DRAM-level counterpart of the walker's LSU-level count."""
    from .api import build_schedule

    sched = build_schedule(workload, algo, pass_, tiling, sram_elems, **options)
    return dram_traffic(sched, gpu, cold_launches=cold_launches, sample=sample)


def format_dram(d: DRAMTraffic) -> str:
    """Plain-text table of a DRAM-level result, launch by launch, with the totals."""
    mode = "each launch from a cold L2 (as ncu measures)" if d.cold_launches else "L2 carried between launches"
    lines = [f"DRAM level on {d.gpu}: L2 model of {d.l2_effective_bytes / 2**20:.1f} MiB effective, {mode}",
             f"{'launch':<28} {'grid':>16} {'blocks/SM':>9} {'L2 read MB':>11} {'L2 write MB':>11} "
             f"{'DRAM read MB':>12} {'DRAM write MB':>13} {'dirty at end MB':>15}"]
    for x in d.launches:
        grid = "(" + ", ".join(map(str, x.grid)) + ")"
        lines.append(f"{x.name:<28} {grid:>16} {x.blocks_per_sm:>9} {x.requested_read_bytes / 1e6:>11.2f} "
                     f"{x.requested_write_bytes / 1e6:>11.2f} {x.read_bytes / 1e6:>12.2f} {x.write_bytes / 1e6:>13.2f} "
                     f"{x.dirty_end_bytes / 1e6:>15.2f}")
    lines.append(f"total: DRAM read {d.read_bytes / 1e6:.2f} MB, write {d.write_bytes / 1e6:.2f} MB (of which "
                 f"{d.final_flush_bytes / 1e6:.2f} MB dirty lines written back after the launches)")
    return "\n".join(lines)


__all__ = ["L2", "split_merge_array", "LaunchDRAM", "DRAMTraffic", "dram_traffic", "simulate_dram", "format_dram"]
